"""gpuops inside Ansible: what the ``gpuops.gpu`` collection's action plugins call.

The plugins run on the Ansible controller (where gpuops is installed) and reach the host through
Ansible's own connection for that task: its inventory, bastions, become, vault and forks are
Ansible's. gpuops keeps its design there too: ONE exec per phase, the program on stdin
(``_low_level_execute_command(..., in_data=...)``), parsing and planning on the controller.

    gpuops.gpu.facts   -> the same document as one host of ``gpuops inspect host --json``
    gpuops.gpu.role    -> the same document as one host of ``gpuops apply ROLE --json``

A role's run is a transaction that keeps a channel open to the host (heartbeats, the verdict, the
commit); Ansible's connection API runs a command to its end, so the role action connects with
gpuops' own transport, from the same ``ansible_*`` connection variables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuops.transport.base import ConnectOptions, ExecResult
from gpuops.apply.options import ApplyOptions, new_run_id
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.runner import apply_host, discover_all
from gpuops.errors import TransportError
from gpuops.facts.collect import HostJSON, host_json
from gpuops.inspection import inspect_host
from gpuops.inventory.builder import InventoryBuilder, resolve
from gpuops.transport import HostOutcome
from gpuops.transport.connvars import IMPLEMENTED, IRRELEVANT

# Ansible's own variables in a task's vars: not the host's.
MAGIC_VARS = frozenset({
    "hostvars", "groups", "group_names", "inventory_hostname", "inventory_hostname_short", "omit", "playbook_dir",
    "play_hosts", "ansible_play_hosts", "role_names", "vars", "environment", "inventory_dir", "inventory_file",
    "ansible_facts", "gpuops",
})

# Runs one command with bytes on stdin through Ansible: returns (rc, stdout, stderr).
Runner = Callable[[str, bytes], tuple[int, bytes, bytes]]


class AnsibleConnection:
    """gpuops' Connection over an Ansible action plugin's connection."""

    def __init__(self, host: Any, runner: Runner) -> None:
        self.host = host
        self._runner = runner

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        rc, out, err = self._runner(command, stdin)
        return ExecResult(out, err, rc)

    def open_stream(self, command: str) -> Any:
        # Ansible's connection API runs a command to its end; the role action connects with gpuops' own.
        raise TransportError(self.host.name, "Ansible's connection cannot keep a command's stdin open")

    def close(self) -> None:
        pass


def host_from_vars(name: str, variables: Mapping[str, Any], own_connection: bool = False) -> Any:
    """A gpuops Host for an Ansible host: its variables without Ansible's magic ones.

    ``own_connection``: gpuops connects by itself (a role's transaction needs a channel that stays
    open, which Ansible's connection API does not give), reading the host's Ansible connection
    variables as ``gpuops -i`` would; otherwise the ``ansible_*`` variables are left to Ansible.
    """

    wanted = (IMPLEMENTED | IRRELEVANT) if own_connection else frozenset({"ansible_python_interpreter"})
    kept = {k: _plain(v) for k, v in variables.items()
            if (not k.startswith("ansible_") or k in wanted) and k not in MAGIC_VARS}
    builder = InventoryBuilder()
    builder.add_host(name, "ungrouped", kept)
    inventory = resolve(builder, source=f"ansible host {name}", base_dir=".", group_vars=lambda *_: {},
                        host_vars=lambda *_: {})
    return inventory.hosts[0]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)  # Ansible's tagged/unsafe strings become plain ones
    return value


def facts(host: Any, runner: Runner, with_gates: bool = True) -> HostJSON:
    """One host's entry of ``gpuops inspect host --json``, gathered in one exec through Ansible."""

    options = ConnectOptions(connector=lambda h: AnsibleConnection(h, runner))
    inspection = inspect_host(host, options, with_gates=with_gates)
    return host_json(HostOutcome(ok=True, value=inspection))


def apply_role(host: Any, role: str, extra: Mapping[str, Any], check: bool) -> dict[str, Any]:
    """One host's entry of ``gpuops apply ROLE --json`` (plan, change, restart, verify, journal).

    `host` comes from ``host_from_vars(..., own_connection=True)``: gpuops reaches it itself.
    """

    options = ApplyOptions(connect=ConnectOptions(), check=check)
    checked = ExtraVars.checked(role, extra)  # the task's vars, checked once before any use
    discovery = discover_all([host], role, checked)[host.name]
    report = apply_host(host, role, checked, discovery, options, new_run_id())
    return report.to_json()
