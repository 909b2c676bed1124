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
Python's own .pyc check does. ``$GPUOPS_PLAN_CACHE=off`` turns it off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gpuops import local_memo

if TYPE_CHECKING:
    from gpuops.plan.model import PlanFacts, Plan

MEMO_FORMAT = 1
CACHE_ENV = "GPUOPS_PLAN_CACHE"
MAX_ENTRIES = 256
_LOG = "gpuops.transport"  # shown with -v, as the commands are


def memo_dir() -> Path | None:
    return local_memo.memo_dir(CACHE_ENV, "plans")


code_digest = local_memo.code_digest
_jsonable = local_memo.jsonable


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
                     "python": value.python, "sources": hashlib.sha256(
                         json.dumps(dict(value.sources or {}), sort_keys=True).encode()).hexdigest()}
        parts[field.name] = value
    blob = json.dumps(parts, sort_keys=True, default=_jsonable)
    return hashlib.sha256(blob.encode("utf-8", "surrogateescape")).hexdigest()


def _vars_digest(inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any]) -> str | None:
    try:
        variables = json.dumps({"inventory": inventory_vars, "extra": extra_vars}, sort_keys=True, default=_jsonable)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(variables.encode("utf-8", "surrogateescape")).hexdigest()


def inputs_digest(role: str, facts: "PlanFacts", inventory_vars: Mapping[str, Any],
                  extra_vars: Mapping[str, Any]) -> str | None:
    facts_part = facts_digest(facts)
    variables = _vars_digest(inventory_vars, extra_vars)
    if facts_part is None or variables is None:
        return None
    blob = json.dumps([MEMO_FORMAT, "plan", code_digest(), role, facts.host, facts_part, variables])
    return hashlib.sha256(blob.encode()).hexdigest()


def _entry_path(directory: Path, key: str) -> Path:
    return directory / f"{key}.json"


def recall(directory: Path, key: str, facts: "PlanFacts", role: str) -> "Plan | None":
    """The empty plan kept under ``key``, or None (absent, torn, or not this key's)."""
    from gpuops.plan.model import Plan

    try:
        data = json.loads(_entry_path(directory, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MEMO_FORMAT or data.get("key") != key:
        return None
    if data.get("kind") != "plan" or data.get("host") != facts.host or data.get("role") != role:
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


def remember(directory: Path, key: str, plan: "Plan", run_id: str | None) -> None:
    """Keep an empty plan's report part; never fails the command."""
    if plan.changes or plan.handlers or plan.audit is not None or getattr(plan, "image", None) is not None:
        return
    texts = list(plan.warnings) + list(plan.notes)
    if run_id and any(run_id in t for t in texts):
        return  # the report names this run: it would be wrong for the next one
    _write(directory, key, {"format": MEMO_FORMAT, "key": key, "kind": "plan", "host": plan.host, "role": plan.role,
                            "warnings": list(plan.warnings), "notes": list(plan.notes), "tasks_ok": plan.tasks_ok,
                            "state_dir": plan.state_dir})


def _write(directory: Path, key: str, entry: dict[str, Any]) -> None:
    local_memo.write_entry(directory, key, entry, MAX_ENTRIES)


def plan_or_recall(role: str, facts: "PlanFacts", inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any],
                   run_id: str | None, journal: list[dict[str, Any]], plan: Callable[[], "Plan"],
                   recall_kept: bool = True) -> "Plan":
    """``plan()``, unless the same inputs gave an empty plan before (see the module docstring).
    ``recall_kept=False`` (``--flush-cache``): planned in any case, and an empty plan kept again."""
    import logging

    from gpuops.apply.journal import fold_runs

    directory = memo_dir()
    if directory is None or any(r["outcome"].startswith("unfinished") for r in fold_runs(journal)):
        return plan()
    key = inputs_digest(role, facts, inventory_vars, extra_vars)
    if key is None:
        return plan()
    recalled = recall(directory, key, facts, role) if recall_kept else None
    if recalled is not None:
        logging.getLogger(_LOG).info("%s: plan: inputs unchanged since an empty plan (digest %s), not planned again",
                                     facts.host, key[:16])
        return recalled
    computed = plan()
    remember(directory, key, computed, run_id)
    return computed


# ---------------------------------------------------------------- the fact-free pass (discover)

_DISCOVERY_FIELDS = {"paths", "needs_gate_scan", "state_dir", "python", "warnings", "container", "desired_path"}
_CONTAINER_FIELDS = {"container", "image", "python"}


def _discovery_shape_known() -> bool:
    """Only a Discovery (and ContainerTarget) of the shape this module stores is kept: a field added
    later is never silently dropped."""
    from gpuops.facts.container_python import ContainerTarget
    from gpuops.plan.planner import Discovery

    return ({f.name for f in dataclasses.fields(Discovery)} == _DISCOVERY_FIELDS
            and {f.name for f in dataclasses.fields(ContainerTarget)} == _CONTAINER_FIELDS)


def discover_or_recall(role: str, host: str, inventory_vars: Mapping[str, Any], extra_vars: Mapping[str, Any],
                       discover: Callable[[], Any]) -> Any:
    """``discover()`` (the planner's fact-free pass: pure in gpuops' code, the role and the
    variables), or what it returned before for the same inputs. Refusals are never kept: they
    are raised again by ``discover()`` itself."""
    directory = memo_dir()
    variables = _vars_digest(inventory_vars, extra_vars)
    if directory is None or variables is None or not _discovery_shape_known():
        return discover()
    key = hashlib.sha256(json.dumps([MEMO_FORMAT, "discovery", code_digest(), role, host, variables]).encode()).hexdigest()
    recalled = _recall_discovery(directory, key, role, host)
    if recalled is not None:
        return recalled
    found = discover()
    container = found.container
    _write(directory, key, {"format": MEMO_FORMAT, "key": key, "kind": "discovery", "host": host, "role": role,
                            "paths": list(found.paths), "needs_gate_scan": bool(found.needs_gate_scan),
                            "state_dir": found.state_dir, "python": found.python, "warnings": list(found.warnings),
                            "desired_path": found.desired_path,
                            "container": None if container is None else {k: getattr(container, k) for k in sorted(_CONTAINER_FIELDS)}})
    return found


def _recall_discovery(directory: Path, key: str, role: str, host: str) -> Any:
    from gpuops.facts.container_python import ContainerTarget
    from gpuops.plan.planner import Discovery

    try:
        data = json.loads(_entry_path(directory, key).read_text(encoding="utf-8"))
        if (data.get("format") != MEMO_FORMAT or data.get("key") != key or data.get("kind") != "discovery"
                or data.get("host") != host or data.get("role") != role):
            return None
        container = data["container"]
        if container is not None:
            container = ContainerTarget(**{k: container[k] for k in _CONTAINER_FIELDS})
        texts = [*data["paths"], *data["warnings"], data["state_dir"], data["python"]]
        if not all(isinstance(t, str) for t in texts) or not isinstance(data["needs_gate_scan"], bool):
            return None
        if data["desired_path"] is not None and not isinstance(data["desired_path"], str):
            return None
        return Discovery(paths=tuple(data["paths"]), needs_gate_scan=data["needs_gate_scan"], state_dir=data["state_dir"],
                         python=data["python"], warnings=tuple(data["warnings"]), container=container,
                         desired_path=data["desired_path"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
