"""Disk full on the host: a backup that cannot be completed leaves nothing behind and names its
real cause (ENOSPC and the path). A real full filesystem: a 256 KiB tmpfs as the state dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuops.remote.apply_common import StepFailed
from gpuops.remote.apply_lease import NoLease
from gpuops.remote.apply_run import Run


@pytest.fixture
def full_state_dir(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)], check=True)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_a_backup_that_fills_the_state_dir_removes_its_partial_files_and_names_enospc(full_state_dir, tmp_path):
    small, big = tmp_path / "small.env", tmp_path / "big.py"
    small.write_bytes(b"A=1\n")
    big.write_bytes(os.urandom(400 * 1024))  # the second backup does not fit
    run = Run({"state_dir": str(full_state_dir), "run_id": "r1", "service": None}, lambda record: None, NoLease())
    os.makedirs(run.run_dir)
    with pytest.raises(StepFailed) as failed:
        run.backup([{"path": str(small), "after_b64": ""}, {"path": str(big), "after_b64": ""}])
    message = str(failed.value)
    assert "ENOSPC" in message and str(full_state_dir / "runs" / "r1" / "files") in message, message
    assert not (full_state_dir / "runs" / "r1").exists(), "the partial backup (files/000) was removed"
    assert small.read_bytes() == b"A=1\n"


def test_a_silent_failure_in_a_full_run_dir_names_enospc(full_state_dir):
    from gpuops.remote.apply_run import silent_failure

    (full_state_dir / "filler").write_bytes(b"\0" * (256 * 1024 - 4096))
    with pytest.raises(OSError):
        (full_state_dir / "more").write_bytes(b"\0" * 8192)
    assert silent_failure(1, str(full_state_dir)) == f"exit status 1 and no message: ENOSPC: no space left on {full_state_dir}"
