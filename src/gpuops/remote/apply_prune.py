"""What the host keeps of past runs and calls: the backups of the newest runs, the newest call folders.

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import os
import shutil

from gpuops.remote.apply_journal import TERMINAL_EVENTS, read_journal, runs_by_id
from gpuops.remote.host_protocol import FINISHED, KIND_ROLLBACK

DEFAULT_KEEP_RUNS = 20
KEEP_CALLS = 20


def prune_runs(state_dir, keep, notes):
    """Keep the backups of the newest ``keep`` runs (never the newest finished one, never an
    unfinished one); older run folders go."""
    runs_dir = os.path.join(state_dir, "runs")
    try:
        present = set(os.listdir(runs_dir))
    except OSError:
        return
    ordered = [r for r in runs_by_id(read_journal(state_dir)) if r["run_id"] in present]
    keep_ids = {r["run_id"] for r in ordered[-max(keep, 1):]}
    finished = [r["run_id"] for r in ordered if FINISHED in r["events"] and r.get("kind") != KIND_ROLLBACK]
    if finished:
        keep_ids.add(finished[-1])
    keep_ids.update(r["run_id"] for r in ordered if not any(e in TERMINAL_EVENTS for e in r["events"]))
    known = {r["run_id"] for r in ordered}
    removed = 0
    for name in sorted(present):
        if name in keep_ids or name not in known:
            continue  # a folder the journal does not know is not ours to judge
        shutil.rmtree(os.path.join(runs_dir, name), ignore_errors=True)
        removed += 1
    if removed:
        notes.append("pruned the backups of %d old run(s) (gpuops_keep_runs=%d)" % (removed, keep))


def prune_calls(state_dir):
    calls = os.path.join(state_dir, "calls")
    try:
        names = sorted(os.listdir(calls))
    except OSError:
        return
    for name in names[:-KEEP_CALLS]:
        shutil.rmtree(os.path.join(calls, name), ignore_errors=True)
