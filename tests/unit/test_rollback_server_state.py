"""What a rollback and a later recovery do to, and say of, a previous server that is slow to start
(issue 36, defect 7). Measured on SGLang 0.5.16: a start takes 63-171 s; with a health timeout
shorter than that, the apply's rollback ended ``rollback_failed``, then a read-only ``gpuops history``
killed the server 20 s into its start, restarted it, and said "server left as it was".

Here the previous server is a real process that the process manager takes for a server and that
never answers ``/health`` (nothing listens on its port): a start that outlasts any health wait."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuops.lab.ports import free_port
from gpuops.remote import process_manager
from gpuops.remote.apply_journal import read_journal
from gpuops.remote.apply_lease import NoLease
from gpuops.remote.apply_recovery import recover_unfinished
from gpuops.remote.apply_run import SERVER_PROBLEM, Run
from gpuops.remote.host_protocol import ROLLBACK_FAILED, ROLLED_BACK, SERVER_TOUCHED


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir whose launch script starts a 'server' that loads for a minute (it only sleeps)."""
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "launch_server.py").write_text("import time\ntime.sleep(60)\n")
    (state / process_manager.LAUNCH_SCRIPT).write_text(
        f"exec {sys.executable} {tmp_path / 'sglang' / 'launch_server.py'} --port {free_port()}\n")
    yield state
    process_manager.stop(str(state), grace=1)


def rolled_back_run(state: Path) -> tuple[Run, dict[str, Any], list[str], str]:
    """An apply run that touched the server and rolled back: its previous server restarted and not
    healthy within the health timeout (0.3 s), the run left open as ``rollback_failed``."""
    port = int((state / process_manager.LAUNCH_SCRIPT).read_text().rsplit(" ", 1)[1])
    service = {"manager": "process", "state_dir": str(state), "port": port, "health_timeout": 0.3, "grace": 1}
    run = Run({"state_dir": str(state), "run_id": "r1", "meta": {"role": "nccl-env"}, "service": service},
              lambda event: None, NoLease())
    run.server_running_before = True
    manifest = run.backup([])
    run.journal_started(role="nccl-env", manifest_sha256=manifest["_sha256"])
    run.server_touched = True
    run.event(SERVER_TOUCHED)
    _, problems, note = run.restore(manifest)
    run.event(ROLLBACK_FAILED, error="the new server was not healthy", problems=problems)
    return run, manifest, problems, note


def test_a_failed_restart_is_never_reported_as_a_server_left_as_it_was(state: Path) -> None:
    _, _, problems, note = rolled_back_run(state)
    pid = process_manager.status(str(state))["pid"]
    assert pid is not None and process_manager.alive(pid)
    assert [p for p in problems if p.startswith(SERVER_PROBLEM)], problems
    # The truth: the previous configuration's server runs, was not healthy in time, and was left running.
    assert "left as it was" not in note, note
    assert "not confirmed healthy" in note and f"pid {pid}" in note and "left running" in note, note


def test_a_recovery_never_kills_the_previous_server_the_rollback_started(state: Path) -> None:
    """The next command's recovery (history's, inspect's, apply's) finds the server the rollback
    started still running: it is left alone (a restart only begins its load again) and said not to
    be confirmed healthy; the run is closed with that note."""
    rolled_back_run(state)
    pid = process_manager.status(str(state))["pid"]
    lines = recover_unfinished(str(state), lambda event: None, [])
    assert process_manager.status(str(state))["pid"] == pid and process_manager.alive(pid), "the server was restarted"
    assert len(lines) == 1 and "left as it was" not in lines[0], lines
    assert f"pid {pid}" in lines[0] and "left running" in lines[0], lines
    closing = [r for r in read_journal(str(state)) if r.get("run_id") == "r1"][-1]
    assert closing["event"] == ROLLED_BACK and "not confirmed healthy" in closing["service"], closing
    assert "worker died" not in lines[0], lines  # its worker did not die: its rollback failed
    assert os.path.isdir(state)
