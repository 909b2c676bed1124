"""The journals: one on each host (written by the helper), one at home (written here).

Both are JSON lines. A run appears as events (`started`, `audited`, `finished`, `rolled_back`,
`unchanged`, ...); ``fold_runs`` turns events into one summary per run. Contents and secret
values never enter a journal: paths, hashes, a hash of the variables, the outcome.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

TERMINAL = ("finished", "rolled_back", "unchanged")


def home_journal_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpuops" / "journal.jsonl"


def append_home(record: dict[str, Any]) -> None:
    path = home_journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_home() -> list[dict[str, Any]]:
    try:
        text = home_journal_path().read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def fold_runs(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per run_id, in order: role, who, when, changes, events, outcome."""
    runs: dict[str, dict[str, Any]] = {}
    for record in records:
        run_id = record.get("run_id")
        if not run_id:
            continue
        run = runs.setdefault(run_id, {"run_id": run_id, "events": [], "changes": []})
        event = record.get("event")
        run["events"].append(event)
        for key in ("role", "user", "client", "vars_sha256", "kind", "target"):
            if record.get(key) is not None and key not in run:
                run[key] = record[key]
        if record.get("changes"):
            run["changes"] = record["changes"]
        if event in ("started", "unchanged") or "time" not in run:
            run.setdefault("time", record.get("time"))
        if record.get("error"):
            run["error"] = record["error"]
        run["outcome"] = event
    for run in runs.values():
        if not any(e in TERMINAL for e in run["events"]):
            run["outcome"] = f"unfinished ({run['outcome']})"
        run["changed"] = len(run["changes"])
    return list(runs.values())
