"""The helper exec apply, rollback and history make on a host (the transaction's one exec).

Become is not done here: the connection runs every command through sudo when the host asks for it
(``gpuops.transport.become``), this exec included.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping
from gpuops import timings
from gpuops.apply.txn import lease_seconds, number_var, run_transaction
from gpuops.errors import TransportError
from gpuops.facts.python_select import preamble_for_vars
from gpuops.shipping import python_command, python_stdin
from gpuops.remote.apply_journal import JOURNAL_FILE, journal_records, runs_by_id
from gpuops.remote.host_protocol import HelperResult, MODE_APPLY
from gpuops.transport import verbose

if TYPE_CHECKING:
    from gpuops.remote.host_protocol import HelperResult, HostEvent
    from gpuops.transport import Connection


def _helper_command(variables: Mapping[str, Any], with_preamble: bool, state_dir: str | None = None) -> str:
    python = variables.get("gpuops_python")
    # The helper keeps its compiled modules in gpuops' state dir on the host (shipping/bundle.py).
    bytecode_dir = f"{state_dir.rstrip('/')}/bytecode" if state_dir else None
    command = python_command(str(python) if python else None, stream=True, bytecode_dir=bytecode_dir)
    if with_preamble:
        # The re-audit must see the packages the server sees: the gather preamble picks that python.

        command = "/bin/sh -c " + shlex.quote(preamble_for_vars(dict(variables)) + "\n" + command)
    return command


def run_helper(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any],
               with_preamble: bool = False, deadline: float | None = None,
               on_audit: Callable[[Any], tuple[bool, str]] | None = None,
               on_event: Callable[["HostEvent"], None] | None = None,
               on_verified: Callable[[], tuple[bool, str | None]] | None = None,
               on_open: Callable[[Callable[[dict[str, Any]], bool]], None] | None = None,
               on_hold: Callable[[str], tuple[bool, str | None]] | None = None) -> "HelperResult":
    """Ship apply_helper + payload in ONE exec and hold its transaction to the end (see apply.txn).

    Returns the helper's result, typed (``host_protocol.HelperResult``), status ``unknown`` when
    the outcome could not be learnt (per-host deadline, connection lost)."""

    lease_s = lease_seconds(variables)
    remaining = None if deadline is None else max(1.0, deadline - time.monotonic())
    payload = dict(payload, lease_s=lease_s, deadline_s=remaining, keep_runs=keep_runs(variables))
    command = _helper_command(variables, with_preamble, payload.get("state_dir"))
    body = python_stdin("apply_helper", payload, stream=True)

    started = time.monotonic()
    with timings.span("exec", conn.host.name):  # the transaction's exec, on a channel of its own
        result = run_transaction(conn, command, body, lease_s, deadline, payload.get("run_id"), on_audit, on_event,
                                 on_verified, read_outcome=journal_reader(conn, payload), on_open=on_open,
                                 on_hold=on_hold, mode=str(payload.get("mode") or MODE_APPLY))
    if verbose.enabled():
        verbose.log_stream(conn.host.name, command, len(body), time.monotonic() - started, str(result.get("status")))
    return HelperResult.from_json(result)


def journal_reader(conn: "Connection", payload: Mapping[str, Any]) -> Callable[[], Mapping[str, Any] | None]:
    """Reads the host's journal for this run (its last lines), over the connection or, when that
    is gone, a new one: how a lost answer is replaced by what the host itself recorded."""

    run_id = payload.get("run_id")
    command = "tail -n 400 " + shlex.quote(str(payload["state_dir"]).rstrip("/") + "/" + JOURNAL_FILE)

    def read() -> Mapping[str, Any] | None:
        try:
            done = conn.run(command, timeout=30)
        except TransportError:
            from gpuops.transport import ConnectOptions, connect

            # A connection of its own, without the run's --timeout deadline: past it, this read is
            # what says the outcome (txn bounds it by DEADLINE_GRACE_S).
            options = getattr(conn, "options", None) or ConnectOptions()
            fresh = connect(conn.host, dataclasses.replace(options, deadline=None))
            try:
                done = fresh.run(command, timeout=30)
            finally:
                fresh.close()
        runs = runs_by_id(journal_records(done.stdout_text().splitlines()))
        return next((run for run in runs if run.get("run_id") == run_id), None)

    return read


def keep_runs(variables: Mapping[str, Any]) -> int:
    """``gpuops_keep_runs`` (default 20): how many runs' backups a host keeps."""

    return int(number_var(variables, "gpuops_keep_runs", 20, int, "a whole number", 1))
