"""The host-side apply helper, run for real as a subprocess on temp dirs (no SSH, no server)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gpuops.remote
from gpuops.remote import python_command, python_stdin

HELPER = Path(gpuops.remote.__file__).parent / "apply_helper.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_helper(payload: dict[str, Any]) -> dict[str, Any]:
    """Exactly as gpuops ships it: the runner command, helper + payload on stdin."""
    proc = subprocess.run(["/bin/sh", "-c", python_command(sys.executable)],
                          input=python_stdin("apply_helper", payload), capture_output=True, timeout=60)
    lines = [l for l in proc.stdout.decode().splitlines() if l.startswith('{"result"')]
    assert lines, proc.stderr.decode()
    return json.loads(lines[-1])["result"]


def change(path: Path, after: bytes, before: bytes | None, mode: str | None = None) -> dict[str, Any]:
    return {"path": str(path), "after_b64": base64.b64encode(after).decode(),
            "before_sha256": sha(before) if before is not None else None, "after_sha256": sha(after), "mode": mode}


def payload(state: Path, changes: list[dict[str, Any]], run_id: str = "r1", **extra: Any) -> dict[str, Any]:
    base = {"mode": "apply", "run_id": run_id, "state_dir": str(state), "meta": {"role": "test", "user": "me"},
            "changes": changes, "compile": [], "handlers": [], "service": None, "audit": None,
            "process_manager": "", "on_disconnect": "rollback"}
    base.update(extra)
    return base


def journal(state: Path) -> list[dict[str, Any]]:
    return [json.loads(l) for l in (state / "journal.jsonl").read_text().splitlines()]


def test_writes_atomically_with_mode_backs_up_and_journals(tmp_path: Path) -> None:
    state, target, new = tmp_path / "state", tmp_path / "etc" / "a.conf", tmp_path / "etc" / "new.conf"
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
    assert entries[str(new)]["existed"] is False
    assert str(state) in entries[str(target)]["backup"]  # backups live under the state dir only
    events = [r["event"] for r in journal(state)]
    assert events == ["started", "finished"]
    assert "new\n" not in (state / "journal.jsonl").read_text()  # hashes, not contents
    assert not list(target.parent.glob(".*gpuops*"))  # no temp file left behind


def test_refuses_when_the_file_changed_since_the_plan(tmp_path: Path) -> None:
    state, target = tmp_path / "state", tmp_path / "a.conf"
    target.write_bytes(b"someone else\n")
    result = run_helper(payload(state, [change(target, b"new\n", b"old\n")]))
    assert result["ok"] is False and "changed on the host since gpuops planned" in result["error"]
    assert target.read_bytes() == b"someone else\n"
    assert not (state / "journal.jsonl").exists()


def test_injected_failure_restores_every_byte(tmp_path: Path) -> None:
    state, a, b = tmp_path / "state", tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A\x00binary\n")
    result = run_helper(payload(state, [change(a, b"A2\n", b"A\x00binary\n"), change(b, b"B\n", None)],
                                fault="before_write"))
    assert result["status"] == "rolled_back" and "injected fault" in result["error"]
    assert a.read_bytes() == b"A\x00binary\n" and not b.exists()
    assert [r["event"] for r in journal(state)] == ["started", "rolled_back"]


def test_compile_failure_rolls_back(tmp_path: Path) -> None:
    state, mod = tmp_path / "state", tmp_path / "pkg" / "m.py"
    mod.parent.mkdir()
    mod.write_bytes(b"x = 1\n")
    result = run_helper(payload(state, [change(mod, b"x = (\n", b"x = 1\n")],
                                compile=[{"python": sys.executable, "paths": [str(mod)]}]))
    assert result["status"] == "rolled_back" and "do not compile" in result["error"]
    assert mod.read_bytes() == b"x = 1\n"
    assert not (mod.parent / "__pycache__").exists()  # the check never writes into the tree


def test_lock_held_fails_fast(tmp_path: Path) -> None:
    state, a = tmp_path / "state", tmp_path / "a"
    state.mkdir()
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = run_helper(payload(state, [change(a, b"x", None)]))
    finally:
        os.close(fd)
    assert result["status"] == "refused" and "holds the host lock" in result["error"]
    assert not a.exists()


def test_unfinished_run_blocks_apply_until_rolled_back(tmp_path: Path) -> None:
    state, a = tmp_path / "state", tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    # Simulate a run killed after its first change: `started`, backups, a write, no end.
    (state / "runs" / "r2" / "files").mkdir(parents=True)
    (state / "runs" / "r2" / "files" / "000").write_bytes(b"v2\n")
    (state / "runs" / "r2" / "manifest.json").write_text(json.dumps({
        "run_id": "r2", "files": [{"path": str(a), "existed": True, "backup": str(state / "runs/r2/files/000"),
                                   "mode": 0o644, "uid": os.getuid(), "gid": os.getgid(), "sha256": sha(b"v2\n")}],
        "service": None, "handlers": []}))
    with open(state / "journal.jsonl", "a") as handle:
        handle.write(json.dumps({"run_id": "r2", "event": "started", "role": "test", "changes": [{"path": str(a)}]}) + "\n")
    a.write_bytes(b"half-written\n")
    refused = run_helper(payload(state, [change(a, b"v3\n", b"half-written\n")], run_id="r3"))
    assert refused["status"] == "refused" and "gpuops rollback --run r2" in refused["error"]
    undo = run_helper({"mode": "rollback", "run_id": "r4", "state_dir": str(state), "target": None,
                       "meta": {}, "process_manager": ""})
    assert undo["ok"] and undo["target"] == "r2", undo
    assert a.read_bytes() == b"v2\n"
    # Now the most recent run that changed the host is r1: undo it too.
    undo = run_helper({"mode": "rollback", "run_id": "r5", "state_dir": str(state), "target": None,
                       "meta": {}, "process_manager": ""})
    assert undo["ok"] and undo["target"] == "r1"
    assert a.read_bytes() == b"v1\n"
    nothing = run_helper({"mode": "rollback", "run_id": "r6", "state_dir": str(state), "target": None,
                          "meta": {}, "process_manager": ""})
    assert nothing["ok"] is False and "nothing to roll back" in nothing["error"]


def test_no_changes_journals_unchanged(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = run_helper(payload(state, []))
    assert result["status"] == "unchanged"
    assert [r["event"] for r in journal(state)] == ["unchanged"]
    assert not (state / "runs").exists()


FAKE_SUDO = """#!/bin/sh
# A stand-in for sudo: -S reads the password line from stdin only when FAKE_SUDO_ASKS=1 (as a
# NOPASSWD rule would not), checks it, then runs the command after `--`.
while [ "$1" != "--" ]; do
  if [ "$1" = "-S" ] && [ "$FAKE_SUDO_ASKS" = 1 ]; then
    IFS= read -r pw; [ "$pw" = "$FAKE_SUDO_PASSWORD" ] || { echo "sudo: wrong password" >&2; exit 1; }
  fi
  shift
done
shift
exec "$@"
"""


def test_become_password_travels_on_stdin_and_never_becomes_code(tmp_path: Path) -> None:
    from gpuops.apply.runner import become_wrap

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(FAKE_SUDO)
    (bin_dir / "sudo").chmod(0o755)
    state = tmp_path / "state"
    secret = "s3cr3t 'pw' $(touch /tmp/x)"
    for asks in ("1", "0"):  # sudo that asks for the password, and a NOPASSWD rule that does not
        command, prefix = become_wrap(python_command(sys.executable), secret)
        assert secret not in command
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SUDO_ASKS=asks,
                   FAKE_SUDO_PASSWORD=secret)
        proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, timeout=60,
                              input=prefix + python_stdin("apply_helper", payload(state, [], run_id=f"b{asks}")))
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout.decode().splitlines()[-1])["result"]["status"] == "unchanged"
        assert secret not in proc.stdout.decode() + proc.stderr.decode()
    command, prefix = become_wrap("true", None)
    assert command.startswith("sudo -n ") and prefix.count(b"\n") == 1


def test_rollback_of_an_older_run_whose_files_changed_again_is_refused(tmp_path: Path) -> None:
    state, a = tmp_path / "state", tmp_path / "a"
    a.write_bytes(b"v1\n")
    assert run_helper(payload(state, [change(a, b"v2\n", b"v1\n")], run_id="r1"))["status"] == "finished"
    assert run_helper(payload(state, [change(a, b"v3\n", b"v2\n")], run_id="r2"))["status"] == "finished"
    rollback = {"mode": "rollback", "state_dir": str(state), "meta": {}, "process_manager": ""}
    refused = run_helper(dict(rollback, run_id="r3", target="r1"))
    assert refused["ok"] is False and "roll back r2 first" in refused["error"]
    assert a.read_bytes() == b"v3\n"
    assert run_helper(dict(rollback, run_id="r4", target="r2"))["ok"]
    assert run_helper(dict(rollback, run_id="r5", target="r1"))["ok"]
    assert a.read_bytes() == b"v1\n"
