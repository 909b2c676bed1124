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


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def _leave_free(directory: Path, free: int) -> None:
    """Fill ``directory``'s filesystem until about ``free`` bytes are left."""
    st = os.statvfs(directory)
    (directory / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - free))


def _change(path: Path, new: bytes) -> dict:
    import base64
    import hashlib

    return {"path": str(path), "before_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "after_b64": base64.b64encode(new).decode(), "after_sha256": hashlib.sha256(new).hexdigest()}


@pytest.fixture
def site_and_state(tmp_path: Path):
    """A full-able site dir (the managed files' own filesystem) and a roomy state dir, both tmpfs."""
    site, state = tmp_path / "site", tmp_path / "state"
    _tmpfs(site, "256k")
    _tmpfs(state, "4m")
    try:
        yield site, state
    finally:
        for mount in (site, state):
            subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_staged_file_that_does_not_fit_fails_naming_enospc_and_the_rollback_restores_every_byte(site_and_state):
    """The second managed file's staged copy (written beside it, renamed over it) cannot be written:
    the run fails naming ENOSPC and that file, leaves no staged copy behind, and its rollback puts
    back the first file, already replaced, byte for byte."""
    site, state = site_and_state
    first, second = site / "a.env", site / "b.py"
    first.write_bytes(b"A=1\n")
    second.write_bytes(b"# old\n" * 10_000)
    before = {p.name: p.read_bytes() for p in (first, second)}
    _leave_free(site, 96 * 1024)  # the new first file fits; the second's 120 KiB copy does not
    run = Run({"state_dir": str(state), "run_id": "r2", "service": None}, lambda record: None, NoLease())
    os.makedirs(run.run_dir)
    changes = [_change(first, b"A=2\n"), _change(second, b"# new\n" * 20_000)]
    manifest = run.backup(changes)
    with pytest.raises(StepFailed) as failed:
        run.write_changes(changes)
    message = str(failed.value)
    assert "ENOSPC" in message and str(second) in message, message
    assert first.read_bytes() == b"A=2\n", "the first file was written: the rollback has something to undo"
    assert not [p for p in site.iterdir() if ".gpuops-" in p.name], "no staged copy left behind"
    result = run.rollback(manifest, message)
    assert result["status"] == "rolled_back", result
    assert {p.name: p.read_bytes() for p in (first, second)} == before


def test_a_journal_that_cannot_take_the_run_fails_it_before_any_change(tmp_path: Path) -> None:
    """The backup takes the state dir's last pages; the journal's ``started`` record does not fit:
    the run fails naming ENOSPC and the journal, nothing was changed, its backup is gone (the next
    run does not find a backup nobody journaled)."""
    from gpuops.remote.apply_run import do_apply

    site, state = tmp_path / "site", tmp_path / "state"
    site.mkdir()
    managed = site / "sglang.env"
    managed.write_bytes(b"X" * 8192)  # two pages of backup
    _tmpfs(state, "256k")
    try:
        _leave_free(state, 3 * 4096)  # the backup (2 pages) and its manifest (1 page): all that is left
        payload = {"state_dir": str(state), "run_id": "r3", "service": None, "handlers": [], "meta": {"role": "t"},
                   "changes": [_change(managed, b"Y\n")]}
        with pytest.raises(StepFailed) as failed:
            do_apply(payload, lambda record: None, NoLease(), None, [])
        message = str(failed.value)
        assert "ENOSPC" in message and str(state / "journal.jsonl") in message, message
        assert "nothing was changed" in message
        assert managed.read_bytes() == b"X" * 8192
        assert not (state / "runs" / "r3").exists(), "the backup nobody journaled was removed"
        assert b"started" not in ((state / "journal.jsonl").read_bytes() if (state / "journal.jsonl").exists() else b"")
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
