"""apply/journal.reconcile_home: a run whose outcome this machine never learnt ("unknown") gets the
host's outcome recorded at home, however the home journal spells that record; nothing else is
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.apply import journal

ADDRESS = "gpu@10.0.0.5:22"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = journal.home_journal_path()
    path.parent.mkdir(parents=True)
    return path


def _write(path: Path, records: list[dict], ensure_ascii: bool = True) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records))


def _record(run_id: str, outcome: str, host: str = "h01", address: str = ADDRESS, **extra: object) -> dict:
    return {"run_id": run_id, "host": host, "address": address, "outcome": outcome, **extra}


HOST_RUNS = [{"run_id": "r1", "outcome": "finished", "role": "nccl-env", "changes": []},
             {"run_id": "r2", "outcome": "rolled_back", "role": "nccl-env", "changes": []},
             {"run_id": "r3", "outcome": "unfinished (started)", "role": "nccl-env", "changes": []}]


def test_only_runs_whose_latest_home_record_is_unknown_are_reconciled(home: Path) -> None:
    _write(home, [_record("r1", "unknown"), _record("r2", "unknown"), _record("r2", "rolled_back"),
                  _record("r3", "unknown"), _record("r1", "unknown", host="h02"), _record("r9", "finished")])
    assert journal.reconcile_home("h01", HOST_RUNS, ADDRESS) == ["r1"]  # r2 was learnt since, r3 is not over
    last = journal.read_home()[-1]
    assert last["run_id"] == "r1" and last["outcome"] == "finished" and last["reconciled"]
    assert journal.reconcile_home("h01", HOST_RUNS, ADDRESS) == []  # now learnt


def test_an_unknown_outcome_written_with_json_escapes_is_still_found(home: Path) -> None:
    # What another writer (or a hand edit) may produce: the same JSON, the word escaped.
    line = json.dumps(_record("r1", "unknown", error="lost")).replace('"unknown"', '"\\u0075nknown"')
    assert "unknown" not in line and json.loads(line)["outcome"] == "unknown"
    home.write_text(json.dumps(_record("r0", "finished")) + "\n" + line + "\n")
    assert journal.reconcile_home("h01", HOST_RUNS, ADDRESS) == ["r1"]


def test_other_hosts_unknown_runs_and_torn_lines_change_nothing(home: Path) -> None:
    records = [_record(f"r{i}", "finished") for i in range(50)]
    records += [_record("r1", "unknown", address="gpu@10.0.0.6:22"), _record("r1", "unknown", host="h02")]
    _write(home, records)
    with home.open("a") as fh:
        fh.write('{"run_id": "r1", "host": "h01", "outcome": "unkn\n')  # torn
    before = home.read_bytes()
    assert journal.reconcile_home("h01", HOST_RUNS, ADDRESS) == []
    assert home.read_bytes() == before


def test_no_home_journal_reconciles_nothing(home: Path) -> None:
    assert journal.reconcile_home("h01", HOST_RUNS, ADDRESS) == []
    assert not home.exists()
