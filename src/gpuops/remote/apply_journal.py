"""The host's journal of apply runs (``STATE/journal.jsonl``): the one schema both sides read.

A run is a sequence of JSON lines with the same ``run_id``, each an ``event`` with its ``time``:
``started`` (role, user, client, changes, manifest_sha256, managed_roots, ...), ``server_touched``,
then one of ``TERMINAL_EVENTS``, or ``rollback_failed`` (the run stays open: the next command tries
again). A rollback is a run of its own (``kind: rollback``, ``target``: the run it undid).
``reverted_by_rollback`` is not written by this version; journals that have it are still read as closed.

Stdlib only, Python 3.8+: bundled with ``apply_helper`` for the host, and imported by the client
(``gpuops.apply.journal``) so that host and home agree on when a run has ended.
"""

import json
import os

from gpuops.remote.host_protocol import TERMINAL_EVENTS  # the schema lives in host_protocol
from gpuops.remote.host_protocol import STARTED

JOURNAL_FILE = "journal.jsonl"


def read_journal(state_dir, warnings=None):
    """The journal's records; torn or non-object lines are skipped (and named in ``warnings``)."""
    path = os.path.join(state_dir, JOURNAL_FILE)
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return journal_records(handle, path, warnings)
    except FileNotFoundError:
        return []


def journal_records(lines, where=JOURNAL_FILE, warnings=None):
    """The run records among journal ``lines`` (read here on the host, or sent home by the client's
    probe): a torn line, or one that is not an object with a string ``run_id``, is skipped (and named
    in ``warnings``), the same on both sides."""
    records = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
            if warnings is not None:
                warnings.append("journal line %d of %s is not a run record; skipped" % (number, where))
            continue
        records.append(record)
    return records


def runs_by_id(records):
    """Fold journal events into one dict per run, in order of first appearance."""
    runs = {}
    for record in records:
        run = runs.setdefault(record.get("run_id"), {"run_id": record.get("run_id"), "events": []})
        run["events"].append(record.get("event"))
        for key, value in record.items():
            if key not in ("event", "time"):
                run.setdefault(key, value)
        run["last_event"] = record.get("event")
        run["last_time"] = record.get("time")
        if record.get("event") == STARTED:
            run["started"] = record.get("time")
        if record.get("error"):
            run["error"] = record.get("error")
    return list(runs.values())


def unfinished_runs(records):
    return [run for run in runs_by_id(records)
            if STARTED in run["events"] and not any(e in TERMINAL_EVENTS for e in run["events"])]
