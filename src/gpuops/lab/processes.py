"""Stopping a lab daemon by pid (dockerd, systemd-nspawn): ask, wait, then insist."""

from __future__ import annotations

import os
import signal
import time


def terminate(pid: int, grace: float) -> None:
    """SIGTERM, up to ``grace`` seconds for it to exit, then SIGKILL. Reaps it when it is our child;
    when it is not (another process started it), watches /proc instead."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: poll /proc
            done = 0 if os.path.exists(f"/proc/{pid}") else pid
        if done:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
