"""Nothing silently ignored: ``-e`` variables checked against what the role reads (pure).

``-e NCCL_ALGO=Tree`` or ``-e '{"nccl_envs": ...}'`` used to give rc 0, changed 0, and an operator
who believed the setting applied. Now a variable no role of the run knows gets a warning naming
the closest known one, and a mapping (or list) variable given as a string (``key=value`` values are
always strings) is refused with the syntax that works.
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Mapping

from gpuops.errors import GpuopsError
from gpuops.yamlfile import parse_yaml_text

if TYPE_CHECKING:
    from gpuops.plan.task import Role, Variables

# Read by gpuops itself (connection, inventory, apply), whatever the role.
_GLOBAL_PREFIXES = ("ansible_", "gpuops_")
_NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_")
# Read by apply itself around a replica's restart (apply/replicas.py) and a deployment's commit
# (apply/deployment.py, apply/deployment_health.py); tests hold the two lists equal.
RUN_VARIABLES = ("sglang_router_url", "sglang_worker_url", "sglang_router_api_key", "sglang_drain_timeout",
                 "sglang_router_health_timeout", "sglang_deployment", "sglang_node_rank", "sglang_dist_port",
                 "sglang_deployment_answer_timeout")


def known_variables(roles: Mapping[str, Role]) -> dict[str, object]:
    """Every variable the roles of a run declare (defaults, task vars, registered results), with
    its default value (None where it has none)."""
    known: dict[str, object] = {}
    for role in roles.values():
        for name, value in role.defaults.items():
            known.setdefault(str(name), value)
        for task in role.tasks:
            for name in task.vars:
                known.setdefault(str(name), None)
            if task.register:
                known.setdefault(task.register, None)
    return known


def _example(name: str, value: object) -> str:
    return "-e '" + json.dumps({name: value}) + "'"


def _suggest(name: str, value: object, known: Mapping[str, object]) -> str:
    if name.upper() == name and name.startswith(_NCCL_PREFIXES) and "nccl_env" in known:
        return f"did you mean nccl_env? ({_example('nccl_env', {name: value})})"
    if name.upper() == name and "sglang_env" in known:
        return f"did you mean sglang_env? ({_example('sglang_env', {name: value})})"
    close = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=0.5)
    return f"did you mean {close[0]}?" if close else f"known variables: {', '.join(sorted(known))}"


def _parsed(text: str) -> object:
    try:
        return parse_yaml_text(text, "-e")
    except GpuopsError:  # only used to show the user a better example
        return None


def check_extra_vars(role: str, roles: Mapping[str, Role], extra_vars: Variables) -> list[str]:
    """Warnings for ``-e`` variables no role of the run knows; raises for a mapping/list variable
    given as text."""
    known = known_variables(roles)
    warnings = []
    for name, value in extra_vars.items():
        if name.startswith(_GLOBAL_PREFIXES) or name in RUN_VARIABLES:
            continue
        if name not in known:
            warnings.append(f"-e {name}: no task of role {role} reads this variable, so it changes nothing; "
                            + _suggest(name, value, known))
            continue
        default = known[name]
        if isinstance(value, str) and isinstance(default, (dict, list)):
            kind = "mapping" if isinstance(default, dict) else "list"
            parsed = _parsed(value)
            example = parsed if isinstance(parsed, type(default)) else ({"NAME": "value"} if kind == "mapping" else ["--flag", "value"])
            raise GpuopsError(
                f"-e {name}: {name} is a {kind}, but it was given as the string {value!r} (key=value values are "
                f"always strings); write it as YAML/JSON: {_example(name, example)} (or -e @vars.yml)")
    return warnings


def check_inventory_types(host: str, roles: Mapping[str, Role], inventory_vars: Variables) -> None:
    """An inventory (or group/host vars) value that is a string where the role wants a mapping or a
    list: refused before any connection, naming the host and the syntax (INI inventories make
    every value a string unless it is written as JSON/YAML)."""
    known = known_variables(roles)
    for name, value in inventory_vars.items():
        default = known.get(name)
        if isinstance(value, str) and isinstance(default, (dict, list)):
            kind = "mapping" if isinstance(default, dict) else "list"
            example = "{NCCL_ALGO: Tree}" if kind == "mapping" else '["--tp", "8"]'
            raise GpuopsError(f"{host}: inventory variable {name} is a {kind}, but it is the string {value!r}; "
                              f"write it as YAML in the inventory or its host_vars/group_vars ({name}: {example})")


def seconds_var(variables: Variables, name: str, default: float, host: str) -> float:
    """A run variable that is a number of seconds above 0 (``sglang_drain_timeout``, ...): its
    value, or one line naming the host and the variable."""
    raw = variables.get(name, default)
    try:
        if not isinstance(raw, (int, float, str)):
            raise TypeError(raw)
        value = float(raw)
    except (TypeError, ValueError):
        raise GpuopsError(f"{host}: {name} must be a number of seconds, not {raw!r}") from None
    if not value > 0:
        raise GpuopsError(f"{host}: {name} must be above 0 seconds, not {raw!r}")
    return value
