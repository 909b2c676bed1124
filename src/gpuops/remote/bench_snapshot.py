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
from gpuops.remote.sglang_server import ServerClient, find_server_pid, process_cmdline
from gpuops.remote.host_protocol import FINISHED, ROLLED_BACK


ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_", "FLASHINFER_", "SGL_")


def server_snapshot(url, pid_file=None, python=None):
    """What the server says about itself (through the one server client, asked the way its release
    answers: which route answered is kept under ``routes``), its process and whether it exposes
    ``/metrics`` (then ``metrics``: the summarised page before the run)."""
    info = {"url": url}
    pid = read_pid(pid_file) if pid_file else None
    if pid is None:
        pid = find_server_pid(url)
    client = server_client(url, pid, python)
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
    if pid is not None:
        info["pid"] = pid
        info["process_env"] = client.hide(process_env(pid))
        info["process_cmdline"] = client.hide(process_cmdline(pid))
    return info


_CLIENTS = {}  # type: dict[str, ServerClient]


def server_client(url, pid=None, python=None):
    """The one ``ServerClient`` of this run for ``url`` (its key from the server's command line):
    the suites' requests and the after-run questions reuse it."""
    if url not in _CLIENTS:
        _CLIENTS[url] = ServerClient.for_process(url, pid if pid is not None else find_server_pid(url), python)
    return _CLIENTS[url]


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


def process_env(pid):
    """The server's tuning-relevant environment (only known prefixes: never secrets)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key.startswith(ENV_PREFIXES):
            env[key] = value
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


PACKAGES = ("sglang", "sgl-kernel", "flashinfer-python", "torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "triton", "transformers")

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


def package_versions(python):
    """Versions of the serving stack as the server's python sees them (metadata only, no imports)."""
    if not python:
        return None
    try:
        done = subprocess.run([python, "-c", _PACKAGE_PROBE] + list(PACKAGES), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30)
        return json.loads(done.stdout.decode("utf-8", "replace") or "{}") if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def host_snapshot(server_python=None):
    facts = {"hostname": socket.gethostname(), "python": sys.version.split()[0]}
    packages = package_versions(server_python)
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
