"""The host-side apply helper, run for real as a subprocess on temp dirs (no SSH, no server).

It is driven exactly as gpuops drives it: the stream runner, helper + payload on stdin, then the
client's own transaction code (``gpuops.apply.txn``: heartbeats, verdict, commit) over a local
connection. The state dirs sit in a fake lab (``lab/h/state`` with ``lab/.gpuops-lab``) and the lab's
fault hooks (``gpuops/lab/host_faults.py``, as ``gpuops_host_hooks``) are on PYTHONPATH, as on a lab
host, so that the lab fault file can be used; tests show it is ignored anywhere else, and that
without the hooks the product never reads it.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from labtools import fake_sudo_bin

import gpuops.remote
from gpuops.shipping import python_command, python_stdin

HELPER = Path(gpuops.remote.__file__).parent / "apply_helper.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lab_hooks(monkeypatch, directory: Path) -> None:
    """What a lab host's sessions carry: GPUOPS_LAB_HOST, and the lab's fault hooks on PYTHONPATH."""
    from gpuops.lab import host_faults

    host_faults.install(directory)
    monkeypatch.setenv("GPUOPS_LAB_HOST", "h")
    monkeypatch.setenv("PYTHONPATH", str(directory))


@pytest.fixture(autouse=True)
def lab_session(monkeypatch, tmp_path_factory) -> None:
    lab_hooks(monkeypatch, tmp_path_factory.mktemp("lab-site"))


def lab_state(tmp_path: Path) -> Path:
    (tmp_path / "lab").mkdir(exist_ok=True)
    (tmp_path / "lab" / ".gpuops-lab").write_text("lab\n")
    return tmp_path / "lab" / "h" / "state"


def run_helper(payload: dict[str, Any], verdict: bool = True, lease_s: float = 5.0) -> dict[str, Any]:
    """Exactly as gpuops ships and drives it (stream runner, heartbeats, verdict, commit)."""
    from gpuops.apply.txn import run_transaction
    from gpuops.inventory import Host
    from gpuops.transport.local import LocalConnection

    payload = dict(payload, lease_s=lease_s)
    conn = LocalConnection(Host(name="h", address=None, port=None, user=None, key_file=None, groups=(), connection="local"))
    body = python_stdin("apply_helper", payload, stream=True)
    return run_transaction(conn, python_command(sys.executable, stream=True), body, lease_s,
                           time.monotonic() + 120, payload["run_id"], lambda out: (verdict, "judged"))


def change(path: Path, after: bytes, before: bytes | None, mode: str | None = None) -> dict[str, Any]:
    return {"path": str(path), "after_b64": base64.b64encode(after).decode(),
            "before_sha256": sha(before) if before is not None else None, "after_sha256": sha(after), "mode": mode}


def payload(state: Path, changes: list[dict[str, Any]], run_id: str = "r1", **extra: Any) -> dict[str, Any]:
    base = {"mode": "apply", "run_id": run_id, "state_dir": str(state), "meta": {"role": "test", "user": "me"},
            "changes": changes, "compile": [], "handlers": [], "service": None, "audit": None}
    base.update(extra)
    return base


def journal(state: Path) -> list[dict[str, Any]]:
    return [json.loads(l) for l in (state / "journal.jsonl").read_text().splitlines()]


def test_writes_atomically_with_mode_backs_up_and_journals(tmp_path: Path) -> None:
    state, target, new = lab_state(tmp_path), tmp_path / "etc" / "a.conf", tmp_path / "etc" / "new.conf"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    result = run_helper(payload(state, [change(target, b"new\n", b"old\n"), change(new, b"x\n", None, "0600")]))
    assert result["status"] == "finished", result
    assert target.read_bytes() == b"new\n" and oct(target.stat().st_mode & 0o777) == "0o640"  # mode kept
    assert new.read_bytes() == b"x\n" and oct(new.stat().st_mode & 0o777) == "0o600"
    manifest = json.loads((state / "runs" / "r1" / "manifest.json").read_text())
    entries = {e["path"]: e for e in manifest["files"]}
    assert Path(entries[str(target)]["backup"]).read_bytes() == b"old\n"
    assert oct(Path(entries[str(target)]["backup"]).stat().st_mode & 0o777) == "0o640"  # the backup keeps the mode
    assert entries[str(new)]["existed"] is False
    assert str(state) in entries[str(target)]["backup"]  # backups live under the state dir only
    events = [r["event"] for r in journal(state)]
    assert events == ["started", "finished"]
    assert not list(state.glob("calls/*/result.json")) or all(
        json.loads(p.read_text())["run_id"] == "r1" for p in state.glob("calls/*/result.json"))
    assert "new\n" not in (state / "journal.jsonl").read_text()  # hashes, not contents
    assert not list(target.parent.glob(".*gpuops*"))  # no temp file left behind


def test_refuses_when_the_file_changed_since_the_plan(tmp_path: Path) -> None:
    state, target = lab_state(tmp_path), tmp_path / "a.conf"
    target.write_bytes(b"someone else\n")
    result = run_helper(payload(state, [change(target, b"new\n", b"old\n")]))
    assert result["ok"] is False and "changed on the host since gpuops planned" in result["error"]
    assert target.read_bytes() == b"someone else\n"
    assert not (state / "journal.jsonl").exists()


def test_lab_fault_restores_every_byte(tmp_path: Path) -> None:
    state, a, b = lab_state(tmp_path), tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A\x00binary\n")
    state.mkdir(parents=True)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    result = run_helper(payload(state, [change(a, b"A2\n", b"A\x00binary\n"), change(b, b"B\n", None)]))
    assert result["status"] == "rolled_back" and "injected fault" in result["error"]
    assert a.read_bytes() == b"A\x00binary\n" and not b.exists()
    assert [r["event"] for r in journal(state)] == ["started", "rolled_back"]
    assert not (state / "lab-fault.json").exists()  # read once


def test_the_fault_file_is_ignored_off_a_lab_host(tmp_path: Path, monkeypatch) -> None:
    state, a = tmp_path / "state", tmp_path / "a"  # no lab marker above this state dir
    state.mkdir()
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    assert run_helper(payload(state, [change(a, b"x\n", None)]))["status"] == "finished"
    monkeypatch.delenv("GPUOPS_LAB_HOST")  # a lab dir, but not a lab session: ignored too
    state2, b = lab_state(tmp_path), tmp_path / "b"
    state2.mkdir(parents=True)
    (state2 / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    assert run_helper(payload(state2, [change(b, b"x\n", None)]))["status"] == "finished"


def test_without_the_labs_hooks_on_the_path_the_product_reads_no_fault_file(tmp_path: Path, monkeypatch) -> None:
    # A lab session and a lab dir, but no gpuops_host_hooks importable: the helper itself never
    # looks at the fault file (the injection lives in gpuops/lab/host_faults.py, not in the product).
    monkeypatch.delenv("PYTHONPATH")
    state, a = lab_state(tmp_path), tmp_path / "a"
    state.mkdir(parents=True)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    assert run_helper(payload(state, [change(a, b"x\n", None)]))["status"] == "finished"
    assert (state / "lab-fault.json").exists()  # not even read


def test_a_failed_verdict_rolls_back(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    result = run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], audit={"sh": "echo scan"}), verdict=False)
    assert result["status"] == "rolled_back" and result["error"] == "judged", result
    assert a.read_bytes() == b"v1\n"


def test_compile_failure_rolls_back(tmp_path: Path) -> None:
    state, mod = lab_state(tmp_path), tmp_path / "pkg" / "m.py"
    mod.parent.mkdir()
    mod.write_bytes(b"x = 1\n")
    result = run_helper(payload(state, [change(mod, b"x = (\n", b"x = 1\n")],
                                compile=[{"python": sys.executable, "paths": [str(mod)]}]))
    assert result["status"] == "rolled_back" and "do not compile" in result["error"]
    assert mod.read_bytes() == b"x = 1\n"
    assert not (mod.parent / "__pycache__").exists()  # the check never writes into the tree


def test_lock_held_fails_fast(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    state.mkdir(parents=True)
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = run_helper(payload(state, [change(a, b"x", None)]))
    finally:
        os.close(fd)
    assert result["status"] == "refused" and "holds the host lock" in result["error"]
    assert not a.exists()


def _dead_run(state: Path, a: Path, run_id: str, backup: bytes, kind: str | None = None) -> None:
    """What a worker killed after its first write leaves: backups, `started`, a write, no end."""
    (state / "runs" / run_id / "files").mkdir(parents=True)
    (state / "runs" / run_id / "files" / "000").write_bytes(backup)
    (state / "runs" / run_id / "manifest.json").write_text(json.dumps({
        "run_id": run_id, "files": [{"path": str(a), "existed": True, "backup": str(state / "runs" / run_id / "files/000"),
                                     "mode": 0o644, "uid": os.getuid(), "gid": os.getgid(), "sha256": sha(backup)}],
        "service": None, "handlers": []}))
    record = {"run_id": run_id, "event": "started", "role": "test", "changes": [{"path": str(a)}]}
    if kind:
        record.update(kind=kind, target="r1")
    with open(state / "journal.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")
    a.write_bytes(b"half-written\n")


def test_a_dead_run_is_rolled_back_first_by_the_next_apply(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    _dead_run(state, a, "r2", b"v2\n")
    # The plan was made against what the host will be once r2 is rolled back.
    result = run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r3"))
    assert result["status"] == "finished", result
    assert any("run r2" in line and "rolled back first" in line for line in result["recovered"]), result
    assert a.read_bytes() == b"v3\n"
    events = [(r["run_id"], r["event"]) for r in journal(state)]
    assert ("r2", "rolled_back") in events and events[-1] == ("r3", "finished")


def test_a_dead_run_whose_backup_is_corrupt_stays_open_and_blocks_until_it_can_be_rolled_back(tmp_path: Path) -> None:
    """Crash recovery against a corrupted backup: nothing is written from it, the next command is
    refused naming the dead run, the run stays open; once the backup is whole again, it recovers."""
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    _dead_run(state, a, "r2", b"v2\n")
    backup = state / "runs" / "r2" / "files" / "000"
    backup.write_bytes(b"v9\n")  # corrupted after the worker died
    refused = run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r3"))
    assert refused["status"] == "refused" and "run r2" in refused["error"] and "damaged" in refused["error"], refused
    assert a.read_bytes() == b"half-written\n"  # neither the bad backup nor r3's change
    events = [(r["run_id"], r["event"]) for r in journal(state)]
    assert ("r2", "rollback_failed") in events and ("r2", "rolled_back") not in events
    assert not any(run_id == "r3" for run_id, _ in events)
    backup.write_bytes(b"v2\n")
    result = run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r4"))
    assert result["status"] == "finished" and any("run r2" in line for line in result["recovered"]), result
    assert a.read_bytes() == b"v3\n"


def test_a_dead_run_whose_previous_server_will_not_start_is_still_closed_with_its_files_back(tmp_path: Path) -> None:
    """Crash recovery where only the server fails (its launch script exits at once): the files are
    put back and the run is closed as rolled back, naming the server problem; not left open forever."""
    state, a, svc = lab_state(tmp_path), tmp_path / "a", tmp_path / "svc"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    _dead_run(state, a, "r2", b"v2\n")
    svc.mkdir()
    (svc / "sglang-launch.sh").write_text("exit 3\n")
    manifest = state / "runs" / "r2" / "manifest.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()),
                                        service={"manager": "process", "state_dir": str(svc), "port": 1, "grace": 1})))
    with open(state / "journal.jsonl", "a") as handle:
        handle.write(json.dumps({"run_id": "r2", "event": "server_touched"}) + "\n")
    result = run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r3"))
    assert result["status"] == "finished", result
    assert any("run r2" in line and "restarting the previous server" in line for line in result["recovered"]), result
    events = [(r["run_id"], r["event"]) for r in journal(state)]
    assert ("r2", "rolled_back") in events and ("r2", "rollback_failed") not in events
    assert a.read_bytes() == b"v3\n"


def test_an_interrupted_rollback_is_never_a_dead_end(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    _dead_run(state, a, "r2", b"v2\n", kind="rollback")  # a rollback of r1 that died half-way
    rollback = {"mode": "rollback", "state_dir": str(state), "meta": {}}
    undo = run_helper(dict(rollback, run_id="r3", target=None))
    assert undo["ok"] and undo["target"] == "r1", undo
    assert any("run r2" in line for line in undo["recovered"])
    assert a.read_bytes() == b"v1\n"
    nothing = run_helper(dict(rollback, run_id="r4", target=None))
    assert nothing["ok"] is False and "nothing to roll back" in nothing["error"]


def test_rollback_refuses_to_destroy_a_later_change_unless_forced(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a.env"
    a.write_bytes(b"A=1\n")
    a.chmod(0o600)
    assert run_helper(payload(state, [change(a, b"A=2\n", b"A=1\n")], run_id="r1"))["status"] == "finished"
    a.write_bytes(b"A=2\nB=by-hand\n")
    rollback = {"mode": "rollback", "state_dir": str(state), "meta": {}}
    refused = run_helper(dict(rollback, run_id="r2", target="r1"))
    assert refused["ok"] is False and str(a) in refused["error"] and "--force" in refused["error"], refused
    assert a.read_bytes() == b"A=2\nB=by-hand\n"
    forced = run_helper(dict(rollback, run_id="r3", target="r1", force=True))
    assert forced["ok"], forced
    assert a.read_bytes() == b"A=1\n" and oct(a.stat().st_mode & 0o777) == "0o600"
    (kept,) = forced["kept"]
    assert Path(kept.split("kept as ")[1].rstrip(")")).read_bytes() == b"A=2\nB=by-hand\n"


def test_a_tampered_manifest_is_refused(tmp_path: Path) -> None:
    state, a, victim = lab_state(tmp_path), tmp_path / "a", tmp_path / "victim"
    a.write_bytes(b"v1\n")
    victim.write_bytes(b"not gpuops'\n")
    assert run_helper(payload(state, [change(a, b"v2\n", None if False else b"v1\n")], run_id="r1"))["ok"]
    manifest_path = state / "runs" / "r1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"].append({"path": str(victim), "existed": False})
    manifest_path.write_text(json.dumps(manifest))
    refused = run_helper({"mode": "rollback", "state_dir": str(state), "meta": {},
                          "run_id": "r2", "target": "r1"})
    assert refused["ok"] is False and refused["error"].startswith("tampering"), refused
    assert victim.read_bytes() == b"not gpuops'\n" and a.read_bytes() == b"v2\n"


def test_torn_and_foreign_journal_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["ok"]
    with open(state / "journal.jsonl", "a") as handle:
        handle.write('[1, 2]\n"text"\n{"run_id": "r9", "event": "sta')  # foreign lines, then a torn one
    result = run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r2"))
    assert result["status"] == "finished", result
    assert sum("not a run record" in n for n in result["notes"]) >= 2
    lines = (state / "journal.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "finished"      # never glued onto the torn line
    assert any(l.startswith('{"run_id": "r9"') and not l.endswith("}") for l in lines)
    history = run_helper({"mode": "journal", "state_dir": str(state), "run_id": "h1", "meta": {}})
    assert [r["event"] for r in history["records"] if r["run_id"] == "r2"] == ["started", "finished"]


def test_old_run_folders_are_pruned_but_never_the_newest_finished(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"0\n")
    for n in range(1, 5):
        result = run_helper(payload(state, [change(a, b"%d\n" % n, b"%d\n" % (n - 1))], run_id=f"r{n}", keep_runs=2))
        assert result["status"] == "finished"
    assert sorted(p.name for p in (state / "runs").iterdir()) == ["r3", "r4"]
    assert any("pruned" in n for n in result["notes"])


def test_no_changes_journals_unchanged(tmp_path: Path) -> None:
    state = lab_state(tmp_path)
    result = run_helper(payload(state, []))
    assert result["status"] == "unchanged"
    assert [r["event"] for r in journal(state)] == ["unchanged"]
    assert not (state / "runs").exists()




def test_become_password_travels_on_stdin_and_never_becomes_code(tmp_path: Path) -> None:
    from gpuops.transport.become import become_wrap

    bin_dir = fake_sudo_bin(tmp_path)
    state = tmp_path / "state"
    secret = "s3cr3t 'pw' $(touch /tmp/x)"
    for asks in ("1", "0"):  # sudo that asks for the password, and a NOPASSWD rule that does not
        command, prefix = become_wrap(python_command(sys.executable, stream=True), secret)
        assert secret not in command
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SUDO_ASKS=asks,
                   FAKE_SUDO_PASSWORD=secret)
        proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, timeout=60,
                              input=prefix + python_stdin("apply_helper", payload(state, [], run_id=f"b{asks}"), stream=True))
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout.decode().splitlines()[-1])["result"]["status"] == "unchanged"
        assert secret not in proc.stdout.decode() + proc.stderr.decode()
    command, prefix = become_wrap("true", None)
    assert command.startswith("sudo -n ") and prefix.count(b"\n") == 1


def test_refusal_of_an_older_rollback_names_every_later_run_newest_first(tmp_path: Path) -> None:
    """r2 overlaps r1, r3 overlaps only r2, r4 touches an unrelated file: r3 and r2 must go first, not r4.

    Restoring r1's backups would destroy r2's and r3's changes, and these files are not launch files
    that gpuops could recompose (a later patch of a file an older run patched): refused, as before."""
    state, a, b, c = lab_state(tmp_path), tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for f in (a, b, c):
        f.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(a, b"v3\n", b"v2\n"), change(b, b"v2\n", b"v1\n")],
                              run_id="r2"))["status"] == "finished"
    assert run_helper(payload(state, [change(b, b"v3\n", b"v2\n")], run_id="r3"))["status"] == "finished"
    assert run_helper(payload(state, [change(c, b"v2\n", b"v1\n")], run_id="r4"))["status"] == "finished"
    refused = run_helper({"mode": "rollback", "state_dir": str(state), "meta": {},
                          "run_id": "r5", "target": "r1"})
    assert refused["ok"] is False
    assert "run gpuops rollback --run r3; gpuops rollback --run r2; then gpuops rollback --run r1" in refused["error"]
    assert "r4" not in refused["error"] and "re-apply" in refused["error"] and "cannot be recomposed" in refused["error"]
    assert (a.read_bytes(), b.read_bytes(), c.read_bytes()) == (b"v3\n", b"v3\n", b"v2\n")


def test_rollback_of_an_older_run_whose_files_changed_again_is_refused(tmp_path: Path) -> None:
    state, a = lab_state(tmp_path), tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r2"))["status"] == "finished"
    rollback = {"mode": "rollback", "state_dir": str(state), "meta": {}}
    refused = run_helper(dict(rollback, run_id="r3", target="r1"))
    assert refused["ok"] is False and "roll back r2 first" in refused["error"]
    assert a.read_bytes() == b"v3\n"
    assert run_helper(dict(rollback, run_id="r4", target="r2"))["ok"]
    assert run_helper(dict(rollback, run_id="r5", target="r1"))["ok"]
    assert a.read_bytes() == b"v1\n"


def recompose_payload(state: Path, changes: list[dict[str, Any]], run_id: str, target: str, restore: list[Path],
                      force: bool = False) -> dict[str, Any]:
    """What gpuops sends to undo an older run by recomposition (apply/recompose.py): the planned
    launch files as changes, the target's other files to restore from its own backups."""
    return payload(state, changes, run_id=run_id,
                   recompose={"target": target, "restore": [str(p) for p in restore], "force": force})


def test_recomposition_undoes_an_older_run_and_is_itself_undoable(tmp_path: Path) -> None:
    """r1 patches a source and writes the launch; r2 rewrites the launch. Undoing r1 by recomposition
    restores the source from r1's backups and writes the launch as planned; r2 stays in effect; the
    recomposition is journaled as a rollback of r1, and undoing it puts r1 back, byte for byte."""
    from gpuops.remote.recompose import runs_in_order, undone_runs

    state, src, launch = lab_state(tmp_path), tmp_path / "src.py", tmp_path / "launch.sh"
    src.write_bytes(b"gate = False\n")
    os.chmod(src, 0o640)
    launch.write_bytes(b"exec server\n")
    assert run_helper(payload(state, [change(src, b"gate = True\n", b"gate = False\n"),
                                      change(launch, b"exec server --fusion\n", b"exec server\n")],
                              run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(launch, b"NCCL=1 exec server --fusion\n", b"exec server --fusion\n")],
                              run_id="r2"))["status"] == "finished"
    done = run_helper(recompose_payload(state, [change(launch, b"NCCL=1 exec server\n", b"NCCL=1 exec server --fusion\n")],
                                        "r3", "r1", [src]))
    assert done["status"] == "finished", done
    assert src.read_bytes() == b"gate = False\n" and oct(src.stat().st_mode & 0o777) == "0o640"
    assert launch.read_bytes() == b"NCCL=1 exec server\n"
    runs = runs_in_order(journal(state))
    r3 = next(r for r in runs if r["run_id"] == "r3")
    assert (r3["kind"], r3["target"], r3["recompose"]) == ("rollback", "r1", True)
    assert undone_runs(runs) == {"r1"}
    # A second undo of r1 is refused: it is not in effect any more.
    again = run_helper(recompose_payload(state, [], "r4", "r1", [src]))
    assert again["status"] == "refused" and "not in effect" in again["error"]
    # The default rollback now undoes r2 (the newest apply still in effect), not the recomposition...
    rollback = {"mode": "rollback", "state_dir": str(state), "meta": {}}
    refused = run_helper(dict(rollback, run_id="r5"))
    assert refused["ok"] is False and "r3" in refused["error"], refused   # r3 rewrote r2's launch since
    # ...and the recomposition itself can be undone: r1's patch and launch are back.
    undo = run_helper(dict(rollback, run_id="r6", target="r3"))
    assert undo["ok"], undo
    assert src.read_bytes() == b"gate = True\n" and launch.read_bytes() == b"NCCL=1 exec server --fusion\n"
    assert undone_runs(runs_in_order(journal(state))) == {"r3"}


def patched_then_relaunched(tmp_path: Path) -> tuple[Path, Path, Path]:
    """r1 patches src.py (v1 -> v2) and writes launch.sh (l1 -> l2); r2 rewrites launch.sh again (l3)."""
    state, src, launch = lab_state(tmp_path), tmp_path / "src.py", tmp_path / "launch.sh"
    src.write_bytes(b"v1\n")
    launch.write_bytes(b"l1\n")
    assert run_helper(payload(state, [change(src, b"v2\n", b"v1\n"), change(launch, b"l2\n", b"l1\n")],
                              run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    return state, src, launch


def test_recomposition_keeps_the_drift_check_and_force(tmp_path: Path) -> None:
    state, src, launch = patched_then_relaunched(tmp_path)
    src.write_bytes(b"hand edit\n")
    planned = [change(launch, b"l4\n", b"l3\n")]
    refused = run_helper(recompose_payload(state, planned, "r3", "r1", [src]))
    assert refused["status"] == "refused" and "changed since run r1 wrote it" in refused["error"]
    assert (src.read_bytes(), launch.read_bytes()) == (b"hand edit\n", b"l3\n")
    forced = run_helper(recompose_payload(state, planned, "r4", "r1", [src], force=True))
    assert forced["status"] == "finished" and forced["kept"], forced
    assert (src.read_bytes(), launch.read_bytes()) == (b"v1\n", b"l4\n")
    kept = forced["kept"][0].split("kept as ")[1].rstrip(")")
    assert Path(kept).read_bytes() == b"hand edit\n"


def test_a_recomposition_that_fails_puts_everything_back(tmp_path: Path) -> None:
    """A fault after the writes: the restored source and the planned launch go back, r1 stays in effect."""
    from gpuops.remote.recompose import runs_in_order, undone_runs

    state, src, launch = patched_then_relaunched(tmp_path)
    (state / "lab-fault.json").write_text(json.dumps({"fail_at": "after_writes"}))
    failed = run_helper(recompose_payload(state, [change(launch, b"l4\n", b"l3\n")], "r3", "r1", [src]))
    assert failed["status"] == "rolled_back", failed
    assert (src.read_bytes(), launch.read_bytes()) == (b"v2\n", b"l3\n")
    assert undone_runs(runs_in_order(journal(state))) == set()


def test_a_recomposition_deletes_what_the_plan_deletes(tmp_path: Path) -> None:
    state, desired, launch = lab_state(tmp_path), tmp_path / "desired.json", tmp_path / "launch.sh"
    launch.write_bytes(b"l1\n")
    assert run_helper(payload(state, [change(desired, b"{}\n", None), change(launch, b"l2\n", b"l1\n")],
                              run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(launch, b"l3\n", b"l2\n")], run_id="r2"))["status"] == "finished"
    gone = {"path": str(desired), "delete": True, "before_sha256": sha(b"{}\n"), "after_sha256": None}
    assert run_helper(recompose_payload(state, [gone, change(launch, b"l4\n", b"l3\n")], "r3", "r1", []))["ok"]
    assert not desired.exists() and launch.read_bytes() == b"l4\n"
    undo = run_helper({"mode": "rollback", "state_dir": str(state), "meta": {},
                       "run_id": "r4", "target": "r3"})
    assert undo["ok"], undo
    assert desired.read_bytes() == b"{}\n" and launch.read_bytes() == b"l3\n"


def test_a_state_dir_that_fills_mid_run_is_reported_as_the_journal_says_naming_enospc(tmp_path: Path) -> None:
    """The state dir fills while the worker waits for gpuops' confirmation: gpuops' commit cannot be
    passed on to the worker (its inbox is in the state dir), so the run rolls back, and its result
    file cannot be written either. What gpuops is told is the journal's outcome (rolled_back, the
    file back), naming ENOSPC and the inbox, never "the worker died" or "rollback_failed" (before:
    rollback_failed, "the host-side worker died ... and so did the worker rolling it back")."""
    import threading

    state = lab_state(tmp_path)
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state)], check=True)
    try:
        target = tmp_path / "a.env"
        target.write_bytes(b"A=1\n")
        (state / "lab-fault.json").write_text(json.dumps({"pause_at": "confirm", "seconds": 3}))
        done: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: done.update(
            result=run_helper(payload(state, [change(target, b"A=2\n", b"A=1\n")]))))
        worker.start()
        deadline = time.monotonic() + 60
        while not any('"paused"' in p.read_text() for p in state.glob("calls/*/progress.jsonl")):
            assert time.monotonic() < deadline, "the worker never paused at confirm"
            time.sleep(0.02)
        free = os.statvfs(state)
        try:
            (state / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize + 8192))
        except OSError:
            pass  # full now
        worker.join(120)
        result = done["result"]
        assert [r["event"] for r in journal(state)][-1] == "rolled_back"
        assert result["status"] == "rolled_back", result
        assert "ENOSPC" in result["error"] and str(state) in result["error"], result["error"]
        assert target.read_bytes() == b"A=1\n"
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_the_helper_exits_cleanly_while_gpuops_keeps_its_stdin_open(tmp_path: Path) -> None:
    """The relay's reader thread is blocked reading gpuops' stdin when the helper ends (the client
    closes its side only after reading the result): CPython's shutdown then aborted on that stream's
    lock ("could not acquire lock for <_io.BufferedReader name='<stdin>'> at interpreter shutdown",
    exit 134) after a good result. Seen once in a whole run; with stdin held open it is every time."""
    state = tmp_path / "state"
    proc = subprocess.Popen(["/bin/sh", "-c", python_command(sys.executable, stream=True)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(python_stdin("apply_helper", payload(state, [], run_id="open"), stream=True))
        proc.stdin.flush()  # and kept open, as gpuops keeps the channel while it reads the result
        result = json.loads(proc.stdout.readline().decode())
        while "result" not in result:
            result = json.loads(proc.stdout.readline().decode())
        assert result["result"]["status"] == "unchanged", result
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
