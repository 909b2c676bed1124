"""A real SGLang router (``sglang-router`` from PyPI, the Rust gateway) in front of the lab's stand-ins.

``gpuops lab up --router`` installs the release once into ``<cache>/sglang-router/<version>-py<X.Y>/site``
(``pip install --target`` with gpuops' own python, which then runs it; the wheel is abi3 but its
dependencies are not), starts ``python -m sglang_router.launch_router --worker-urls ...`` on a free
loopback port with every server of the lab as a worker, and waits until ``GET /workers`` lists them
all healthy. The lab's inventory then names it as ``sglang_router_url`` (group ``lab``), so every
lab host is a replica behind it. Its files: ``<lab>/router/`` (``router.json``, ``router.pid``,
``router.log``); it carries the lab's marker in its environment, so ``lab down`` sweeps it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from gpuops.errors import GpuopsError
from gpuops.lab import processes
from gpuops.lab.file_lock import exclusive_lock
from gpuops.lab.ports import free_ports
from gpuops.frozen import frozen

DEFAULT_VERSION = "0.3.2"
ROUTER_DIR = "router"
_INSTALL_TIMEOUT_S = 900
_START_TIMEOUT_S = 60.0


@frozen
class LabRouter:
    url: str
    port: int
    pid: int
    version: str
    log: Path

    def alive(self) -> bool:
        return processes.alive(self.pid) and _is_router(self.pid)


def cache_root() -> Path:
    base = os.environ.get("GPUOPS_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops") / "sglang-router"


def router_site(version: str = DEFAULT_VERSION) -> Path:
    """The installed release (and its dependencies) for this python; installed once, atomically."""
    tag = f"{version}-py{sys.version_info[0]}.{sys.version_info[1]}"
    release = cache_root() / tag
    site = release / "site"
    if (site / "sglang_router" / "launch_router.py").is_file():
        return site
    release.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(release / ".lock"):
        if (site / "sglang_router" / "launch_router.py").is_file():
            return site
        staging = Path(tempfile.mkdtemp(prefix=".install-", dir=release))
        command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input",
                   "--only-binary=:all:", "--target", str(staging), f"sglang-router=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuopsError(f"lab: pip install sglang-router=={version} failed: {exc}") from None
        if done.returncode != 0 or not (staging / "sglang_router" / "launch_router.py").is_file():
            lines = [ln for ln in done.stderr.strip().splitlines() if not ln.startswith("WARNING:")]
            raise GpuopsError(f"lab: pip install sglang-router=={version} failed: "
                              f"{(lines or ['no package installed'])[-1]}")
        os.rename(staging, site)
    return site


def start_router(root: Path, worker_urls: Sequence[str], version: str = DEFAULT_VERSION,
                 await_healthy: bool = True, port: int | None = None) -> LabRouter:
    """Start the router in front of ``worker_urls`` and wait until it lists them all healthy (or,
    without ``await_healthy``, until it answers: a first deploy's router, whose workers do not serve yet);
    on ``port`` when given (a router back at the address the inventory names)."""
    site = router_site(version)
    directory = root / ROUTER_DIR
    directory.mkdir(exist_ok=True)
    free = free_ports(2)  # its Prometheus exporter too: the default 29000 may be taken
    port, metrics_port = (port or free[0]), free[1]
    log = directory / "router.log"
    env = {**os.environ, "PYTHONPATH": str(site), processes.LAB_DIR_VAR: str(root), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
               "--policy", "round_robin", "--worker-urls", *worker_urls]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=env, cwd=str(directory), start_new_session=True)
    (directory / "router.pid").write_text(f"{process.pid}\n")
    router = LabRouter(url=f"http://127.0.0.1:{port}", port=port, pid=process.pid, version=version, log=log)
    (directory / "router.json").write_text(json.dumps({"url": router.url, "port": port, "pid": process.pid,
                                                       "version": version}) + "\n")
    _await_workers(router, process, len(worker_urls) if await_healthy else 0)
    return router


def _await_workers(router: LabRouter, process: subprocess.Popen, count: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    seen = "nothing"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = router.log.read_text(errors="replace").strip().splitlines()[-1:] if router.log.exists() else []
            raise GpuopsError(f"lab: the sglang-router exited at start (status {process.returncode})"
                              + (f": {tail[0][:200]}" if tail else ""))
        try:
            with urllib.request.urlopen(router.url + "/workers", timeout=2) as reply:
                workers = json.loads(reply.read().decode())["workers"]
            healthy = sum(1 for w in workers if w.get("is_healthy"))
            seen = f"{healthy} of {count} workers healthy"
            if healthy >= count:
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.2)
    processes.terminate(router.pid, group=True)
    raise GpuopsError(f"lab: the sglang-router at {router.url} was not ready within {_START_TIMEOUT_S:.0f} s ({seen})")


def load_router(root: Path) -> LabRouter | None:
    path = root / ROUTER_DIR / "router.json"
    try:
        record = json.loads(path.read_text())
        return LabRouter(url=str(record["url"]), port=int(record["port"]), pid=int(record["pid"]),
                         version=str(record["version"]), log=root / ROUTER_DIR / "router.log")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GpuopsError(f"lab: {path}: unreadable router record ({exc})") from None


def stop_router(root: Path, grace: float = 5.0) -> None:
    pid = processes.read_pid(root / ROUTER_DIR / "router.pid")
    if pid and _is_router(pid):
        processes.terminate(pid, grace, group=True)


def _is_router(pid: int) -> bool:
    # The pid may be reused: it must still be the router (which renames itself with setproctitle).
    line = processes.cmdline(pid)
    return "sglang::router" in line or "sglang_router" in line
