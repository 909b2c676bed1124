"""Finding and ending a lab's processes: by pid file, checked against their command line, and by
the ``GPUOPS_LAB_DIR`` marker every lab process carries in its environment.

sshd is started with the marker in its environment, so its per-connection children inherit it; the
sessions get it from sshd's ``SetEnv``; servers from their host's session environment. So a sweep
of ``/proc/*/environ`` finds whatever a lab left running, and nothing that is not the lab's.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gpuops.remote import process_manager

LAB_DIR_VAR = "GPUOPS_LAB_DIR"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (reaped first when it is our own child)."""
    return process_manager.alive(pid)


def _state(pid: int) -> str | None:
    return process_manager.process_state(pid)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 1 else None


def terminate(pid: int, grace: float = 3.0, group: bool = False) -> bool:
    """SIGTERM (the group when ``group``), SIGKILL after ``grace``; True when it is gone."""

    def send(sig: int) -> None:
        try:
            if group and os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    if not alive(pid):
        return True
    send(signal.SIGTERM)
    if _wait_gone(pid, grace):
        return True
    send(signal.SIGKILL)
    return _wait_gone(pid, 5.0)


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            data = (entry / "stat").read_bytes()
            parent = int(data[data.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_sshd_tree(pid: int) -> None:
    """End an sshd listener and every connection and session under it, with no race.

    Connection processes are the listener's children only while it lives (then they belong to
    init), and a handshake in flight forks new ones: so freeze the listener first (SIGSTOP: no more
    forks), collect its whole tree, and SIGKILL all of it. Sessions that double-forked away are
    left to the environment sweep.
    """
    try:
        os.kill(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return
    tree = descendants(pid)
    for victim in [pid, *tree]:
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for victim in [pid, *tree]:
        _wait_gone(victim, 2.0)


def lab_processes(root: Path) -> list[int]:
    """Pids of processes whose environment says they belong to the lab at ``root``."""
    marker = f"{LAB_DIR_VAR}={root}".encode() + b"\0"
    spared = _self_and_ancestors()
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes() + b"\0"
        except OSError:
            continue
        if (b"\0" + marker) in (b"\0" + environ) and _state(pid) not in (None, "Z"):
            found.append(pid)
    return sorted(found)


def _self_and_ancestors() -> set[int]:
    # `gpuops lab down` run from inside a lab session must not kill itself or its shell.
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            data = Path(f"/proc/{pid}/stat").read_bytes()
            pid = int(data[data.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(pid)
    return pids


def sweep(root: Path) -> list[int]:
    """SIGKILL every process left in the lab at ``root``; returns their pids."""
    pids = lab_processes(root)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        _wait_gone(pid, 2.0)
    return pids
