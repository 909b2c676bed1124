"""The apply host protocol has one schema (``gpuops.remote.host_protocol``): every event, journal
event, client message and result status that either side's code spells out is one it names, and
the home journal's run records come from one writer (``apply/journal.record_run_home``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import gpuops
from gpuops.remote import host_protocol as hp

SRC = Path(gpuops.__file__).parent
HOST_SIDE = sorted((SRC / "remote").glob("apply*.py")) + [SRC / "remote" / "container_image.py",
                                                         SRC / "remote" / "recompose.py"]
CLIENT_SIDE = [SRC / "apply" / "txn.py"]


def _found(pattern: str, paths: list[Path]) -> set[str]:
    return {m for p in paths for m in re.findall(pattern, p.read_text(encoding="utf-8"))}


def _named(pattern: str, paths: list[Path]) -> set[str]:
    """What the host_protocol constants matched by ``pattern`` (its group: a NAME) stand for; a
    name host_protocol lacks is kept as is (so it shows up as not in the schema)."""
    return {getattr(hp, name, name) for name in _found(pattern, paths)}


def test_every_progress_event_either_side_names_is_in_the_schema() -> None:
    # test_protocol_constants holds every side to the constants; these are what they stand for.
    spelled = _named(r'"event": ([A-Z_]+)\b', HOST_SIDE) | _named(r'event == ([A-Z_]+)\b', CLIENT_SIDE)
    assert spelled and spelled <= set(hp.PROGRESS_EVENTS), spelled - set(hp.PROGRESS_EVENTS)


def test_every_journal_event_the_host_writes_is_in_the_schema() -> None:
    written = _named(r'\bevent\(([A-Z_]+)\b', HOST_SIDE)
    assert {hp.STARTED, hp.FINISHED, hp.ROLLED_BACK} <= written <= set(hp.JOURNAL_EVENTS), written


def test_every_client_message_is_in_the_schema() -> None:
    sent = _found(r"""stream\.send\(\(?(?:json\.dumps\()?b?'?\{["']([a-z]+)["']""", CLIENT_SIDE)
    awaited = _found(r'wait_message\("([a-z_]+)"', HOST_SIDE)
    assert {"hb", "verdict", "commit"} <= sent | awaited
    assert (sent | awaited) <= set(hp.CLIENT_MESSAGES), (sent | awaited) - set(hp.CLIENT_MESSAGES)


def test_every_result_status_the_host_returns_is_in_the_schema() -> None:
    returned = _named(r'"status": ([A-Z_]+)\b', HOST_SIDE)
    assert returned and returned <= set(hp.RESULT_STATUSES), returned - set(hp.RESULT_STATUSES)
    client = _named(r'"status": ([A-Z_]+)\b', CLIENT_SIDE)
    assert client <= set(hp.RESULT_STATUSES), client


def test_the_journal_reader_closes_runs_by_the_schemas_terminal_events() -> None:
    from gpuops.remote.apply_journal import TERMINAL_EVENTS

    assert TERMINAL_EVENTS is hp.TERMINAL_EVENTS


def test_apply_and_rollback_records_at_home_come_from_one_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuops.apply.journal import home_journal_path, record_run_home

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    record_run_home("r1", "h1", "10.0.0.1:22", "nccl-env", hp.STATUS_FINISHED, None, "/var/lib/gpuops",
                    [{"path": "/etc/x"}], user="me", vars_sha256="ab")
    record_run_home("r2", "h1", "10.0.0.1:22", "rollback", hp.STATUS_ROLLED_BACK, "why", "/var/lib/gpuops", [],
                    target="r1")
    first, second = [json.loads(line) for line in home_journal_path().read_text().splitlines()]
    common = {"run_id", "host", "address", "role", "time", "outcome", "error", "state_dir", "changes"}
    assert common <= set(first) and common <= set(second)
    assert (first["user"], second["target"], second["outcome"]) == ("me", "r1", "rolled_back")
    # no other module writes a run record by hand
    by_hand = [p.name for p in (SRC / "apply").glob("*.py") if p.name != "journal.py"
               and re.search(r"append_home\(\{", p.read_text(encoding="utf-8"))]
    assert by_hand == []


def test_the_helper_result_is_read_typed_and_as_untrusted_data() -> None:
    """apply/ reads the helper's answer through ``HelperResult`` only: known statuses pass, anything
    else is ``failed`` naming what came; a field of the wrong type reads as absent."""
    good = hp.HelperResult.from_json({"ok": True, "status": "finished", "run_id": "r1", "pid": 42,
                                      "restored": ["/etc/a"], "notes": ["n"], "records": [{"event": "started"}, 3]})
    assert (good.status, good.ok, good.run_id, good.pid, good.restored, good.notes, good.records) == \
        (hp.STATUS_FINISHED, True, "r1", 42, ("/etc/a",), ("n",), ({"event": "started"},))
    odd = hp.HelperResult.from_json({"ok": "yes", "status": "exploded", "pid": True, "restored": "/etc/a",
                                     "error": ["x"], "busy": 1})
    assert (odd.status, odd.ok, odd.pid, odd.restored, odd.busy) == (hp.STATUS_FAILED, False, None, (), False)
    assert odd.error == "the helper ended with status 'exploded'"
    assert hp.HelperResult.from_json([1]).status == hp.STATUS_FAILED
    assert hp.HelperResult.from_json({"status": "rolled_back", "error": "why"}) == \
        hp.HelperResult(hp.STATUS_ROLLED_BACK, error="why")
    # apply/ reads no helper result as a dict any more, but where it comes off the channel
    # (txn.py) and is turned into a HelperResult (remote_exec.py)
    by_dict = [p.name for p in (SRC / "apply").glob("*.py") if p.name not in ("txn.py", "remote_exec.py")
               if re.search(r'result\.get\("(status|ok|restored|recovered|notes|error)"', p.read_text(encoding="utf-8"))]
    assert by_dict == []


def test_progress_events_are_read_typed_bounded_and_as_untrusted_data() -> None:
    """The client reads the helper's progress lines through ``HostEvent`` only: a name outside the
    schema is no event; a field of the wrong type reads as absent; text is cut to its bound."""
    event = hp.HostEvent.from_json({"event": "verified", "pid": 42, "log": "ready\n", "run_id": "r1"})
    assert event == hp.HostEvent(hp.EVENT_VERIFIED, run_id="r1", pid=42, log="ready\n")
    assert hp.HostEvent.from_json({"event": "phase", "phase": "after_writes"}).phase == "after_writes"  # type: ignore[union-attr]
    for not_one in ({"event": "exploded"}, {"event": 3}, {"phase": "x"}, ["verified"], "verified"):
        assert hp.HostEvent.from_json(not_one) is None, not_one
    odd = hp.HostEvent.from_json({"event": "rolled_back", "run_id": ["r1"], "why": 7, "pid": True, "log": {},
                                  "deployment": "d", "note": None})
    assert odd == hp.HostEvent(hp.EVENT_ROLLED_BACK)
    long = hp.HostEvent.from_json({"event": "recovered", "note": "n" * 100_000, "phase": "p" * 100_000,
                                   "run_id": "r" * 100_000, "deployment": {"name": "d"}})
    assert long is not None and len(long.note or "") == 4096 and len(long.phase or "") == 200
    assert len(long.run_id or "") == 200 and long.deployment == {"name": "d"}
    # apply/ reads no progress event as a dict: the channel's lines become HostEvents in txn.py
    by_dict = [p.name for p in (SRC / "apply").glob("*.py")
               if re.search(r'(event|message)\.get\("(event|phase|note|why|run_id|log|deployment|audit_output)"',
                            p.read_text(encoding="utf-8"))]
    assert by_dict == []
