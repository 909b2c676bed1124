"""The apply run's one polled runner (remote/apply_commands.run_watched) under the faults it exists for.

A command that outlives the run's lease, or its time, is ended with its whole process group (a
shell's background child too, which would otherwise go on changing the host after the rollback);
each caller keeps its own error: LeaseLapsed / StepFailed for run_polled (the compile check, the
re-audit), ServiceFailed and status 127 for container_image.docker. Real processes, a real lease
file; nothing is timed: the command would run for minutes, and the test waits for the error.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuops.remote.apply_commands import run_polled, run_watched
from gpuops.remote.apply_common import LeaseLapsed, StepFailed
from gpuops.remote.apply_lease import Lease, note_beat
from gpuops.remote.container_image import docker
from gpuops.remote.service_base import ServiceFailed

# A shell that starts a background child in its group, says its pid, and waits on it.
FAMILY = ["/bin/sh", "-c", 'sleep 600 & echo $! > "$0"; wait']


def _gone(pid: int, deadline_s: float = 30.0) -> bool:
    """True once ``pid`` no longer runs (gone, or a zombie waiting for its reaper)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _family(tmp_path: Path) -> tuple[list[str], Path]:
    pid_file = tmp_path / "child.pid"
    return FAMILY + [str(pid_file)], pid_file


def _child(pid_file: Path) -> int:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError("the shell never started its child")


def test_a_lapsed_lease_kills_the_whole_group_and_raises_lease_lapsed(tmp_path: Path) -> None:
    call, work = tmp_path / "call", tmp_path / "work"
    call.mkdir()
    work.mkdir()
    note_beat(str(call / "lease"))
    lease = Lease(str(call), 600)
    argv, pid_file = _family(tmp_path)
    seen: list[int] = []

    def check() -> None:
        if pid_file.exists() and pid_file.read_text().strip():
            seen.append(_child(pid_file))
            (call / "client_gone").touch()  # the relay saw the client go
        lease.check("the compile check")

    with pytest.raises(LeaseLapsed) as raised:
        run_watched(argv, str(work), check, 600, lambda: StepFailed("too long"))
    assert "the connection to gpuops was lost (the compile check); the host was rolled back" in str(raised.value)
    assert seen and _gone(seen[0]), "the background child outlived the lapsed lease"
    assert list(work.iterdir()) == []  # its input and output files are gone too


def test_run_polled_past_its_time_kills_the_group_and_raises_step_failed(tmp_path: Path) -> None:
    call = tmp_path / "call"
    call.mkdir()
    note_beat(str(call / "lease"))
    argv, pid_file = _family(tmp_path)
    with pytest.raises(StepFailed) as raised:
        run_polled(argv, Lease(str(call), 600), "the gate re-audit", str(tmp_path), timeout=0)
    assert not isinstance(raised.value, LeaseLapsed)
    assert str(raised.value) == "the gate re-audit took longer than 0s"
    if pid_file.exists() and pid_file.read_text().strip():  # the shell may be killed before it forks
        assert _gone(_child(pid_file))


def test_run_polled_returns_status_and_both_outputs_and_a_missing_program_is_an_oserror(tmp_path: Path) -> None:
    call = tmp_path / "call"
    call.mkdir()
    note_beat(str(call / "lease"))
    status, out, err = run_polled(["/bin/sh", "-c", "cat; echo out; echo err >&2; exit 3"], Lease(str(call), 600),
                                  "x", str(tmp_path))
    assert (status, out, err) == (3, b"out\n", b"err\n")  # stdin is empty: cat ends at once
    with pytest.raises(OSError):
        run_polled([str(tmp_path / "no-such-python"), "-c", "pass"], Lease(str(call), 600), "x", str(tmp_path))


def test_docker_keeps_its_errors_status_127_without_docker_and_service_failed_past_its_time(
        tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert docker(["ps"], lambda: None, str(tmp_path)) == (127, b"", "docker not found on this host")
    # A docker that hangs on commit (a daemon that does not answer), else echoes its input to stderr.
    stand_in = bin_dir / "docker"
    stand_in.write_text('#!/bin/sh\n[ "$1" = commit ] && exec /bin/sleep 600\n/bin/cat >&2\n')
    stand_in.chmod(0o755)
    assert docker(["cp", "-", "c:/"], lambda: None, str(tmp_path), stdin_data=b"tar\n") == (0, b"", "tar")
    with pytest.raises(ServiceFailed) as raised:
        docker(["commit", "c", "t"], lambda: None, str(tmp_path), timeout=0)
    assert str(raised.value) == "docker commit took longer than 0s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # no input or output file left
