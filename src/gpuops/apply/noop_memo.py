"""A no-op plan recalled instead of computed again, when every input of planning is the same.

Planning is pure (DESIGN.md): its result is a function of gpuops' own code, the role's files and the
shared templates, the host's and the command line's variables, and the facts just gathered (the
managed files' contents and modes, the gate scan, the GPU summary). A no-op ``apply`` repeats that
work (templating, re-planning the gate patch) on every run to find, again, that nothing changes. So
once a plan comes out empty, the digest of all those inputs is kept, with what the report shows of
that plan (warnings, notes, tasks); the next run whose inputs have the same digest skips planning.

Drift is never skipped: the gather still runs first and its facts are part of the digest, so a
managed file edited on the host, another gate scan (another tree fingerprint), other GPUs or other
variables make another digest and a real plan. Only empty plans are kept (a plan with changes is
always computed: its diffs and payload are needed), never when another run is unfinished on the host
(that run needs the full plan), and never when the gate scan has no fingerprint. gpuops' code and
the role and template directories are in the digest by a stat walk (path, size, mtime, inode), as
Python's own .pyc check does. Kept by the memo layer (``memo.Kind.PLANS``, ``memo.Kind.DISCOVERY``;
``GPUOPS_KEEP=off`` turns it off).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gpuops import memo
from gpuops.apply.journal import fold_runs
from gpuops.facts.container_python import ContainerTarget
from gpuops.plan.model import Plan
from gpuops.plan.planner import Discovery

if TYPE_CHECKING:
    from gpuops.plan.model import PlanFacts, Plan

_LOG = "gpuops.transport"  # shown with -v, as the commands are

code_digest = memo.code_digest
_jsonable = memo.jsonable


def facts_digest(facts: "PlanFacts") -> str | None:
    """The digest of what planning reads from the host; None when the facts cannot be pinned down
    (a gate scan without a fingerprint)."""
    parts: dict[str, Any] = {}
    for field in dataclasses.fields(facts):
        value = getattr(facts, field.name)
        if field.name == "gate_scan" and value is not None:
            if not getattr(value, "known", False) or not getattr(value, "fingerprint", None):
                return None
            # The scan is what its tree fingerprint says (remote/scan_fingerprint.py); its sources too.
            value = {"fingerprint": value.fingerprint, "version": value.version, "root": value.root,
                     "python": value.python, "sources": memo.digest_of(dict(value.sources or {}))}
        parts[field.name] = value
    return memo.digest_of(parts)


def _vars_digest(inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any]) -> str | None:
    return memo.digest_of({"inventory": inventory_vars, "extra": extra_vars})


def plan_key(role: str, facts: "PlanFacts", inventory_vars: Mapping[str, Any],
             extra_vars: Mapping[str, Any]) -> memo.Key | None:
    """Every input of planning: gpuops' code, roles and templates, the role, the host, the facts
    gathered and the variables."""
    facts_part = facts_digest(facts)
    variables = _vars_digest(inventory_vars, extra_vars)
    if facts_part is None or variables is None:
        return None
    return memo.key(memo.Kind.PLANS, code_digest(), role, facts.host, facts_part, variables)


def discovery_key(role: str, host: str, inventory_vars: Mapping[str, Any],
                  extra_vars: Mapping[str, Any]) -> memo.Key | None:
    """Every input of the fact-free pass: gpuops' code, roles and templates, the role, the host and
    the variables."""
    variables = _vars_digest(inventory_vars, extra_vars)
    return None if variables is None else memo.key(memo.Kind.DISCOVERY, code_digest(), role, host, variables)


def recall(key: memo.Key, facts: "PlanFacts", role: str) -> "Plan | None":
    """The empty plan kept under ``key``, or None (absent, torn, or not this key's)."""

    data = memo.get(key)
    if data is None or data.get("host") != facts.host or data.get("role") != role:
        return None
    warnings, notes = data.get("warnings"), data.get("notes")
    if not (isinstance(warnings, list) and isinstance(notes, list) and all(isinstance(t, str) for t in warnings + notes)):
        return None
    if not isinstance(data.get("tasks_ok"), int) or not isinstance(data.get("state_dir"), str):
        return None
    try:
        return Plan(host=facts.host, role=role, changes=(), handlers=(), service=None, warnings=tuple(warnings),
                    notes=tuple(notes), tasks_ok=data["tasks_ok"], state_dir=data["state_dir"])
    except TypeError:  # Plan grew a required field: plan for real
        return None


def remember(key: memo.Key, plan: "Plan", run_id: str | None) -> None:
    """Keep an empty plan's report part; never fails the command."""
    if plan.changes or plan.handlers or plan.audit is not None or getattr(plan, "image", None) is not None:
        return
    texts = list(plan.warnings) + list(plan.notes)
    if run_id and any(run_id in t for t in texts):
        return  # the report names this run: it would be wrong for the next one
    memo.put(key, {"host": plan.host, "role": plan.role, "warnings": list(plan.warnings), "notes": list(plan.notes),
                   "tasks_ok": plan.tasks_ok, "state_dir": plan.state_dir})


def plan_or_recall(role: str, facts: "PlanFacts", inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any],
                   run_id: str | None, journal: list[dict[str, Any]], plan: Callable[[], "Plan"],
                   recall_kept: bool = True) -> "Plan":
    """``plan()``, unless the same inputs gave an empty plan before (see the module docstring).
    ``recall_kept=False`` (``--flush-cache``): planned in any case, and an empty plan kept again."""
    import logging

    if memo.root() is None or any(r["outcome"].startswith("unfinished") for r in fold_runs(journal)):
        return plan()
    key = plan_key(role, facts, inventory_vars, extra_vars)
    if key is None:
        return plan()
    recalled = recall(key, facts, role) if recall_kept else None
    if recalled is not None:
        logging.getLogger(_LOG).info("%s: plan: inputs unchanged since an empty plan (digest %s), not planned again",
                                     facts.host, key.digest[:16])
        return recalled
    computed = plan()
    remember(key, computed, run_id)
    return computed


# ---------------------------------------------------------------- the fact-free pass (discover)

_DISCOVERY_FIELDS = {"paths", "needs_gate_scan", "state_dir", "python", "warnings", "container", "desired_path",
                     "needs_server_state", "entrypoint_pythons"}
_CONTAINER_FIELDS = {"container", "image", "python"}


def _discovery_shape_known() -> bool:
    """Only a Discovery (and ContainerTarget) of the shape this module stores is kept: a field added
    later is never silently dropped."""

    return ({f.name for f in dataclasses.fields(Discovery)} == _DISCOVERY_FIELDS
            and {f.name for f in dataclasses.fields(ContainerTarget)} == _CONTAINER_FIELDS)


def discover_or_recall(role: str, host: str, inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any],
                       discover: Callable[[], Any]) -> Any:
    """``discover()`` (the planner's fact-free pass: pure in gpuops' code, the role and the
    variables), or what it returned before for the same inputs. Refusals are never kept: they
    are raised again by ``discover()`` itself."""
    key = discovery_key(role, host, inventory_vars, extra_vars) if memo.root() is not None else None
    if key is None or not _discovery_shape_known():
        return discover()
    recalled = _recall_discovery(key, role, host)
    if recalled is not None:
        return recalled
    found = discover()
    container = found.container
    memo.put(key, {"host": host, "role": role,
                            "paths": list(found.paths), "needs_gate_scan": bool(found.needs_gate_scan),
                            "state_dir": found.state_dir, "python": found.python, "warnings": list(found.warnings),
                            "desired_path": found.desired_path, "needs_server_state": bool(found.needs_server_state),
                            "entrypoint_pythons": list(found.entrypoint_pythons),
                            "container": None if container is None else {k: getattr(container, k) for k in sorted(_CONTAINER_FIELDS)}})
    return found


def _recall_discovery(key: memo.Key, role: str, host: str) -> Any:
    try:
        data = memo.get(key)
        if data is None or data.get("host") != host or data.get("role") != role:
            return None
        container = data["container"]
        if container is not None:
            container = ContainerTarget(**{k: container[k] for k in _CONTAINER_FIELDS})
        texts = [*data["paths"], *data["warnings"], *data["entrypoint_pythons"], data["state_dir"], data["python"]]
        if not all(isinstance(t, str) for t in texts) or not all(
                isinstance(data[flag], bool) for flag in ("needs_gate_scan", "needs_server_state")):
            return None
        if data["desired_path"] is not None and not isinstance(data["desired_path"], str):
            return None
        return Discovery(paths=tuple(data["paths"]), needs_gate_scan=data["needs_gate_scan"], state_dir=data["state_dir"],
                         python=data["python"], warnings=tuple(data["warnings"]), container=container,
                         desired_path=data["desired_path"], needs_server_state=data["needs_server_state"],
                         entrypoint_pythons=tuple(data["entrypoint_pythons"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
