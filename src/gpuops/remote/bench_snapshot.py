"""What the bench client records about the host and the server before it measures: the server's own
reports (``/server_info`` or ``/get_server_info``, ``/model_info`` or ``/get_model_info``, ``/metrics``), its process's command line and tuning
environment, the GPUs, the serving stack's package versions, and which gate patches are in place.

Stdlib only, Python 3.8+.
"""

import json
import os
import socket
import subprocess
import sys

from gpuops.remote.apply_journal import read_journal, runs_by_id
from gpuops.remote.bench_http import ServerError
from gpuops.remote.digest import sha256_file
from gpuops.remote.scan_read import NotRead, read_regular
from gpuops.remote.sglang_argv import is_server_argv
from gpuops.remote.sglang_server import ServerClient, find_server_pid, process_cmdline
from gpuops.remote.host_protocol import FINISHED, ROLLED_BACK


ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_", "FLASHINFER_", "SGL_")
CONFIG_LIMIT = 4 * 1024 * 1024  # a model's config.json is a few KB; a larger file is not read
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")  # facts/served_model.py's


def server_pid(url, pid_file=None):
    """The server's pid: from gpuops' pid file while that process is a server (a stale file's pid
    may be anyone's now, and its environment is read), else the process serving the URL's port."""
    pid = read_pid(pid_file) if pid_file else None
    if pid is not None and is_server_argv(process_cmdline(pid) or []):
        return pid
    return find_server_pid(url)


def server_snapshot(url, pid=None, python=None, env=None):
    """What the server says about itself (through the one server client, asked the way its release
    answers: which route answered is kept under ``routes``), its process, whether it exposes
    ``/metrics`` (then ``metrics``: the summarised page before the run) and its model's vocabulary
    (``vocab``: what synthetic prompts are drawn from). ``env``: what the server's python runs in."""
    info = {"url": url}
    client = server_client(url, pid, python, env)
    try:
        info["server_info"] = client.server_info()
    except ServerError as exc:
        info["server_info_error"] = str(exc)
    try:
        info["model_info"] = client.model_info()
    except ServerError as exc:
        info["model_info_error"] = str(exc)
    try:
        metrics = client.metrics()
    except ServerError as exc:
        metrics, info["metrics_error"] = None, str(exc)
    info["metrics_exposed"] = metrics is not None
    if metrics is not None:
        info["metrics"] = metrics
    info["routes"] = dict(client.answered)
    info["release_routes_known"] = client.routes is not None
    info["vocab"] = served_vocab(info, pid)
    if pid is not None:
        info["pid"] = pid
        info["process_env"] = client.hide(process_env(pid))
        info["process_cmdline"] = client.hide(process_cmdline(pid))
    return info


_CLIENTS = {}  # type: dict[str, ServerClient]


def server_client(url, pid=None, python=None, env=None):
    """The one ``ServerClient`` of this run for ``url`` (its key from the server's command line):
    the suites' requests and the after-run questions reuse it."""
    if url not in _CLIENTS:
        _CLIENTS[url] = ServerClient.for_process(url, pid if pid is not None else find_server_pid(url), python,
                                                 env=env)
    return _CLIENTS[url]


def model_path(snapshot):
    """The model path the server reports: ``/model_info``'s, else ``/server_info``'s (flat in
    0.5.x, under ``server_args`` in older releases)."""
    info = snapshot.get("server_info") or {}
    args = info.get("server_args") if isinstance(info.get("server_args"), dict) else info
    path = (snapshot.get("model_info") or {}).get("model_path") or args.get("model_path")
    return path if isinstance(path, str) and path and "\0" not in path else None


def _other_root(pid):
    """Whether process ``pid`` sees another filesystem root than this one (a container)."""
    try:
        theirs, ours = os.stat("/proc/%d/root/" % pid), os.stat("/")
    except OSError:
        return False  # not ours to look at: taken to share this root
    return (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino)


def served_vocab(snapshot, pid=None):
    """The served model's vocabulary size (its embedding's rows) from ``config.json`` at the model
    path the server reports: ``{"vocab_size": n, "source": path}``, or ``{"vocab_size": None,
    "reason": why}`` (a hub id, a path not readable here, no such key). The file is the host's, so
    read bounded and checked; where a multimodal config names several sizes the smallest is kept,
    so that no prompt id exceeds any of them."""
    path = model_path(snapshot)
    if path is None:
        return {"vocab_size": None, "reason": "the server named no model path"}
    if pid is not None and (_other_root(pid) or not os.path.isabs(path)):
        # a container's path lies under its root, a relative one under the server's working dir
        base = "/proc/%d/root" % pid if os.path.isabs(path) else "/proc/%d/cwd" % pid
        config = base + "/" + path.lstrip("/") + "/config.json"
    elif os.path.isabs(path):
        config = os.path.join(path, "config.json")
    else:
        return {"vocab_size": None, "reason": "%r is relative and the server's process is not known" % path}
    try:
        raw = read_regular(config, CONFIG_LIMIT)  # a FIFO named config.json must not block the bench
    except NotRead as exc:
        return {"vocab_size": None, "reason": "%s: %s" % (config, exc)}
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {"vocab_size": None, "reason": "%s is not JSON" % config}
    holders = [data] + [data.get(k) for k in TEXT_CONFIG_KEYS] if isinstance(data, dict) else []
    sizes = [h["vocab_size"] for h in holders if isinstance(h, dict) and isinstance(h.get("vocab_size"), int)
             and not isinstance(h.get("vocab_size"), bool) and h["vocab_size"] > 0]
    if not sizes:
        return {"vocab_size": None, "reason": "no vocab_size in %s" % config}
    return {"vocab_size": min(sizes), "source": config}


def model_name(snapshot):
    """The name OpenAI-style requests use: the served name when set, else the model path."""
    args = (snapshot.get("server_info") or {}).get("server_args") or snapshot.get("server_info") or {}
    return (args.get("served_model_name") or (snapshot.get("model_info") or {}).get("model_path")
            or args.get("model_path") or "default")


def read_pid(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_environ(pid):
    """Process ``pid``'s whole environment, or None where it cannot be read."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            env.setdefault(key, value)
    return env


def process_env(pid):
    """The server's tuning-relevant environment (only known prefixes: never secrets)."""
    environ = process_environ(pid)
    if environ is None:
        return None
    return dict((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIXES))


def server_python_env(pid, configured_pythonpath=None):
    """The environment in which the server's python imports what the server imports: the running
    server's own ``PYTHONPATH`` (or none, when it runs without one), else the inventory's
    ``sglang_env`` one (``configured_pythonpath``); None (this process's environment) when neither
    is known. Without it an install on PYTHONPATH is missed and the python's own packages
    (another transformers) are recorded instead of the server's."""
    environ = process_environ(pid) if pid is not None else None
    if environ is None and configured_pythonpath is None:
        return None
    pythonpath = environ.get("PYTHONPATH") if environ is not None else configured_pythonpath
    env = dict(os.environ)
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = pythonpath
    return env


def patched_sources(state_dir):
    """SGLang source files that a gpuops apply run changed and that still hold its version.

    Read from the host's apply journal (``<state_dir>/journal.jsonl``): a run that finished and
    was not rolled back, whose change to a ``sglang/...py`` file is still in place (same sha256).
    Entries are ``role:path`` so that a result says which gate patch it ran with.
    """
    if not state_dir:
        return []
    try:
        runs = runs_by_id(read_journal(state_dir))  # the apply helper's own reader: one journal schema
    except OSError:
        return []
    found = set()
    for run in runs:
        if FINISHED not in run["events"] or ROLLED_BACK in run["events"]:
            continue
        for change in run.get("changes") or []:
            path = change.get("path") or ""
            if "/sglang/" not in path or not path.endswith(".py"):
                continue
            try:
                current = sha256_file(path)
            except OSError:
                current = None  # unreadable here: not known to be in place
            if change.get("after_sha256") and current == change["after_sha256"]:
                rel = path[path.rindex("/sglang/") + 1:]
                found.add("%s:%s" % (run.get("role") or "apply", rel))
    return sorted(found)


# sgl-kernel's distribution is named sglang-kernel from 0.4 (SGLang 0.5.16 pins sglang-kernel==0.4.5;
# the import name stays sgl_kernel): both are asked for, a host has one or the other.
PACKAGES = ("sglang", "sgl-kernel", "sglang-kernel", "flashinfer-python", "torch", "nvidia-nccl-cu12",
            "nvidia-nccl-cu13", "triton", "transformers")

_PACKAGE_PROBE = (
    "import json,sys\n"
    "try:\n import importlib.metadata as m\n"
    "except ImportError:\n print('{}'); sys.exit(0)\n"
    "out={}\n"
    "for n in sys.argv[1:]:\n"
    " try: out[n]=m.version(n)\n"
    " except Exception: pass\n"
    "print(json.dumps(out))\n"
)


def package_versions(python, env=None):
    """Versions of the serving stack as the server's python sees them in ``env`` (metadata only,
    no imports)."""
    if not python:
        return None
    try:
        done = subprocess.run([python, "-c", _PACKAGE_PROBE] + list(PACKAGES), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30, env=env)
        return json.loads(done.stdout.decode("utf-8", "replace") or "{}") if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def host_snapshot(server_python=None, env=None):
    """The host's light facts; the serving stack's versions as ``server_python`` sees them in
    ``env`` (``server_python_env``)."""
    facts = {"hostname": socket.gethostname(), "python": sys.version.split()[0]}
    packages = package_versions(server_python, env)
    if packages is not None:
        facts["packages"] = packages
    try:
        facts["kernel"] = os.uname().release
    except AttributeError:
        pass
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version,pci.bus_id",
             "--format=csv,noheader"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
        if done.returncode == 0:
            gpus = []
            for line in done.stdout.decode("utf-8", "replace").splitlines():
                fields = [f.strip() for f in line.split(",")]
                if len(fields) >= 6:
                    gpus.append({"index": fields[0], "name": fields[1], "compute_cap": fields[2],
                                 "memory_total": fields[3], "driver_version": fields[4], "pci_bus_id": fields[5]})
            facts["gpus"] = gpus
        else:
            facts["gpus_error"] = done.stderr.decode("utf-8", "replace").strip()[-200:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["gpus_error"] = str(exc)
    return facts
