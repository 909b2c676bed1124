"""The task modules gpuops understands. Each is a pure planner: (task, facts, vars) -> changes.

A module never touches a host: it reads the gathered ``PlanFacts`` and records ``Change`` values,
notes and warnings on the ``PlanState``. In discovery mode (no facts yet) it only records which
files it will need, so that one gather can fetch them all.

Each module declares its arguments beside its code (``@declares(ModuleSpec(...))``, Ansible's
``argument_spec``): the role loader checks tasks against them, the planner checks the rendered
values, and roles/README.md's module table is generated from them (``SPECS``, ``module_table``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Mapping

from gpuops.errors import GpuopsError
from gpuops.nccl import check_nccl_env, nccl_warnings
from gpuops.plan.argspec import (Arg, ModuleSpec, TaskArgs, check_rendered, declares, module_table, number_arg,
                                  spec_of)
from gpuops.plan.changes import AuditCheck, Change, CompileCheck, ServiceSpec
from gpuops.plan.diff import unified_diff
from gpuops.plan.entrypoint import LAUNCH_SERVER, LAUNCH_SERVER_WORDS
from gpuops.plan.envfile import check_entries, render_env_file
from gpuops.plan.files import absolute_dest, gathered_file, normalize_mode, record_file
from gpuops.remote.service_base import DEFAULT_HEALTH_TIMEOUT_S, DEFAULT_STOP_GRACE_S
from gpuops.secret_policy import mask_text
from gpuops import pcie_ipc
from gpuops.gates.patch import patch_recipe
from gpuops.plan.applicability import decide_for_gpu, kernel_refusal, p2p_refusal
from gpuops.plan.changes import LogCheck
from gpuops.desired_state import Contribution, read_desired
from gpuops.plan.compose import ComposeResult, plan_compose
from gpuops.plan.gate_patch import patch_changes
from gpuops.plan.image_patch import plan_image_patch
from gpuops.plan.model import summary_count, summary_flag, summary_mapping, summary_pairs

if TYPE_CHECKING:
    from gpuops.plan.state import PlanState
    from gpuops.plan.task import Task
    from gpuops.plan.templating import VarScope

@declares(ModuleSpec("template", (
    Arg("src", required=True, doc="a template of the role's `templates/` or the shared ones"),
    Arg("dest", required=True, doc="absolute"),
    Arg("mode", "mode"),
), plans="the rendered file"))
def plan_template(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    dest = absolute_dest(args["dest"], task.where)
    mode = normalize_mode(args.get("mode"), task.where)
    if state.discovery:
        state.paths.add(dest)
        return {"changed": False, "dest": dest}
    content = state.templar.render_file(str(args["src"]), scope, task.where)
    return {"changed": record_file(state, task, "template", dest, content, mode), "dest": dest}


@declares(ModuleSpec("env", (
    Arg("dest", required=True, doc="absolute"),
    Arg("entries", "mapping", required=True),
    Arg("mode", "mode", default="0600"),
    Arg("style", doc="`sh` \\| `docker`", default="sh"),
    Arg("header"),
), plans=("an environment file, one sorted `KEY='value'` line each (a value holding `'` or `\\` is double-quoted "
          "with `\\ \" $ `` ` `` escaped, so sh and systemd's `EnvironmentFile=` read the same bytes); names checked; "
          "NCCL_* names and values checked, known-bad settings warned about")))
def plan_env(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    dest = absolute_dest(args["dest"], task.where)
    where = f"{state.host}: {task.where}"
    entries = check_entries(args["entries"], where)
    allowed = scope.get("nccl_allow_unknown") if "nccl_allow_unknown" in scope else []
    if not isinstance(allowed, (list, tuple)):
        raise GpuopsError(f"{where}: nccl_allow_unknown must be a list of variable names")
    check_nccl_env(entries, where, frozenset(str(a) for a in allowed))
    style = args["style"]
    if style not in ("sh", "docker"):
        raise GpuopsError(f"{task.where}: env style must be sh or docker, not {style!r}")
    launch = scope.get("sglang_launch_args") if "sglang_launch_args" in scope else []
    for warning in nccl_warnings(entries, [str(a) for a in launch] if isinstance(launch, list) else []):
        state.warn(warning)
    if state.discovery:
        state.paths.add(dest)
        return {"changed": False, "dest": dest}
    header = str(args.get("header") or "Managed by gpuops: edits here are replaced on the next apply.")
    content = render_env_file(entries, header, style)
    mode = normalize_mode(args["mode"], task.where)
    return {"changed": record_file(state, task, "env", dest, content, mode), "dest": dest}


@declares(ModuleSpec("lineinfile", (
    Arg("path", required=True, doc="absolute"),
    Arg("line", required=True),
    Arg("regexp"),
    Arg("mode", "mode"),
    Arg("create", "bool", default=False),
), plans="replaces the last line matching `regexp`, else appends `line`"))
def plan_lineinfile(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    path = absolute_dest(args["path"], task.where)
    if state.discovery:
        state.paths.add(path)
        return {"changed": False}
    line = str(args["line"])
    if "\n" in line:
        raise GpuopsError(f"{task.where}: line must be one line")
    current = gathered_file(state, path, task.where)
    if not current.exists and not args["create"]:
        raise GpuopsError(f"{state.host}: {task.where}: {path} does not exist (set create: true)")
    lines = (current.content or "").splitlines()
    pattern = args.get("regexp")
    hits = [i for i, text in enumerate(lines) if pattern and re.search(str(pattern), text)]
    if hits:
        lines[hits[-1]] = line
    elif line not in lines:
        lines.append(line)
    after = "\n".join(lines) + "\n"
    mode = normalize_mode(args.get("mode"), task.where)
    return {"changed": record_file(state, task, "lineinfile", path, after, mode)}


@declares(ModuleSpec("gate_patch", (
    Arg("target_sm", default="sm120"),
    Arg("python", default="python3"),
    Arg("feature", default="flashinfer_allreduce_fusion"),
    Arg("allow_without_p2p", "bool", default=False),
    Arg("allow_without_kernel", "bool", default=False),
    Arg("launch_args", "list"),
    Arg("launch_env", "mapping"),
), plans=(
    "decides from the host's facts whether the role applies (GPU generation, the feature's code present, release "
    "already admitting the target); where it does, the gate patch of catalog feature `feature` (a feature without "
    "a `patch:` section in `src/gpuops/gates/catalog.yaml` is refused before any host is reached), refused when the "
    "feature needs P2P (`patch: needs_p2p`) and GPU pairs of the TP group lack it, unless `allow_without_p2p`; "
    "refused before that when the host's kernel library cannot build the feature's kernel for `target_sm` (the "
    "catalog's `kernels:`, read from the installed tree: FlashInfer's `supported_major_versions`), unless "
    "`allow_without_kernel`; "
    "registers `{changed, applies, reason, launch_flags, notes, files, image, image_base}`; adds the compile check "
    "and the re-audit. With `sglang_manager: docker` the patched files are changes of kind `image` (path "
    "`TAG:/path/in/image`): the helper builds the derived image `gpuops/<container>:<patch hash>` from the image the "
    "container runs (`remote/container_image.py`), compiles them and re-audits in that image; `image` is its tag, "
    "`image_base` the `sglang_docker_image` it stands in for; refused when no container runs or it runs another "
    "image than `sglang_docker_image`")))
def plan_gate_patch_task(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    """``gate_patch``: open the gates of catalog feature ``feature`` for ``target_sm`` (the gates
    part's ``plan_gate_patch``), where the host's facts say the patch applies."""

    target_sm = str(args["target_sm"])
    python = str(args["python"])
    feature = str(args["feature"])
    try:
        recipe = patch_recipe(feature)  # checked in discovery too: an unknown feature fails before any host is reached
    except GpuopsError as exc:
        raise GpuopsError(f"{task.where}: {exc}") from None
    state.needs_gate_scan = True
    nothing = {"changed": False, "applies": False, "launch_flags": [], "notes": [], "files": [], "image": "",
               "image_base": ""}
    if state.discovery:
        return dict(nothing, applies=True)

    assert state.facts is not None
    scan = state.facts.gate_scan
    if scan is not None and scan.known:
        decision = decide_for_gpu(scan, state.facts.gpu, target_sm, recipe, state.role)
        if not decision.applies:
            reason = decision.reason
            if decision.other_gpu:
                reason += f"; set {_role_variable(task, 'target_sm')}={decision.other_gpu} to try this GPU"
            state.note(f"nothing to do on this host: {reason}")
            return dict(nothing, reason=reason)
    patch = patch_changes(state.facts, feature, target_sm, state.host)
    pending = [(path, before, after) for path, before, after in patch.files if before != after]
    if not pending and not _contributed_before(state, scope):
        reason = (f"sglang {scan.version if scan is not None and scan.version else ''} already admits {target_sm} "
                  "by itself (no gate to widen)".replace("  ", " "))
        state.note(f"nothing to do on this host: {reason}")
        return dict(nothing, reason=reason)
    error, warning = kernel_refusal(state.facts.gpu, recipe, target_sm, _truthy(args["allow_without_kernel"]),
                                    _role_variable(task, "allow_without_kernel"))
    if error:
        raise GpuopsError(f"{state.host}: {state.role}: {error}")
    if warning:
        state.warn(warning)
    allow = _truthy(args["allow_without_p2p"])
    launch_args = args.get("launch_args") or []
    env = args.get("launch_env") or {}
    if recipe.needs_p2p:
        error, warning = p2p_refusal(state.facts.gpu, launch_args if isinstance(launch_args, list) else [],
                                     env if isinstance(env, dict) else {}, allow, recipe.needs_p2p,
                                     _role_variable(task, "allow_without_p2p"))
        if error:
            raise GpuopsError(f"{state.host}: {state.role}: {error}")
        if warning:
            state.warn(warning)
    if _scope_text(scope, "sglang_manager", "process") == "docker":
        # The files live in the container's image: the patch becomes a derived image (no host file).
        image = plan_image_patch(task, state, pending, _scope_text(scope, "sglang_docker_image", ""), "python3",
                                 feature, target_sm, _recorded(state, scope))
        for note in patch.notes:
            state.note(note)
        files = [path for path, _, _ in pending]
        return {"changed": bool(pending), "applies": True, "launch_flags": list(patch.launch_flags),
                "notes": list(patch.notes), "files": files, **image}
    changed_paths = []
    for path, before, after in pending:
        state.add_change(Change(
            kind="patch", path=path, action="update", before=before, after=after,
            diff=unified_diff(path, before, after), mode=None, task=task.where, notify=task.notify,
        ))
        changed_paths.append(path)
    for note in patch.notes:
        state.note(note)
    if changed_paths:
        state.compile_checks.append(CompileCheck(python=python, paths=tuple(changed_paths)))
        state.audit = AuditCheck(feature=feature, target_sm=target_sm, python=python)
    return {"changed": bool(changed_paths), "applies": True, "launch_flags": list(patch.launch_flags),
            "notes": list(patch.notes), "files": changed_paths}


@declares(ModuleSpec("pcie_allreduce", (
    Arg("launch_args", "list"),
    Arg("launch_env", "mapping"),
    Arg("max_numel", "any", doc="empty, or a whole number for `SGLANG_PCIE_IPC_MAX_NUMEL`"),
    Arg("allow_without_p2p", "bool", default=False),
), plans=(
    "decides from the host's facts (sglang from the gate scan, flashinfer-python, NVLink, GPUs, the launch's TP "
    "size, `--dtype`, deterministic inference: `gpuops/pcie_ipc.py::fit`) whether SGLang's PCIe IPC all-reduce "
    "fits; registers `{changed, applies, reason, env}`, `env` holding `SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1` (and "
    "`SGLANG_PCIE_IPC_MAX_NUMEL`) where it applies; where it does not, notes why and plans nothing; GPU pairs of the "
    "TP group without peer-to-peer fail the host (the kernels write into peers' memory through CUDA IPC) unless "
    "`allow_without_p2p`")))
def plan_pcie_allreduce(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    """``pcie_allreduce``: whether SGLang's PCIe IPC all-reduce fits the host, and its environment."""

    env = {pcie_ipc.ENABLE_ENV: "1"}
    max_numel = args.get("max_numel")
    if max_numel not in (None, ""):
        text = str(max_numel).strip()
        if not text.isdigit() or int(text) <= 0 or int(text) % 8:
            raise GpuopsError(f"{state.host}: {task.where}: {_role_variable(task, 'max_numel')} must be a positive "
                              f"whole number of elements, a multiple of 8 (FlashInfer's 16-byte bf16 packs), "
                              f"not {max_numel!r}")
        env[pcie_ipc.MAX_NUMEL_ENV] = text
    state.needs_gate_scan = True  # the release's version comes with the scan, the GPUs and FlashInfer with it
    if state.discovery:
        return {"changed": False, "applies": True, "reason": "", "env": env}
    assert state.facts is not None
    scan = state.facts.gate_scan
    gpu = state.facts.gpu
    launch_args = args.get("launch_args") or []
    launch_env = args.get("launch_env") or {}
    flashinfer = (summary_mapping(gpu, "kernel_versions") or {}).get("flashinfer")
    stack = pcie_ipc.HostStack(
        sglang=scan.version if scan is not None else None,
        flashinfer=flashinfer if isinstance(flashinfer, str) else None,
        nvlink=summary_flag(gpu, "nvlink"), gpu_count=summary_count(gpu, "gpu_count"),
        launch_args=[str(a) for a in launch_args] if isinstance(launch_args, list) else [],
        launch_env={str(k): str(v) for k, v in launch_env.items()} if isinstance(launch_env, dict) else {},
        p2p_failed_pairs=summary_pairs(gpu),
        kernel_reads=summary_mapping(gpu, "kernel_reads"),
        allow_without_p2p=_truthy(args.get("allow_without_p2p", False)))
    decision = pcie_ipc.fit(stack)
    if decision.misfit is pcie_ipc.Misfit.NO_P2P:  # a host to fix, not one to skip (as fusion-sm120's P2P refusal)
        raise GpuopsError(f"{state.host}: {state.role}: {decision.reason}; refused")
    if not decision.applies:
        state.note(f"nothing to do on this host: {decision.reason}")
        return {"changed": False, "applies": False, "reason": decision.reason, "env": {}}
    for warning in decision.warnings:
        state.warn(warning)
    state.note(f"PCIe IPC all-reduce fits: {decision.reason}")

    rollback = scope.get("pcie_rollback_on_fallback") if "pcie_rollback_on_fallback" in scope else False
    state.log_check = LogCheck("pcie_ipc_allreduce", _truthy(rollback))
    return {"changed": False, "applies": True, "reason": decision.reason, "env": env}


def _truthy(value: object) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def _scope_text(scope: "VarScope", name: str, default: str) -> str:
    return str(scope.get(name)) if name in scope else default


def _recorded(state: "PlanState", scope: "VarScope") -> Contribution | None:
    """This role's contribution as the host's desired state records it (None when it has none)."""

    assert state.facts is not None
    path = _scope_text(scope, "gpuops_desired_state", "")
    current = state.facts.files.get(path) if path else None
    if current is None or not current.exists:
        return None
    return read_desired(current.content, f"{state.host}: {path}").get(state.role)


def _role_variable(task: "Task", name: str) -> str:
    """The variable an operator sets (``-e VAR=...``) for a task argument that the role passes
    through as one variable (``target_sm: "{{ fusion_target_sm }}"``); else the argument's name."""
    raw = task.args.get(name)
    match = re.fullmatch(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", raw.strip()) if isinstance(raw, str) else None
    return match.group(1) if match else name


def _contributed_before(state: "PlanState", scope: "VarScope") -> bool:
    """Whether an earlier run of this role still has its part in the host's composed launch (then a
    re-run keeps it, rather than calling the gates it opened "already open")."""

    assert state.facts is not None
    if "gpuops_desired_state" not in scope:
        return False
    path = str(scope.get("gpuops_desired_state"))
    current = state.facts.files.get(path)
    if current is None or not current.exists:
        return False
    return state.role in read_desired(current.content, f"{state.host}: {path}")


@declares(ModuleSpec("assert", (
    Arg("that", "expressions", required=True, doc="expression or list"),
    Arg("msg", "any"),
), plans="nothing; fails the host with `msg` when false", shorthand="that", shorthand_kinds=(str, list)))
def plan_assert(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    that = args["that"]
    for expression in that if isinstance(that, list) else [that]:
        if not state.templar.evaluate(str(expression), scope, task.where):
            message = args.get("msg")
            text = state.templar.render_value(message, scope, task.where) if message else f"assertion failed: {expression}"
            raise GpuopsError(f"{state.host}: {task.where}: {mask_text(str(text), state.secrets)}")
    return {"changed": False}


@declares(ModuleSpec("fail", (Arg("msg", "any", required=True),),
                    plans="nothing; fails the host (use with `when`)", shorthand="msg"))
def plan_fail(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    text = state.templar.render_value(args["msg"], scope, task.where)
    raise GpuopsError(f"{state.host}: {task.where}: {mask_text(str(text), state.secrets)}")


@declares(ModuleSpec("server", (Arg("state", required=True, doc="`started`"),), plans=(
    "nothing to write; `state: started` (Ansible's): when no SGLang server runs on the host's port (the gather "
    "finds none), the handlers the task notifies run, so the transaction starts the server and waits for its "
    "health; `--check` says it would start it")))
def plan_server(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    if args["state"] != "started":
        raise GpuopsError(f"{state.host}: {task.where}: state must be started, not {args['state']!r}")
    if not task.notify:
        raise GpuopsError(f"{task.where}: a `server` task must notify the handler that starts the server")
    if state.discovery:
        state.needs_server_state = True  # the gather asks whether the server runs
        return {"changed": False}
    assert state.facts is not None
    if state.facts.server_running is not False:  # running, or not known: nothing to converge
        return {"changed": False}
    state.starts = True
    for name in task.notify:
        if name not in state.notified:
            state.notified.append(name)
    return {"changed": True}


@declares(ModuleSpec("entrypoint", (Arg("python", required=True, doc="the python the launch runs"),), plans=(
    "nothing to write; registers `{words, entrypoint, script, why}`: the words after `python` that launch the "
    "server as the release installed for it recommends, read on the host (`remote/sglang_entrypoint.py`): "
    "`SCRIPT serve` where its launch_server recommends `sglang serve` and the installer wrote the `sglang` "
    "script, else `-m sglang.launch_server`")))
def plan_entrypoint(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    python = str(args["python"])
    if state.discovery:
        if python not in state.entrypoint_pythons:
            state.entrypoint_pythons.append(python)  # the gather reads its release
        return {"changed": False, "words": list(LAUNCH_SERVER_WORDS), "entrypoint": LAUNCH_SERVER, "script": None,
                "why": "not read yet"}
    assert state.facts is not None
    entry = (state.facts.entrypoints or {}).get(python)
    if entry is None:
        if python not in state.entrypoints_unread:
            state.entrypoints_unread.append(python)
        return {"changed": False, "words": list(LAUNCH_SERVER_WORDS), "entrypoint": LAUNCH_SERVER, "script": None,
                "why": f"{python}'s release was not read (not there when gathered)"}
    return {"changed": False, "words": list(entry.words), "entrypoint": entry.entrypoint, "script": entry.script,
            "why": entry.why}


# A module's planner: the task, its rendered and checked arguments -> its result (what `register` keeps).
Planner = Callable[["Task", TaskArgs, "PlanState", "VarScope"], Mapping[str, object]]


# Its code lives in plan/compose.py (the composition of every run's part); declared here, with its
# registry entry, so that compose.py stays free of the planner's vocabulary.
@declares(ModuleSpec("compose", (
    Arg("dest", required=True, doc="absolute"),
    Arg("args", "list"),
    Arg("env", "mapping"),
    Arg("image"),
    Arg("image_base"),
    Arg("launch_image"),
    Arg("python"),
    Arg("renames", "mapping"),
    Arg("drop", "list"),
    Arg("mode", "mode", default="0600"),
), plans=(
    "records this run's part of the launch (flags, environment, inventory flags it takes out (`drop`), for docker "
    "a derived image with the inventory "
    "image it replaces, for sglang-release the `python` of the release's environment and the flag `renames` it "
    "needs) in the host's desired-state file, keyed by the role; registers the composition of every "
    "part still recorded: `{args, env, runs, image, image_base, python, renames, drop}` (the docker run script names `image` while "
    "`sglang_docker_image` is still `image_base`; when `launch_image`, the inventory's image, is another one, the "
    "run warns that the server runs it without that patch)")))
def _plan_compose(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> ComposeResult:
    return plan_compose(task, args, state, scope)


# Run by the planner itself (``planner._run_task``); ``roles.load_role_tree`` loads the role it names.
INCLUDE_ROLE = ModuleSpec("include_role", (Arg("name", required=True, doc="literal"),),
                          plans="the tasks of another role, with this task's `vars`", shorthand="name")


@declares(ModuleSpec("service", (
    Arg("manager", required=True),
    Arg("name", required=True),
    Arg("state_dir", required=True),
    Arg("port", "number", required=True),
    Arg("health_timeout", "number", default=DEFAULT_HEALTH_TIMEOUT_S),  # measured defaults: remote/service_base.py
    Arg("grace", "number", default=DEFAULT_STOP_GRACE_S),
    Arg("docker_run_script"),
    Arg("daemon_reload", "any", doc="accepted and not used: gpuops reloads systemd when the unit changed"),
), handler_only=True, plans=(
    "a restart: `process` stop (SIGTERM, grace, SIGKILL) + detached start; `systemd` (`remote/service_systemd.py`) "
    "`daemon-reload` (when systemd says the unit changed) + `reset-failed` + `restart`, a server systemd restarts "
    "counts as a failed start; `docker` (`remote/service_docker.py`) `stop -t grace` + `rm -f` + the run script, a "
    "container that exits or that docker restarts counts as a failed start. Then the health wait on the port the "
    "manager really launched, answered by the server's own processes.")))
def service_handler(task: "Task", args: TaskArgs, state: "PlanState") -> ServiceSpec:
    """A ``service`` handler's rendered arguments -> the restart the apply runs when notified."""
    check_rendered(spec_of(service_handler), args, f"{state.host}: {task.where}")
    args = spec_of(service_handler).with_defaults(args)
    manager = str(args["manager"])
    if manager not in ("process", "systemd", "docker"):
        raise GpuopsError(f"{state.host}: {task.where}: sglang_manager must be process, systemd or docker, not {manager!r}")
    try:
        port = int(number_arg(args["port"]))
        timeout = float(number_arg(args["health_timeout"]))
        grace = float(number_arg(args["grace"]))
    except (TypeError, ValueError) as exc:
        raise GpuopsError(f"{state.host}: {task.where}: port, health_timeout and grace must be numbers ({exc})") from None
    return ServiceSpec(
        manager=manager, name=str(args["name"]), state_dir=str(args["state_dir"]), port=port,
        health_timeout=timeout, grace=grace,
        docker_run_script=str(args["docker_run_script"]) if args.get("docker_run_script") else None,
    )


from gpuops.plan.release import plan_sglang_release  # noqa: E402  (its own module: the release concept)

_PLANNERS: tuple[Planner, ...] = (plan_template, plan_env, plan_lineinfile, plan_gate_patch_task, plan_pcie_allreduce,
                                  _plan_compose, plan_sglang_release, plan_server, plan_entrypoint, plan_assert, plan_fail)
PLANNERS: dict[str, Planner] = {spec_of(p).name: p for p in _PLANNERS}
# Every module a task may name, in roles/README.md's order: the planners, include_role, service.
SPECS: dict[str, ModuleSpec] = {
    **{spec_of(p).name: spec_of(p) for p in _PLANNERS},
    INCLUDE_ROLE.name: INCLUDE_ROLE,
    "service": spec_of(service_handler),
}


def modules_markdown() -> str:
    """roles/README.md's module table, generated from ``SPECS``."""
    return module_table(SPECS)
