"""A host that resets the connection during the SSH banner: gpuops prints its one line about that
host and no traceback (paramiko's own log records are shown with -v only). Real loopback TCP."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


@pytest.fixture
def resetting_host():
    """A port whose every connection is reset (RST) after ``delay`` seconds: paramiko is then
    reading the banner."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            time.sleep(0.3)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    server.close()


def _inspect(port: int, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inv.yml"
    inventory.write_text(f"all:\n  hosts:\n    h1: {{ansible_host: 127.0.0.1, ansible_port: {port}}}\n")
    (tmp_path / ".ssh").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "gpuops.cli", "inspect", "host", "-i", str(inventory), *flags],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})


def test_a_reset_during_the_banner_is_one_line_and_no_traceback(resetting_host: int, tmp_path: Path) -> None:
    done = _inspect(resetting_host, tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "paramiko" not in done.stderr, done.stderr
    assert done.stderr.strip() == "", done.stderr
    failed = [line for line in done.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "h1" in failed[0] and "reset by peer" in failed[0], done.stdout


def test_with_v_paramikos_own_records_are_shown(resetting_host: int, tmp_path: Path) -> None:
    done = _inspect(resetting_host, tmp_path, "-v")
    assert "paramiko.transport: " in done.stderr, done.stderr
