"""Finishing dead runs from commands that do not apply anything (``gpuops inspect``).

A run whose host-side worker died (and whose session went with it) stays half-applied until a
gpuops command takes the host lock. apply, rollback and history do that through the helper; inspect
gathers the journal with its facts (one more probe in the same exec) and, only when the journal
shows an unfinished run, makes one helper exec that rolls it back first, then gathers again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from gpuops.remote.host_protocol import MODE_JOURNAL, STATUS_JOURNAL
from gpuops.apply.options import inventory_state_dir
from gpuops.apply.journal import fold_runs
from gpuops.apply.options import current_user, new_run_id
from gpuops.apply.probes import journal_probe

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import Connection

PROBE_NAME = "apply.journal"


def journal_probe_for(host: "Host") -> Any:
    return journal_probe(inventory_state_dir(host))


def has_unfinished(records: Any) -> bool:
    if not isinstance(records, list):
        return False  # the journal could not be read (a ProbeFailure): nothing to act on
    return any(str(r.get("outcome", "")).startswith("unfinished") for r in fold_runs(records))


def recover_host(conn: "Connection", host: "Host") -> list[str]:
    """Roll back the host's dead runs (the helper's journal mode does it first); what it said."""
    # Imported here, not at the top: inspect imports this module for has_unfinished on every run,
    # and the helper's transaction machinery (remote_exec, txn, stream) is needed only when a dead
    # run is found; measured, it was ~8% of inspect's client CPU (issue 40).
    from gpuops.apply.remote_exec import run_helper

    payload = {"mode": MODE_JOURNAL, "run_id": new_run_id(), "state_dir": inventory_state_dir(host),
               "meta": {"role": "inspect", "user": current_user()}}
    result = run_helper(conn, dict(host.vars or {}), payload)
    notes = [f"recovered first: {line}" for line in result.recovered]
    if result.status != STATUS_JOURNAL:
        notes.append(f"an unfinished gpuops run could not be rolled back: {result.error or result.status}")
    elif result.busy:
        notes.append("a gpuops run is in progress on this host (it holds the lock); it ends or rolls back by itself")
    return notes
