"""plan_role: (facts, role, vars) -> Plan. Pure: no host is touched, no file outside the roles read.

Variable precedence, lowest first (as in Ansible): role defaults (dependencies' below the role's
own) < inventory group/host vars < registered results < include_role/task ``vars`` < ``-e``.
Planning runs twice per host: once in discovery mode (no facts; finds the files to gather and
catches bad input before any I/O), then with the gathered facts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.facts.container_python import ContainerTarget
    from gpuops.plan.changes import HandlerRun, ServiceSpec
    from gpuops.plan.model import PlanFacts, Plan
    from gpuops.plan.task import Role, Task, Variables
    from gpuops.plan.state import PlanState, Recomposer
    from gpuops.plan.templating import Layer, Templar, VarScope

# The planning machinery (roles, module specs and planners, templating, PlanState) is imported by
# the functions that plan, not here: a no-op apply whose plan is recalled (apply/noop_memo.py) needs
# only ``Discovery`` and ``vars_digest`` from this module, and importing the rest cost ~5 ms of
# its local CPU (a dozen dataclasses and regexes built at import time).

_MAX_INCLUDE_DEPTH = 8


@frozen
class Discovery:
    """What the first (fact-free) pass found out: the files and scans the gather must fetch."""

    paths: tuple[str, ...]
    needs_gate_scan: bool
    state_dir: str
    python: str
    warnings: tuple[str, ...]
    # sglang_manager: docker: the container (and image) whose SGLang the gate scan must read.
    container: "ContainerTarget | None" = None
    desired_path: str | None = None   # desired.json, when the role composes the launch
    needs_server_state: bool = False  # a `server` task: gather whether the server runs
    entrypoint_pythons: tuple[str, ...] = ()  # `entrypoint` tasks: the launch pythons whose release to read


def _base_scope(templar: Templar, roles: Mapping[str, Role], main: str,
                inventory_vars: Variables, extra_vars: Variables,
                registered: dict[str, object]) -> VarScope:
    from gpuops.plan.templating import Layer, VarScope

    # Included roles' defaults first, so the main role's own defaults win over theirs.
    order = [name for name in roles if name != main] + [main]
    layers = [Layer(roles[name].defaults, True, str(roles[name].path / "defaults.yml")) for name in order]
    layers.append(Layer(dict(inventory_vars), False, "inventory"))
    layers.append(Layer(registered, False, "registered results"))
    layers.append(Layer(dict(extra_vars), False, "--extra-vars"))
    return VarScope(templar, layers)


def _below_extra(scope: VarScope, layer: Layer) -> VarScope:
    """Task and include vars sit just below ``-e`` (which always wins)."""
    from gpuops.plan.templating import VarScope

    return VarScope(scope.templar, scope.layers[:-1] + (layer, scope.layers[-1]))


def _run_task(task: Task, scope: VarScope, state: PlanState, depth: int) -> None:
    from gpuops.plan.argspec import check_rendered
    from gpuops.plan.modules import PLANNERS, SPECS
    from gpuops.plan.templating import Layer

    if task.vars:
        scope = _below_extra(scope, Layer(task.vars, True, f"{task.where} vars"))
    if task.when is not None:
        try:
            condition = state.templar.evaluate(str(task.when), scope, f"{task.where} (when)")
        except GpuopsError:
            if not state.discovery:
                raise
            condition = True  # discovery gathers a superset; the real pass decides
        if not condition:
            return
    state.tasks_ok += 1
    if task.module == "include_role":
        _run_role(state.roles[str(task.args["name"])], scope, state, depth + 1)
        return
    args = {key: state.templar.render_value(value, scope, f"{task.where} ({key})") for key, value in task.args.items()}
    check_rendered(SPECS[task.module], args, f"{state.host}: {task.where}")  # a {{ template }} has its type now
    result = PLANNERS[task.module](task, SPECS[task.module].with_defaults(args), state, scope)
    if task.register:
        state.registered[task.register] = result


def _run_role(role: Role, scope: VarScope, state: PlanState, depth: int = 0) -> None:
    if depth > _MAX_INCLUDE_DEPTH:
        from gpuops.plan.roles import RoleError

        raise RoleError(f"{role.path}: roles include each other more than {_MAX_INCLUDE_DEPTH} deep")
    for dependency in role.dependencies:
        _run_role(state.roles[dependency], scope, state, depth + 1)
    state.role_scopes[role.name] = scope
    for task in role.tasks:
        _run_task(task, scope, state, depth)


def _handlers(state: PlanState) -> tuple[list[HandlerRun], ServiceSpec | None]:
    from gpuops.plan.changes import HandlerRun
    from gpuops.plan.modules import service_handler
    from gpuops.plan.roles import RoleError

    defined: dict[str, tuple[Task, VarScope]] = {}
    for role_name, scope in state.role_scopes.items():
        for handler in state.roles[role_name].handlers:
            defined.setdefault(handler.name, (handler, scope))
    runs: list[HandlerRun] = []
    for name in state.notified:
        if name not in defined:
            task = next(c.task for c in state.changes if name in c.notify)
            raise RoleError(f"{task}: notifies {name!r} but no role in this run defines that handler")
    # A unit file or one of its drop-ins (UNIT.d/*.conf): systemd reads both only on daemon-reload.
    reload_needed = any(c.path.endswith((".service", ".socket")) or ".service.d/" in c.path for c in state.changes)
    service: ServiceSpec | None = None
    for name, (handler, scope) in defined.items():
        args = {k: state.templar.render_value(v, scope, f"{handler.where} ({k})") for k, v in handler.args.items()}
        spec = service_handler(handler, args, state)
        service = service or spec
        if name in state.notified:
            runs.append(HandlerRun(name=name, service=spec, daemon_reload=reload_needed and spec.manager == "systemd"))
    return runs, service


def _layers_and_state(role_name: str, facts: PlanFacts | None, host: str,
                      inventory_vars: Variables, extra_vars: Variables,
                      roles_path: list[Path] | None, run_id: str | None = None,
                      ) -> tuple[PlanState, VarScope, Mapping[str, Role]]:
    from gpuops.plan.roles import load_role_tree, shared_templates_dirs
    from gpuops.plan.state import PlanState
    from gpuops.plan.templating import Templar

    roles = load_role_tree(role_name, roles_path)
    dirs = [role.templates_dir for role in roles.values()] + shared_templates_dirs()
    templar = Templar([d for d in dirs if d.is_dir()])
    from gpuops.secret_policy import secret_values

    secrets = secret_values(dict(inventory_vars), dict(extra_vars))
    state = PlanState(host=host, templar=templar, roles=roles, facts=facts, secrets=secrets,
                      role=role_name, run_id=run_id)
    scope = _base_scope(templar, roles, role_name, inventory_vars, extra_vars, state.registered)
    return state, scope, roles


def discover(role_name: str, host: str, inventory_vars: Variables, extra_vars: Variables,
             roles_path: list[Path] | None = None) -> Discovery:
    """The fact-free pass: which files to gather, whether to scan gates; refuses bad input early."""
    from gpuops.plan.varcheck import check_extra_vars, check_inventory_types

    state, scope, roles = _layers_and_state(role_name, None, host, inventory_vars, extra_vars, roles_path)
    check_inventory_types(host, roles, {k: v for k, v in inventory_vars.items() if k not in extra_vars})
    for warning in check_extra_vars(role_name, roles, extra_vars):
        state.warn(warning)
    _run_role(roles[role_name], scope, state)
    state_dir = str(scope.get("gpuops_state_dir")) if "gpuops_state_dir" in scope else "/var/lib/gpuops"
    python = str(scope.get("gpuops_python")) if "gpuops_python" in scope else "python3"
    return Discovery(tuple(sorted(state.paths)), state.needs_gate_scan, state_dir, python, tuple(state.warnings),
                     _container(scope), state.desired_path, state.needs_server_state,
                     tuple(state.entrypoint_pythons))


def _container(scope: VarScope) -> "ContainerTarget | None":
    from gpuops.facts.container_python import docker_target

    names = ("sglang_manager", "sglang_service", "sglang_docker_image")
    return docker_target({name: scope.get(name) for name in names if name in scope})


def plan_role(role_name: str, facts: PlanFacts, inventory_vars: Variables,
              extra_vars: Variables, roles_path: list[Path] | None = None,
              run_id: str | None = None, recompose: Recomposer | None = None) -> Plan:
    """The changes a role would make on a host whose state is ``facts``; ``run_id`` is recorded
    with the role's contribution to the composed launch (see plan/compose.py). ``recompose``: see
    ``PlanState.recompose``."""
    from gpuops.plan.model import Plan
    from gpuops.plan.varcheck import check_extra_vars

    state, scope, roles = _layers_and_state(role_name, facts, facts.host, inventory_vars, extra_vars, roles_path, run_id)
    state.recompose = recompose
    for warning in check_extra_vars(role_name, roles, extra_vars):
        state.warn(warning)
    _run_role(roles[role_name], scope, state)
    handlers, service = _handlers(state)
    state_dir = str(scope.get("gpuops_state_dir")) if "gpuops_state_dir" in scope else "/var/lib/gpuops"
    return Plan(
        host=facts.host, role=role_name, changes=tuple(state.changes), handlers=tuple(handlers),
        service=service, compile_checks=tuple(state.compile_checks), audit=state.audit, log_check=state.log_check,
        image=state.image, release=state.release, warnings=tuple(state.warnings), notes=tuple(state.notes),
        tasks_ok=state.tasks_ok,
        state_dir=state_dir, starts=state.starts, entrypoints_unread=tuple(state.entrypoints_unread),
    )


def vars_digest(inventory_vars: Variables, extra_vars: Variables) -> str:
    """A hash of the variables a run used (journaled instead of the values, which may be secret)."""
    blob = json.dumps({"inventory": inventory_vars, "extra": extra_vars}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


__all__ = ["plan_role", "discover", "Discovery", "vars_digest"]
