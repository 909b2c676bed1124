"""The allreduce and fusion suites, on the host: a torch.distributed worker (``allreduce_bench.py``
or ``fusion_bench.py``, sent in the payload) launched with torchrun once per NCCL variant.

Stdlib only, Python 3.8+ (bundled into ``bench_client``); torch is the host's own, used only by the
worker in its own processes.
"""

import json
import os
import subprocess

from gpuops.remote.bench_http import ServerError
from gpuops.remote.bench_snapshot import server_client
from gpuops.remote.bench_torchrun import run_watched, variant_timeout
from gpuops.remote.bench_workdir import in_temp_dir

NEEDS_SERVER = False  # only the model's hidden size is asked of it, and that has a default
SERVER_AFTER = False


def expected_records(payload):
    spec = payload.get("allreduce") or {}
    per = len(spec.get("tokens") or []) * (2 if payload.get("suite") == "fusion" else 1)
    return per * len(spec.get("variants") or [{}])


def run_suite(payload, snapshot, emitter, stop):
    return suite_allreduce(payload, emitter, stop)


def gpu_count():
    try:
        done = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return len([l for l in done.stdout.decode("utf-8", "replace").splitlines() if l.startswith("GPU ")]) or None


def served_hidden_size(url):
    """hidden_size from the served model's config.json (text_config for multimodal wrappers)."""
    try:
        model_path = server_client(url).model_info(timeout=5).get("model_path")
    except ServerError:
        return None, "server not reachable"
    if not model_path:
        return None, "the server named no model path"
    try:
        with open(os.path.join(model_path, "config.json")) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        return None, "cannot read %s/config.json (%s)" % (model_path, exc.__class__.__name__)
    for holder in (config, config.get("text_config") or {}, config.get("language_config") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("hidden_size"), int):
            return holder["hidden_size"], "%s/config.json" % model_path
    return None, "no hidden_size in %s/config.json" % model_path


def suite_allreduce(payload, emitter, stop):
    in_temp_dir("gpuops-allreduce-", lambda d: _suite_allreduce(payload, emitter, stop, d))


def _suite_allreduce(payload, emitter, stop, work_dir):
    """Run the torch.distributed worker once per NCCL variant with torchrun; relay its frames.

    Each launch has a watchdog: past its timeout the whole process group is killed, the variant
    is recorded as ``timed out after N s (hung collective)`` and the next variant runs. Records
    relayed before that are kept (they were emitted, and written to the host's record file).
    """
    spec = payload["allreduce"]
    kind = spec.get("kind") or ("fusion" if payload.get("suite") == "fusion" else "allreduce")
    script = os.path.join(work_dir, "%s_bench.py" % kind)
    with open(script, "w") as handle:
        handle.write(spec["worker_source"])
    python = spec.get("python") or "python3"
    if not spec.get("world_size"):
        found = gpu_count() if spec.get("backend") != "gloo" else None
        spec["world_size"] = found or (2 if spec.get("backend") == "gloo" else 1)
        emitter.emit("note", {"message": "world size %d (%s)" % (
            spec["world_size"], "nvidia-smi -L" if found else "default")})
    if not spec.get("hidden_size"):
        hidden, source = served_hidden_size(payload.get("url") or "")
        spec["hidden_size"] = hidden or 7168
        emitter.emit("note", {"message": "hidden size %d (%s)" % (
            spec["hidden_size"], source if hidden else "default; " + source)})
    timeout = variant_timeout(spec, kind)
    variants = spec.get("variants") or [{}]
    for variant_index, variant in enumerate(variants):
        if stop.is_set():
            break
        config = dict(spec)
        config.pop("worker_source", None)
        config["variant"] = variant
        config["run_id"] = emitter.run_id
        config_path = os.path.join(work_dir, "config-%d.json" % variant_index)
        with open(config_path, "w") as handle:
            json.dump(config, handle)
        env = dict(payload.get("server_env") or os.environ)  # torch and NCCL as the server imports them
        env.update({str(k): str(v) for k, v in variant.items()})
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        # torchrun makes a `torchelastic_*` log dir under TMPDIR and leaves it: keep it in ours.
        env["TMPDIR"] = work_dir
        argv = [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(int(spec.get("world_size", 1))), script, config_path]
        emitter.emit("note", {"message": "variant %s (%d of %d, watchdog %.0f s)" % (
            variant or "default", variant_index + 1, len(variants), timeout)})
        emitter.emit("progress", {"variant": variant, "index": variant_index, "total": len(variants)})
        outcome = run_watched(argv, env, emitter, stop, timeout, kind)
        if outcome["timed_out"]:
            emitter.emit("error", {"variant": variant, "timed_out": True, "records": outcome["seen"],
                                   "message": "timed out after %.0f s (hung collective)" % timeout})
        elif outcome["returncode"] != 0 and not stop.is_set():
            errors = outcome["stderr"]
            interesting = [e for e in errors if "Error" in e or "error" in e] or errors
            emitter.emit("error", {"variant": variant, "message": "torchrun exited %d: %s" % (
                outcome["returncode"], (interesting[-1] if interesting else "no output"))})
        elif outcome["seen"] == 0 and not stop.is_set():
            emitter.emit("error", {"variant": variant, "message": "no measurement came back"})
