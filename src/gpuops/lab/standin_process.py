"""Start the stand-in SGLang server as a local process (rehearsals without a host, and tests).

The lab runs the same file on its simulated hosts; this is the local, one-process form: pick a free
loopback port, start ``standin_server.py`` with SGLang flags and controls, wait until /health is 200.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.lab.ports import free_port

STANDIN_PATH = Path(__file__).resolve().parent / "standin_server.py"


@dataclass
class StandinProcess:
    """A running stand-in server; ``stop()`` sends SIGTERM and waits."""

    process: subprocess.Popen
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        return int(self.process.returncode)

    def __enter__(self) -> "StandinProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_standin(
    log_dir: Path,
    flags: Sequence[str] = ("--model-path", "/models/Kimi-K2.5", "--tp", "8"),
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    wait_healthy: bool = True,
    timeout: float = 20.0,
) -> StandinProcess:
    """Start the stand-in on a free 127.0.0.1 port (flags may not name --port/--host)."""
    port = free_port()
    args = [python, str(STANDIN_PATH), "-m", "sglang.launch_server", *flags,
            "--host", "127.0.0.1", "--port", str(port)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_STANDIN_")}
    full_env.update(env or {})
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"standin-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=full_env)
    running = StandinProcess(process, port, log_path, args)
    if wait_healthy:
        wait_for_health(running, timeout)
    return running


def wait_for_health(server: StandinProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise GpuopsError(f"stand-in server exited with {server.process.returncode}: "
                              f"{server.log().strip().splitlines()[-1:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=1.0) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    server.stop()
    raise GpuopsError(f"stand-in server on port {server.port} not healthy after {timeout:.0f}s")
