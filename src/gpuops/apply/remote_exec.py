"""The two kinds of exec apply makes on a host: the gather, and the helper; both under sudo on --become."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gpuops.apply.options import ApplyOptions

if TYPE_CHECKING:
    from gpuops.transport import Connection

BECOME_MARK = "gpuops-become-stdin-starts-here"


def become_wrap(command: str, password: str | None, user: str | None = None) -> tuple[str, bytes]:
    """sudo around ``command``; the password (if any) travels as the first stdin line, never argv.

    sudo reads the password line only when it needs one (NOPASSWD rules skip it), so a marker line
    follows it and the shell skips everything up to the marker: either way the helper's stdin
    starts exactly at its own source, and a password can never end up parsed as code.
    """
    skip = f'while IFS= read -r gpuops_l; do [ "$gpuops_l" = {BECOME_MARK} ] && break; done; {command}'
    as_user = f"-u {shlex.quote(user)} " if user else ""
    if password:
        return f"sudo -S -p '' {as_user}-- /bin/sh -c {shlex.quote(skip)}", (password + "\n" + BECOME_MARK + "\n").encode()
    return f"sudo -n {as_user}-- /bin/sh -c {shlex.quote(skip)}", (BECOME_MARK + "\n").encode()


def _become(variables: Mapping[str, Any], host: str, options: ApplyOptions) -> tuple[bool, str | None, str | None]:
    """Whether to sudo, with which password and as whom: --become, or the host's ansible_become*."""
    from gpuops.transport.connvars import become_settings

    wanted = become_settings(variables, host)
    return options.become or wanted.enabled, wanted.password or options.become_password, wanted.user


def _helper_command(variables: Mapping[str, Any], with_preamble: bool, options: ApplyOptions,
                    host: str = "") -> tuple[str, bytes]:
    from gpuops.remote import python_command

    python = variables.get("gpuops_python")
    command = python_command(str(python) if python else None, stream=True)
    if with_preamble:
        # The re-audit must see the packages the server sees: the gather preamble picks that python.
        from gpuops.facts.python_select import preamble_for_vars

        command = "/bin/sh -c " + shlex.quote(preamble_for_vars(dict(variables)) + "\n" + command)
    become, password, user = _become(variables, host, options)
    if become:
        return become_wrap(command, password, user)
    return command, b""


def gather_as(conn: "Connection", probes: list[Any], preamble: str, options: ApplyOptions) -> dict[str, Any]:
    """``gpuops.gather.gather``, under sudo when --become (the state dir is root's, mode 0700)."""
    from gpuops.gather import GATHER_COMMAND, build_gather_script, gather, new_nonce, parse_outputs, split_gather_output

    become, password, user = _become(conn.host.vars or {}, conn.host.name, options)
    if not become:
        return gather(conn, probes, preamble=preamble)
    nonce = new_nonce()
    script = build_gather_script(probes, nonce, preamble)
    command, prefix = become_wrap(GATHER_COMMAND, password, user)
    result = conn.run(command, stdin=prefix + script.encode())
    outputs = split_gather_output(result.stdout_text(), nonce)
    why = ""
    if len(outputs) < len(probes):
        tail = (result.stderr_text().strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        why = f"the gather script stopped early (sudo?): {tail}"
    return parse_outputs(probes, outputs, why)


def run_helper(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any],
               options: ApplyOptions, with_preamble: bool = False, deadline: float | None = None,
               on_audit: Callable[[Any], tuple[bool, str]] | None = None,
               on_event: Callable[[dict[str, Any]], None] | None = None,
               on_verified: Callable[[], tuple[bool, str | None]] | None = None) -> dict[str, Any]:
    """Ship apply_helper + payload in ONE exec and hold its transaction to the end (see apply.txn).

    Returns the helper's ``result``, or ``{"status": "unknown", ...}`` when the outcome could not
    be learnt (per-host deadline, connection lost)."""
    from gpuops.apply.txn import lease_seconds, run_transaction
    from gpuops.remote import python_stdin

    lease_s = lease_seconds(variables)
    remaining = None if deadline is None else max(1.0, deadline - time.monotonic())
    payload = dict(payload, lease_s=lease_s, deadline_s=remaining, keep_runs=keep_runs(variables))
    command, prefix = _helper_command(variables, with_preamble, options, conn.host.name)
    body = prefix + python_stdin("apply_helper", payload, stream=True)
    from gpuops import timings
    from gpuops.transport import verbose

    started = time.monotonic()
    with timings.span("exec", conn.host.name):  # the transaction's exec, on a channel of its own
        result = run_transaction(conn, command, body, lease_s, deadline, payload.get("run_id"), on_audit, on_event,
                                 on_verified)
    if verbose.enabled():
        verbose.log_stream(conn.host.name, command, len(body), time.monotonic() - started, str(result.get("status")))
    return result


def keep_runs(variables: Mapping[str, Any]) -> int:
    """``gpuops_keep_runs`` (default 20): how many runs' backups a host keeps."""
    from gpuops.apply.txn import number_var

    return int(number_var(variables, "gpuops_keep_runs", 20, int, "a whole number", 1))
