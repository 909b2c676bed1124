"""The host transactions this gpuops process holds open right now, for what Ctrl-C says.

An interrupted apply or rollback leaves each host to end its run by itself; the operator is told,
per host, the run id, what the host was doing, what it does now (roll back, or finish a commit
gpuops had already sent) and the command that shows the outcome. ``apply/txn.py`` keeps this up
to date; ``cli.py`` prints it on Ctrl-C (the first and any later one alike: the process exits at
once, which closes every channel, so the hosts act without waiting for their lease).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gpuops.remote.host_protocol import MODE_APPLY, MODE_ROLLBACK

_lock = threading.Lock()


@dataclass
class OpenRun:
    """One host transaction this process holds open: its run id, lease and mode, the phase it is at, and whether
    the commit was sent (what Ctrl-C tells the operator the host does now)."""

    host: str
    run_id: str | None
    lease_s: float
    mode: str = MODE_APPLY  # the helper's mode: MODE_ROLLBACK undoes an earlier run
    phase: str = "starting"
    commit_sent: bool = False


_open: dict[str, OpenRun] = {}


def opened(host: str, run_id: str | None, lease_s: float, mode: str = MODE_APPLY) -> None:
    with _lock:
        _open[host] = OpenRun(host, run_id, lease_s, mode)


def at_phase(host: str, phase: str) -> None:
    with _lock:
        if host in _open:
            _open[host].phase = phase


def commit_sent(host: str) -> None:
    with _lock:
        if host in _open:
            _open[host].commit_sent = True


def closed(host: str) -> None:
    with _lock:
        _open.pop(host, None)


def interrupt_lines() -> list[str]:
    """One line per open run: what the host does now that gpuops is gone, and how to check."""
    with _lock:
        runs = list(_open.values())
    lines = []
    for run in runs:
        if run.commit_sent:
            then = "gpuops had confirmed it, so the host finishes the commit"
        elif run.mode == MODE_ROLLBACK:  # rolling a rollback back puts the run it was undoing back in effect
            then = (f"gpuops had not confirmed it, so the host undoes this rollback now (at the latest within "
                    f"its lease, {run.lease_s:.0f} s) and the run it was undoing stays in effect")
        else:
            then = (f"gpuops had not confirmed it, so the host rolls it back now (at the latest within "
                    f"its lease, {run.lease_s:.0f} s)")
        lines.append(f"gpuops: {run.host}: run {run.run_id or '?'} was at {run.phase}; {then}; "
                     f"check: gpuops history -l {run.host} (with the same -i)")
    return lines
