"""Directories an apply run creates are taken away by every undo, and only those, only while empty.

A managed file whose parent does not exist (a systemd drop-in in a new ``NAME.service.d``, a
file in a new state subfolder) makes the run create directories. The promise is the transaction's:
undoing the run leaves the host byte-identical, directory list included. Every way back is tried:
``gpuops rollback``, the run's own failure rollback, the worker killed (kill -9) and recovered by
the session's helper, the client killed and the lease lapsing, a recomposition that deletes the file,
and a rollback that itself fails. A directory that someone filled in the meantime stays, with their
file; a directory that existed before stays.

Driven as tests/integration/test_apply_helper.py drives the helper (the real stream runner and the
client's transaction code over a local connection); ``labtools.tree_hashes`` compares kind, mode and
content of every entry, directories too.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from labtools import progress_records, tree_hashes, wait_for_self_rollback
from test_apply_helper import change, journal, lab_hooks, lab_state, payload, recompose_payload, run_helper

ROLLBACK = {"mode": "rollback", "meta": {}}


@pytest.fixture(autouse=True)
def lab_session(monkeypatch, tmp_path_factory) -> None:
    """A lab host's session (so that the lab fault file is honoured), with a known umask."""
    lab_hooks(monkeypatch, tmp_path_factory.mktemp("lab-site"))
    old = os.umask(0o022)
    yield
    os.umask(old)


def host_root(tmp_path: Path) -> Path:
    """A host's tree outside the state dir: ``etc`` exists, the run's directories do not."""
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "unit.service").write_bytes(b"[Service]\n")
    return root


def rollback(state: Path, run_id: str, target: str | None = None, **extra: Any) -> dict[str, Any]:
    return run_helper(dict(ROLLBACK, state_dir=str(state), run_id=run_id, target=target, **extra))


def test_rollback_removes_the_directories_the_run_created_deepest_first(tmp_path: Path) -> None:
    root, state = host_root(tmp_path), lab_state(tmp_path)
    drop_in = root / "etc" / "unit.service.d" / "gpuops" / "env.conf"
    beside = root / "etc" / "unit.service.d" / "other.conf"  # a second file in a directory the first one made
    before = tree_hashes(root)
    done = run_helper(payload(state, [change(drop_in, b"[Service]\n", None), change(beside, b"x\n", None)]))
    assert done["status"] == "finished", done
    assert drop_in.read_bytes() == b"[Service]\n" and beside.exists()
    undone = rollback(state, "r2", "r1")
    assert undone["ok"], undone
    assert tree_hashes(root) == before
    assert "kept_dirs" not in undone
    entries = {e["path"]: e for e in json.loads((state / "runs" / "r1" / "manifest.json").read_text())["files"]}
    # Each directory named once, by the first entry that needs it, deepest last.
    assert entries[str(drop_in)].get("created_dirs") == [str(root / "etc" / "unit.service.d"), str(drop_in.parent)]
    assert "created_dirs" not in entries[str(beside)]


def test_the_runs_own_failure_rollback_removes_them(tmp_path: Path) -> None:
    root, state = host_root(tmp_path), lab_state(tmp_path)
    new = root / "etc" / "a" / "b" / "new.conf"
    unit = root / "etc" / "unit.service"
    before = tree_hashes(root)
    state.mkdir(parents=True)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    result = run_helper(payload(state, [change(new, b"n\n", None), change(unit, b"[Service]\nX=1\n", b"[Service]\n")]))
    assert result["status"] == "rolled_back" and "injected fault" in result["error"], result
    assert tree_hashes(root) == before


def _calls(state: Path) -> set[Path]:
    return set((state / "calls").glob("*"))


def _paused_worker(state: Path, phase: str, earlier: set[Path], deadline: float) -> dict[str, Any]:
    """The worker record of the call whose worker paused at ``phase``."""
    while time.monotonic() < deadline:
        for progress in (c / "progress.jsonl" for c in _calls(state) - earlier):
            records = progress_records(progress)
            if any(r.get("event") == "paused" and r.get("phase") == phase for r in records):
                return next(r for r in records if r.get("event") == "worker")
        time.sleep(0.05)
    raise AssertionError(f"the worker never paused at {phase}")


def _run_to_pause(tmp_path: Path, phase: str) -> tuple[Path, Path, Path, dict[str, str], set[Path]]:
    """A host tree, its state dir with the lab told to pause the next run at ``phase``, the file
    that run creates under two new directories, the tree before it, and the call folders so far."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    state.mkdir(parents=True)
    (state / "lab-fault.json").write_text(json.dumps({"pause_at": phase, "seconds": 120}))
    return root, state, root / "etc" / "a" / "b" / "new.conf", tree_hashes(root), _calls(state)


def test_a_worker_killed_after_the_write_is_recovered_without_its_directories(tmp_path: Path) -> None:
    root, state, new, before, earlier = _run_to_pause(tmp_path, "first_write")
    answer: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: answer.update(run_helper(payload(state, [change(new, b"n\n", None)]),
                                                                      lease_s=30)))
    runner.start()
    try:
        worker = _paused_worker(state, "first_write", earlier, time.monotonic() + 60)
        assert new.exists()  # written, its directories made: then the OOM killer
        os.kill(worker["pid"], signal.SIGKILL)
    finally:
        runner.join(timeout=120)
    assert answer.get("status") == "rolled_back", answer  # the session's helper recovered it
    assert tree_hashes(root) == before
    assert [e for r, e in ((r["run_id"], r["event"]) for r in journal(state)) if r == "r1"][-1] == "rolled_back"


CLIENT = """
import json, sys, time
from gpuops.apply.txn import run_transaction
from gpuops.inventory import Host
from gpuops.shipping import python_command, python_stdin
from gpuops.transport.local import LocalConnection
payload = json.loads(sys.argv[1])
conn = LocalConnection(Host(name="h", address=None, port=None, user=None, key_file=None, groups=(), connection="local"))
body = python_stdin("apply_helper", payload, stream=True)
run_transaction(conn, python_command(sys.executable, stream=True), body, payload["lease_s"], time.monotonic() + 120,
                payload["run_id"], lambda out: (True, "judged"))
"""


def test_a_client_killed_mid_run_lets_the_lease_lapse_and_the_host_removes_them(tmp_path: Path) -> None:
    root, state, new, before, earlier = _run_to_pause(tmp_path, "confirm")
    lease = 3
    client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(dict(payload(state, [change(new, b"n\n", None)]),
                                                                              lease_s=lease))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _paused_worker(state, "confirm", earlier, time.monotonic() + 60)
        assert new.exists()
        client.kill()  # kill -9: nobody confirms, nobody says goodbye
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    wait_for_self_rollback(state / "lock", lambda: journal(state)[-1]["event"] == "rolled_back",
                           time.monotonic() + lease + 60)
    assert tree_hashes(root) == before


def test_a_directory_someone_filled_since_is_kept_with_their_file(tmp_path: Path) -> None:
    root, state = host_root(tmp_path), lab_state(tmp_path)
    new = root / "etc" / "a" / "b" / "new.conf"
    assert run_helper(payload(state, [change(new, b"n\n", None)]))["status"] == "finished"
    stranger = root / "etc" / "a" / "operator.conf"
    stranger.write_bytes(b"mine\n")
    expected = tree_hashes(root)
    del expected["etc/a/b"], expected["etc/a/b/new.conf"]
    undone = rollback(state, "r2", "r1")
    assert undone["ok"], undone
    assert tree_hashes(root) == expected  # a/b went (empty), a stays with the operator's file
    assert stranger.read_bytes() == b"mine\n"
    assert undone["kept_dirs"] == [str(root / "etc" / "a")]
    assert journal(state)[-1]["kept_dirs"] == [str(root / "etc" / "a")]


def test_a_directory_that_existed_before_is_kept_even_empty(tmp_path: Path) -> None:
    root, state = host_root(tmp_path), lab_state(tmp_path)
    (root / "etc" / "unit.service.d").mkdir()
    (root / "etc" / "unit.service.d").chmod(0o750)
    new = root / "etc" / "unit.service.d" / "gpuops" / "env.conf"
    before = tree_hashes(root)
    assert run_helper(payload(state, [change(new, b"[Service]\n", None)]))["status"] == "finished"
    assert rollback(state, "r2", "r1")["ok"]
    assert tree_hashes(root) == before  # unit.service.d (empty, 0750) is still there
    (entry,) = json.loads((state / "runs" / "r1" / "manifest.json").read_text())["files"]
    assert entry.get("created_dirs") == [str(new.parent)]


def test_a_recomposition_deleting_the_files_takes_their_directories_and_its_undo_brings_them_back(tmp_path: Path) -> None:
    """r1 creates a patch file (restored from r1's backups: a deletion) and desired.json (a planned
    deletion), each under two new directories, and writes the launch; r2 rewrites the launch.
    Undoing r1 by recomposition removes both files and their directories; undoing the recomposition
    makes the directories again (same modes) before the files."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    patch = root / "etc" / "patch.d" / "x" / "a.py"
    desired = root / "etc" / "desired.d" / "y" / "desired.json"
    launch = root / "etc" / "unit.service"
    before = tree_hashes(root)
    assert run_helper(payload(state, [change(patch, b"p\n", None), change(desired, b"{}\n", None),
                                      change(launch, b"l2\n", b"[Service]\n")], run_id="r1"))["status"] == "finished"
    for directory in (patch.parent, desired.parent.parent):
        directory.chmod(0o750)  # a mode no umask gives: the undo must make it again as it was
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    after_r2 = tree_hashes(root)
    gone = {"path": str(desired), "delete": True, "before_sha256": hashlib.sha256(b"{}\n").hexdigest(),
            "after_sha256": None}
    done = run_helper(recompose_payload(state, [gone, change(launch, b"l4\n", b"l3\n")], "r3", "r1", [patch]))
    assert done["status"] == "finished", done
    expected = {k: v for k, v in before.items() if k != "etc/unit.service"}
    assert {k: v for k, v in tree_hashes(root).items() if k != "etc/unit.service"} == expected
    undo = rollback(state, "r4", "r3")
    assert undo["ok"], undo
    assert tree_hashes(root) == after_r2


def test_a_rollback_that_fails_after_restoring_makes_the_directories_again(tmp_path: Path) -> None:
    """The rollback removed the file and its directories, then failed: its own backups put the
    file back, which needs the directories first. The next rollback then leaves the tree as before."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    new = root / "etc" / "a" / "b" / "new.conf"
    before = tree_hashes(root)
    assert run_helper(payload(state, [change(new, b"n\n", None)]))["status"] == "finished"
    (root / "etc" / "a").chmod(0o711)
    after_apply = tree_hashes(root)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "confirm"}))
    failed = rollback(state, "r2", "r1")
    assert failed["status"] == "rolled_back", failed
    assert tree_hashes(root) == after_apply
    assert rollback(state, "r3", "r1")["ok"]
    assert tree_hashes(root) == before


def test_a_manifest_naming_a_directory_not_above_its_file_is_refused(tmp_path: Path) -> None:
    """Even with the journal's hash of it rewritten too: an undo only ever removes directories above
    the files the run managed."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    new = root / "etc" / "a" / "new.conf"
    victim = root / "victim"
    victim.mkdir()
    assert run_helper(payload(state, [change(new, b"n\n", None)]))["status"] == "finished"
    manifest_path = state / "runs" / "r1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][0].setdefault("created_dirs", []).insert(0, str(victim))
    text = json.dumps(manifest).encode()
    manifest_path.write_bytes(text)
    records = journal(state)
    for record in records:
        if record.get("manifest_sha256") and record["run_id"] == "r1":
            record["manifest_sha256"] = hashlib.sha256(text).hexdigest()
    (state / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    refused = rollback(state, "r2", "r1")
    assert refused["ok"] is False and refused["error"].startswith("tampering") and "victim" in refused["error"], refused
    assert victim.is_dir() and new.exists()




def test_a_failed_rollback_makes_again_the_directories_it_took_when_the_file_was_already_gone(tmp_path: Path) -> None:
    """Someone deleted the file r1 created (its directories stay, one with a mode of theirs); the
    forced rollback takes the empty directories, then fails: its undo must make them again, though
    there is no file to put back."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    new = root / "etc" / "a" / "b" / "new.conf"
    assert run_helper(payload(state, [change(new, b"n\n", None)]))["status"] == "finished"
    new.unlink()
    (root / "etc" / "a").chmod(0o711)
    before_rollback = tree_hashes(root)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "confirm"}))
    failed = rollback(state, "r2", "r1", force=True)
    assert failed["status"] == "rolled_back", failed
    assert tree_hashes(root) == before_rollback


def test_a_failed_rollback_of_a_recomposition_takes_away_the_directories_it_made_again(tmp_path: Path) -> None:
    """r3 (a recomposition) deleted r1's file and its directories; rolling r3 back makes them again,
    then fails: its undo must take them away again, as they were before it."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    patch = root / "etc" / "patch.d" / "x" / "a.py"
    launch = root / "etc" / "unit.service"
    assert run_helper(payload(state, [change(patch, b"p\n", None), change(launch, b"l2\n", b"[Service]\n")],
                              run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    done = run_helper(recompose_payload(state, [change(launch, b"l4\n", b"l3\n")], "r3", "r1", [patch]))
    assert done["status"] == "finished", done
    assert not patch.parent.parent.exists()
    after_r3 = tree_hashes(root)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "confirm"}))
    failed = rollback(state, "r4", "r3")
    assert failed["status"] == "rolled_back", failed
    assert tree_hashes(root) == after_r3


def test_a_recomposition_undoing_a_recomposition_makes_the_directories_again_with_their_modes(tmp_path: Path) -> None:
    """r3 (recomposing r1 away) deleted r1's patch and its directories (one 0750); r4 rewrote the
    launch since, so r3 is undone by recomposition too (r5): the directories come back as they were."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    patch = root / "etc" / "patch.d" / "x" / "a.py"
    launch = root / "etc" / "unit.service"
    assert run_helper(payload(state, [change(patch, b"p\n", None), change(launch, b"l2\n", b"[Service]\n")],
                              run_id="r1"))["status"] == "finished"
    patch.parent.chmod(0o750)
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    before_r3 = tree_hashes(root)
    done = run_helper(recompose_payload(state, [change(launch, b"l4\n", b"l3\n")], "r3", "r1", [patch]))
    assert done["status"] == "finished", done
    assert run_helper(payload(state, [change(launch, b"l5\n", b"l4\n")], run_id="r4"))["status"] == "finished"
    done = run_helper(recompose_payload(state, [change(launch, b"l3\n", b"l5\n")], "r5", "r3", [patch]))
    assert done["status"] == "finished", done
    assert tree_hashes(root) == before_r3


def test_a_recomposition_deleting_files_in_sibling_directories_takes_their_common_parent_and_brings_it_back(
        tmp_path: Path) -> None:
    """r1 creates p/x/a.py (making p and p/x) and p/y/b.py (making p/y): p is named by the first
    entry only. The recomposition deletes both in the payload's order: p must go too (it is empty
    once both are gone), and undoing the recomposition must make p before p/y."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    first, second = root / "etc" / "p" / "x" / "a.py", root / "etc" / "p" / "y" / "b.py"
    launch = root / "etc" / "unit.service"
    before = tree_hashes(root)
    assert run_helper(payload(state, [change(first, b"a\n", None), change(second, b"b\n", None),
                                      change(launch, b"l2\n", b"[Service]\n")], run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    after_r2 = tree_hashes(root)
    done = run_helper(recompose_payload(state, [change(launch, b"l4\n", b"l3\n")], "r3", "r1", [first, second]))
    assert done["status"] == "finished", done
    assert "kept_dirs" not in done, done
    assert {k: v for k, v in tree_hashes(root).items() if k != "etc/unit.service"} == \
        {k: v for k, v in before.items() if k != "etc/unit.service"}
    undo = rollback(state, "r4", "r3")
    assert undo["ok"], undo
    assert tree_hashes(root) == after_r2


def test_a_rollback_killed_after_taking_the_directories_is_recovered_with_them_back(tmp_path: Path) -> None:
    """gpuops rollback of r1 has deleted its files and removed their directories (a shared parent
    too) when its worker is killed: the recovery puts r1 back, directories first (modes kept);
    the next rollback then leaves the tree as before r1."""
    root, state = host_root(tmp_path), lab_state(tmp_path)
    first, second = root / "etc" / "p" / "x" / "a.py", root / "etc" / "p" / "y" / "b.py"
    before = tree_hashes(root)
    assert run_helper(payload(state, [change(first, b"a\n", None), change(second, b"b\n", None)]))["status"] == "finished"
    (root / "etc" / "p").chmod(0o711)
    after_apply = tree_hashes(root)
    (state / "lab-fault.json").write_text(json.dumps({"pause_at": "rollback_restore", "seconds": 120}))
    earlier = _calls(state)
    answer: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: answer.update(run_helper(dict(ROLLBACK, state_dir=str(state), run_id="r2",
                                                                           target="r1"), lease_s=30)))
    runner.start()
    try:
        worker = _paused_worker(state, "rollback_restore", earlier, time.monotonic() + 60)
        assert not (root / "etc" / "p").exists()  # all taken: then the OOM killer
        os.kill(worker["pid"], signal.SIGKILL)
    finally:
        runner.join(timeout=120)
    assert answer.get("ok") is not True, answer
    assert tree_hashes(root) == after_apply
    assert rollback(state, "r3", "r1")["ok"]
    assert tree_hashes(root) == before
