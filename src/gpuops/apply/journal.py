"""The journals: one on each host (written by the helper), one at home (written here).

Both are JSON lines. A run appears as events (`started`, `server_touched`, `finished`, `rolled_back`,
`unchanged`, ...); ``fold_runs`` turns events into one summary per run. Contents and secret
values never enter a journal: paths, hashes, a hash of the variables, the outcome. The host's
journal schema (its file name, which events end a run) is ``gpuops.remote.apply_journal``, the
module the host helper itself runs with: one list of terminal events for both sides.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from gpuops.remote.apply_journal import TERMINAL_EVENTS
from gpuops.remote.host_protocol import FINISHED, KIND_ROLLBACK, STARTED, STATUS_UNKNOWN, UNCHANGED

if TYPE_CHECKING:
    from gpuops.inventory import Host


def home_journal_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpuops" / "journal.jsonl"


def host_key(host: "Host") -> str:
    """Who a home journal record is about: the inventory name alone is not enough (two
    inventories can both call a different machine h01)."""
    return f"{host.user or ''}@{host.address or host.name}:{host.port or 22}"


def record_run_home(run_id: str | None, host: str, address: str | None, role: str, outcome: str,
                    error: str | None, state_dir: str | None, changes: list[dict[str, Any]],
                    **extra: Any) -> None:
    """The one writer of a run's record in the home journal (apply, rollback, recomposition):
    the same keys for every kind, ``extra`` for a kind's own (``target``, ``recompose``, ``user``...)."""
    append_home({"run_id": run_id, "host": host, "address": address, "role": role,
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "outcome": outcome, "error": error,
                 "state_dir": state_dir, "changes": changes, **extra})


def append_home(record: dict[str, Any]) -> None:
    path = home_journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a torn last line (a writer that died mid-line) never swallows this one
        os.write(fd, line)
    finally:
        os.close(fd)


def read_home(warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The home journal's records; a torn or non-object line is skipped (named in ``warnings``)."""
    path = home_journal_path()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if warnings is not None:
                warnings.append(f"{path} line {number} is not a journal record; skipped")
            continue
        out.append(record)
    return out


def reconcile_home(host: str, host_runs: Iterable[dict[str, Any]], address: str | None = None) -> list[str]:
    """Record at home the host's outcome of every run whose outcome this machine never learnt
    (status ``unknown``); returns the run ids reconciled."""
    if not _says_unknown(host, address):
        return []  # no record of this host says "unknown", so no run's latest one does
    latest: dict[str, str] = {}
    for record in read_home():
        if record.get("host") == host and record.get("address") == address and record.get("run_id"):
            latest[str(record["run_id"])] = str(record.get("outcome"))
    done = []
    for run in host_runs:
        run_id = str(run.get("run_id"))
        outcome = str(run.get("outcome") or "")
        if latest.get(run_id) == STATUS_UNKNOWN and not outcome.startswith("unfinished"):
            append_home({"run_id": run_id, "host": host, "address": address, "role": run.get("role"), "outcome": outcome,
                         "reconciled": True, "changes": run.get("changes") or [], "error": run.get("error")})
            done.append(run_id)
    return done


def _says_unknown(host: str, address: str | None) -> bool:
    """Whether any home record of this host has the outcome "unknown" (rare: a connection lost
    mid-run). The home journal grows by a line every run, and every apply asks: only lines that
    can hold that outcome are parsed, those with the word or with a JSON escape (which could
    spell it, as ``\\u0075nknown``)."""
    try:
        text = home_journal_path().read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        if "unknown" not in line and "\\u" not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (isinstance(record, dict) and record.get("host") == host and record.get("address") == address
                and record.get("run_id") and str(record.get("outcome")) == STATUS_UNKNOWN):
            return True
    return False


def fold_runs(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per run_id, in order: role, who, when, changes, events, outcome."""
    runs: dict[str, dict[str, Any]] = {}
    for record in records:
        run_id = record.get("run_id")
        if not run_id or not isinstance(run_id, str):
            continue
        run = runs.setdefault(run_id, {"run_id": run_id, "events": [], "changes": []})
        event = record.get("event")
        run["events"].append(event)
        for key in ("role", "user", "client", "vars_sha256", "kind", "target", "recompose"):
            if record.get(key) is not None and key not in run:
                run[key] = record[key]
        if record.get("changes"):
            run["changes"] = record["changes"]
        if event in (STARTED, UNCHANGED) or "time" not in run:
            run.setdefault("time", record.get("time"))
        if record.get("error"):
            run["error"] = record["error"]
        run["outcome"] = event
    for run in runs.values():
        if not any(e in TERMINAL_EVENTS for e in run["events"]):
            run["outcome"] = f"unfinished ({run['outcome']})"
        run["changed"] = len(run["changes"])
    _mark_undone(runs)
    return list(runs.values())


def _mark_undone(runs: dict[str, dict[str, Any]]) -> None:
    """``undone_by``: the finished rollback that took a run out of effect. Undoing a rollback by
    recomposition puts the run it had undone back in effect (remote/recompose.py::undone_runs)."""
    for run in runs.values():
        if run.get("kind") != KIND_ROLLBACK or FINISHED not in run["events"]:
            continue
        target = runs.get(str(run.get("target")))
        if target is None:
            continue
        target["undone_by"] = run["run_id"]
        if target.get("recompose"):
            again = runs.get(str(target.get("target")))
            if again is not None:
                again.pop("undone_by", None)
