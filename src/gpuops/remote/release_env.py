"""Build (or find) the environment of an SGLang release beside the running one (stdlib, 3.8+).

Runs on the host before the switch, as its preflight: nothing here stops, changes or reads into
the environment the server runs from. The new environment is ``<envs_dir>/<name>``, where the
name holds the release and a digest of everything it is installed from, so a finished one is
reused as it is and two different installs never share a directory. It counts as finished only
once ``.gpuops-env.json`` is written, last; a directory without it (a build that was killed) is
removed and built again. A failed build removes what it made and nothing else.

Steps, each refusing with one line: free disk space under ``envs_dir``; ``uv venv`` + ``uv pip
install`` when ``uv`` is on PATH, else ``python -m venv`` + ``pip install`` (a python without ensurepip,
as Debian's without python3-venv: ``venv --without-pip`` and the wheelhouse's pip wheel), from the host's index,
the operator's ``index_url``, or a wheelhouse copied here (``--no-index --find-links``); every pin
the release names installed at exactly its version; torch's CUDA no newer than the driver's
(``nvidia-smi``'s "CUDA Version").

Payload: ``envs_dir``, ``name``, ``base_python``, ``requirements``, ``expect`` ({dist: version}),
``index_url``, ``wheelhouse`` (a host path), ``min_free_bytes``, ``keep_envs`` and ``state_dir`` (after a
build, finished environments beyond the ``keep_envs`` newest are removed unless the launch files or
a kept run's backups name them: the server's, and every rollback's, stay); ``find_only`` (``--check``): only
whether a finished environment is there (and checked), nothing built. Prints one JSON object.
"""

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time

MARKER = ".gpuops-env.json"
_NAME = re.compile(r"^sglang-[0-9A-Za-z.+]+-[0-9a-f]{12}$")
_INSTALL_TIMEOUT_S = 3600

# Run by the new environment's python (or a new image's: apply/release_image.py): what it holds, and torch's CUDA build read from
# torch/version.py without importing torch (a torch that needs a newer driver must still be read).
PROBE = r"""
import json, re, sys
from importlib import metadata
from importlib.util import find_spec
names = json.loads(sys.argv[1])
out = {"versions": {}, "torch_cuda": None, "prefix": sys.prefix}
for name in names:
    try:
        out["versions"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out["versions"][name] = None
spec = find_spec("torch") if out["versions"].get("torch") else None
for folder in (spec.submodule_search_locations or []) if spec else []:
    try:
        text = open(folder + "/version.py").read()
    except OSError:
        continue
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    out["torch_cuda"] = found.group(1) if found else None
print(json.dumps(out))
"""


class ReleaseEnvRefused(Exception):
    def __init__(self, stage, message, log_tail=""):
        Exception.__init__(self, message)
        self.stage, self.message, self.log_tail = stage, message, log_tail


def _free_bytes(path):
    probe = path
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe) or "/"
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize


def _env_of_new_tree(extra=None):
    """The environment the new tree is built and checked in: without PYTHONPATH, which would put
    another release's packages before the new environment's own (pip would even count them as
    installed), as the launch does (the role sets PYTHONPATH empty)."""
    env = dict(extra if extra is not None else os.environ)
    env.pop("PYTHONPATH", None)
    return env


def _run(command, stage, timeout=_INSTALL_TIMEOUT_S, env=None):
    env = _env_of_new_tree(env)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseEnvRefused(stage, "%s failed: %s" % (command[0], exc))
    text = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        raise ReleaseEnvRefused(stage, "%s exited %d: %s" % (" ".join(command[:4]), done.returncode, _reason(lines)),
                      "\n".join(lines[-15:]))
    return text


_REASON_CHARS = 600  # one line of a refusal: a resolver's whole story belongs in the log tail


def _reason(lines):
    """Why an install failed, in one line: pip's last ``ERROR:`` line; else uv's last ``error:``
    line with the cause lines after it (uv puts the why there: "Because torch was not found in
    the provided package locations ..."); else the last line."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].lstrip().startswith("ERROR"):
            return lines[index].strip()[:_REASON_CHARS]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].lstrip().startswith("error:"):
            said = " ".join(ln.strip() for ln in lines[index:])
            return said[:_REASON_CHARS]
    return lines[-1].strip()[:_REASON_CHARS] if lines else ""


def _source_flags(payload):
    if payload.get("wheelhouse"):
        return ["--no-index", "--find-links", payload["wheelhouse"]]
    if payload.get("index_url"):
        return ["--index-url", payload["index_url"]]
    return []


def _build(env, payload):
    base = payload.get("base_python") or "python3"
    uv = shutil.which("uv")
    python = os.path.join(env, "bin", "python")
    requirements = list(payload["requirements"])
    # A wheelhouse is the whole source: the host's pip / uv configuration (its indexes, find-links,
    # constraints) is not read, so what installs is what the operator copied, or the run refuses.
    closed = bool(payload.get("wheelhouse"))
    pip_env = dict(os.environ, PIP_CONFIG_FILE=os.devnull) if closed else None
    if closed:
        for name in [k for k in pip_env if k.startswith(("PIP_", "UV_")) and k != "PIP_CONFIG_FILE"]:
            del pip_env[name]
    if uv:
        # From a wheelhouse uv reads no configuration, keeps no cache and fetches no Python: a build
        # leaves nothing in the host's home (a refused one would have left ~/.cache/uv), and the
        # wheels are local anyway.
        own = ["--no-config", "--no-cache", "--no-python-downloads"] if closed else []
        _run([uv, "venv", "--quiet"] + own + ["--python", base, env], "venv", env=pip_env)
        _run([uv, "pip", "install", "--quiet"] + own + ["--python", python]
             + _source_flags(payload) + requirements, "install", env=pip_env)
        return "uv"
    pip = [python, "-m", "pip"]
    try:
        _run([base, "-m", "venv", env], "venv", timeout=600)
    except ReleaseEnvRefused as exc:
        # Debian's python3 without python3-venv has no ensurepip: with a pip wheel in the wheelhouse,
        # the environment is made without pip and that wheel runs the install (pip runs from its
        # own wheel), so a host without internet needs no package of its own for it.
        wheel = _pip_wheel(payload.get("wheelhouse"))
        if wheel is None or "ensurepip" not in exc.message + exc.log_tail:
            raise
        shutil.rmtree(env, ignore_errors=True)
        _run([base, "-m", "venv", "--without-pip", env], "venv", timeout=600)
        pip = [python, os.path.join(wheel, "pip")]
    _run(pip + ["install", "--disable-pip-version-check", "--no-input", "-q"]
         + _source_flags(payload) + requirements, "install", env=pip_env)
    return "venv + pip" if pip[1] == "-m" else "venv + pip from the wheelhouse"


def _pip_wheel(wheelhouse):
    """A pip wheel of the wheelhouse (a host path; the last by name), or None."""
    if not wheelhouse or not os.path.isdir(wheelhouse):
        return None
    names = sorted(n for n in os.listdir(wheelhouse) if re.match(r"^pip-[0-9][^-]*-py3(\.py\d+)?-none-any\.whl$", n))
    return os.path.join(wheelhouse, names[-1]) if names else None


def _public(version):
    return (version or "").split("+", 1)[0]


def _probe(env, names):
    text = _run([os.path.join(env, "bin", "python"), "-c", PROBE, json.dumps(sorted(names))], "verify", timeout=120)
    return json.loads(text.strip().splitlines()[-1])


def _driver_cuda():
    try:
        done = subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", done.stdout.decode("utf-8", "replace"))
    return found.group(1) if found else None


def _numbers(version):
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _verify(env, payload):
    expect = dict(payload.get("expect") or {})
    found = _probe(env, list(expect))
    wrong = ["%s %s (the release pins %s)" % (name, found["versions"].get(name) or "missing", want)
             for name, want in sorted(expect.items()) if _public(found["versions"].get(name)) != _public(want)]
    if wrong:
        raise ReleaseEnvRefused("verify", "the new environment does not hold the release's pins: " + ", ".join(wrong))
    driver = _driver_cuda()
    torch_cuda = found.get("torch_cuda")
    if torch_cuda and driver and _numbers(torch_cuda) > _numbers(driver):
        raise ReleaseEnvRefused("cuda", "torch %s is built for CUDA %s, but this host's driver runs CUDA %s at most; pin a "
                      "torch build for the driver (sglang_extra_packages / sglang_index_url) or update the driver"
                      % (found["versions"].get("torch"), torch_cuda, driver))
    return found["versions"], torch_cuda, driver


def _finished(env):
    try:
        with open(os.path.join(env, MARKER)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _small_text(path, limit=1 << 20):
    try:
        if os.path.getsize(path) > limit:
            return ""
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _texts_runs_need(state_dir):
    """The launch files now, and every backup a kept run would restore: an environment one of them
    names is needed (by the server, or by a rollback), whatever its age."""
    texts = []
    runs = os.path.join(state_dir, "runs")
    for run in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        try:
            with open(os.path.join(runs, run, "manifest.json")) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue
        for entry in manifest.get("files") or []:
            if isinstance(entry, dict):
                for key in ("backup", "path"):
                    if isinstance(entry.get(key), str):
                        texts.append(_small_text(entry[key]))
    for name in ("desired.json", "sglang-launch.sh"):
        texts.append(_small_text(os.path.join(state_dir, name)))
    return texts


def prune(envs_dir, keep, state_dir, current):
    """Finished environments beyond the ``keep`` newest that nothing needs: removed (marker first,
    so a removal cut short is an unfinished build, never a finished environment with holes)."""
    if keep is None or not state_dir:
        return []
    texts = _texts_runs_need(state_dir)
    candidates = []
    for name in sorted(os.listdir(envs_dir)):
        path = os.path.join(envs_dir, name)
        record = _finished(path) if _NAME.match(name) else None
        if record is None or path == current:
            continue
        if any(path + "/" in text for text in texts):
            continue  # the launch, or a run's backup (its rollback), names it
        candidates.append((str(record.get("created") or ""), path))
    candidates.sort(reverse=True)
    removed = []
    for _, path in candidates[int(keep):]:
        try:
            os.unlink(os.path.join(path, MARKER))
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            pass  # left for the next prune
    return removed


def build(payload):
    out = _build_or_find(payload)
    if out.get("ok") and not payload.get("find_only") and out.get("env_dir"):
        with open(os.path.join(payload["envs_dir"], ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out["pruned"] = prune(payload["envs_dir"], payload.get("keep_envs"), payload.get("state_dir"),
                                  out["env_dir"])
    return out


def _build_or_find(payload):
    envs_dir, name = payload["envs_dir"], payload["name"]
    if not os.path.isabs(envs_dir) or not _NAME.match(name):
        raise ReleaseEnvRefused("input", "bad environment %r under %r" % (name, envs_dir))
    env = os.path.join(envs_dir, name)
    need = int(payload.get("min_free_bytes") or 0)
    free = _free_bytes(envs_dir)
    record = _finished(env)
    if payload.get("find_only"):  # --check: say whether it is there, build nothing
        if record is None:
            return {"ok": True, "found": False, "env_dir": env}
        versions, torch_cuda, driver = _verify(env, payload)
        return {"ok": True, "found": True, "env_dir": env, "python": os.path.join(env, "bin", "python"),
                "reused": True, "installed": versions, "torch_cuda": torch_cuda, "driver_cuda": driver,
                "tool": record.get("tool")}
    if record is None and free < need:
        raise ReleaseEnvRefused("disk", "%s has %.1f GiB free; the new environment needs %.1f GiB (gpuops_release_min_free_gib)"
                      % (envs_dir, free / 2.0 ** 30, need / 2.0 ** 30))
    os.makedirs(envs_dir, mode=0o755, exist_ok=True)
    with open(os.path.join(envs_dir, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build of an environment at a time
        record = _finished(env)
        if record is not None:
            versions, torch_cuda, driver = _verify(env, payload)
            return {"ok": True, "env_dir": env, "python": os.path.join(env, "bin", "python"), "reused": True,
                    "installed": versions, "torch_cuda": torch_cuda, "driver_cuda": driver, "tool": record.get("tool")}
        if os.path.lexists(env):
            shutil.rmtree(env)  # a build that was killed before its marker: ours, never finished
        started = time.time()
        try:
            tool = _build(env, payload)
            versions, torch_cuda, driver = _verify(env, payload)
        except BaseException:
            shutil.rmtree(env, ignore_errors=True)
            raise
        record = {"schema": 1, "version": payload.get("version"), "requirements": payload["requirements"],
                  "installed": versions, "torch_cuda": torch_cuda, "tool": tool,
                  "source": payload.get("source") or "", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = os.path.join(env, MARKER + ".tmp")
        with open(tmp, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, os.path.join(env, MARKER))
    return {"ok": True, "env_dir": env, "python": os.path.join(env, "bin", "python"), "reused": False,
            "installed": versions, "torch_cuda": torch_cuda, "driver_cuda": driver, "tool": tool,
            "seconds": round(time.time() - started, 1)}


def main(raw):
    payload = json.loads(raw.decode("utf-8"))
    try:
        out = build(payload)
    except ReleaseEnvRefused as exc:
        out = {"ok": False, "stage": exc.stage, "error": exc.message, "log_tail": exc.log_tail}
    except OSError as exc:
        out = {"ok": False, "stage": "io", "error": "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(globals().get("GPUOPS_PAYLOAD") or sys.stdin.buffer.read())
