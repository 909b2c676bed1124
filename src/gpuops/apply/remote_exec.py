"""The two kinds of exec apply makes on a host: the gather, and the helper; both under sudo on --become."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any, Mapping

from gpuops.apply.options import ApplyOptions
from gpuops.errors import GpuopsError

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
    command = python_command(str(python) if python else None)
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
               options: ApplyOptions, with_preamble: bool = False) -> dict[str, Any]:
    """Ship apply_helper + payload in ONE exec; return its final ``result`` object."""
    from gpuops.remote import python_stdin

    command, prefix = _helper_command(variables, with_preamble, options, conn.host.name)
    result = conn.run(command, stdin=prefix + python_stdin("apply_helper", payload), timeout=None)
    final = None
    for line in result.stdout_text().splitlines():
        if line.startswith('{"result"'):
            try:
                final = json.loads(line)["result"]
            except ValueError:
                continue
    if final is None:
        tail = (result.stderr_text().strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        raise GpuopsError(
            f"{conn.host.name}: the apply helper gave no result ({tail}); if a run was started, "
            f"`gpuops history` shows it and `gpuops rollback` undoes it"
        )
    return final
