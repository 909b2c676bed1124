"""``labtools.progress_records``: the tests' reader of a transaction's progress file parses whole lines
only, as the product's reader does. A whole run once read the gate audit's big line half written and
failed test_apply_faults_fusion's ``paused`` with a JSONDecodeError (and the three tests after it, whose
applies found that run still in progress)."""

from __future__ import annotations

import json
from pathlib import Path

from labtools import progress_records


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    assert progress_records(progress) == []  # not there yet
    whole = json.dumps({"event": "worker", "pid": 7}) + "\n"
    torn = json.dumps({"event": "audit_output", "stdout": "x" * 100})[:60]
    progress.write_text(whole + torn)
    assert progress_records(progress) == [{"event": "worker", "pid": 7}]
    progress.write_text(whole + "\n" + torn + '"}\n')
    assert [r["event"] for r in progress_records(progress)] == ["worker", "audit_output"]
