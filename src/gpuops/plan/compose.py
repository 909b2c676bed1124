"""Desired state that composes: what the server runs is the inventory plus every run still in effect.

A role that changes the launch (fusion-sm120 adds a flag, nccl-env adds NCCL variables) records its
*contribution* in one JSON file on the host, ``gpuops_state_dir/desired.json``, keyed by role. The
launch files are then rendered from the inventory and ALL contributions, not from the variables of
the role that happens to run, so ``nccl-env`` after ``fusion-sm120`` keeps the fusion flag and
``fusion-sm120`` after ``nccl-env`` keeps the NCCL variables.

The file is an ordinary file of the plan: the apply transaction backs it up with the launch files
and a rollback restores it with them, so undoing a run removes exactly that run's contribution (and
the launch files go back to what they were with the contributions that remain).

The file's format and what the contributions compose to are ``gpuops/desired_state.py``'s, below
facts: ``inspect`` reports them too (``facts/managed.py``).

A contribution that is unchanged keeps its record (and its run id), so re-applying a role is a
no-op; a changed one moves to the end (the latest run wins where two set the same flag or name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from gpuops.desired_state import ComposedLaunch, Contribution, composed, read_desired, render_desired
from gpuops.errors import GpuopsError
from gpuops.plan.files import absolute_dest, gathered_file, normalize_mode, record_file
from gpuops.plan.changes import Change
from gpuops.plan.diff import unified_diff
from gpuops.plan.envfile import check_entries

if TYPE_CHECKING:
    from gpuops.plan.argspec import TaskArgs
    from gpuops.plan.state import PlanState
    from gpuops.plan.task import Task
    from gpuops.plan.templating import VarScope

class ComposeResult(ComposedLaunch, total=False):
    """The ``compose`` module's result (registered for the launch templates): the composed launch,
    ``drop`` always, and whether desired.json changed."""

    changed: bool


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _mapped(value: object) -> dict[str, object]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _part(contribution: Mapping[str, object]) -> Contribution:
    """What of a contribution is compared: its launch parts, not its run id."""
    part: Contribution = {"args": _listed(contribution.get("args")), "env": _mapped(contribution.get("env"))}
    if contribution.get("drop"):
        part["drop"] = [str(f) for f in _listed(contribution["drop"])]
    if contribution.get("image"):
        part.update(image=str(contribution["image"]), image_base=str(contribution.get("image_base") or ""))
    if contribution.get("python"):
        part.update(python=str(contribution["python"]),
                    renames={k: [str(w) for w in _listed(v)] for k, v in _mapped(contribution.get("renames")).items()})
    return part


def with_contribution(contributions: Mapping[str, Mapping[str, object]], role: str, args: list[str],
                      env: Mapping[str, str], run_id: str | None, image: str = "",
                      image_base: str = "", python: str = "",
                      renames: Mapping[str, object] | None = None, drop: Iterable[str] = ()) -> dict[str, Contribution]:
    """``contributions`` with ``role``'s part replaced: kept as is when equal, dropped when empty."""
    out = {k: dict(v) for k, v in contributions.items()}
    mine = _part({"args": list(args), "env": dict(sorted(env.items())), "image": image, "image_base": image_base,
                  "python": python, "renames": dict(renames or {}), "drop": list(drop)})
    old = out.get(role)
    if old is not None and _part(old) == mine:
        return out
    out.pop(role, None)
    if mine["args"] or mine["env"] or mine.get("image") or mine.get("python") or mine.get("drop"):
        out[role] = {**mine, "run_id": run_id}
    return out


def without_run(current: Mapping[str, Mapping[str, object]], before: Mapping[str, Mapping[str, object]],
                role: str) -> dict[str, Contribution]:
    """The contributions with one run's part taken out: ``role``'s part goes back to what it was
    before that run (``before``: desired.json as the run found it), every other part stays.

    Parts that predate the run and are unchanged keep their place; parts written after it follow,
    in their current order (so "later wins" still holds between the parts that remain)."""
    out: dict[str, Contribution] = {}
    for name, record in before.items():
        if name == role:
            out[name] = dict(record)
        elif name in current and dict(current[name]) == dict(record):
            out[name] = dict(current[name])
    for name, record in current.items():
        if name != role and name not in out:
            out[name] = dict(record)
    return out


def _delete_desired(state: "PlanState", task: "Task", dest: str) -> bool:
    """No part is left: desired.json goes (as before gpuops' first contribution), not an empty file."""

    current = gathered_file(state, dest, task.where)
    if not current.exists:
        return False
    state.add_change(Change(kind="desired", path=dest, action="delete", before=current.content, after="",
                            diff=unified_diff(dest, current.content, ""), mode=None, task=task.where,
                            notify=task.notify))
    return True


def plan_compose(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> ComposeResult:
    """The ``compose`` module: record this run's contribution, return the composed launch."""

    dest = absolute_dest(args["dest"], task.where)
    where = f"{state.host}: {task.where}"
    flags = args.get("args") or []
    if not isinstance(flags, (list, tuple)) or any(isinstance(f, (dict, list)) for f in flags):
        raise GpuopsError(f"{where}: compose args must be a list of launch words, not {flags!r}")
    env = check_entries(args.get("env") or {}, where)
    state.desired_path = dest
    if state.discovery:
        state.paths.add(dest)
        return {"args": [], "env": {}, "runs": [], "image": "", "image_base": "", "python": "", "renames": {}, "drop": [],
                "changed": False}
    current = gathered_file(state, dest, task.where)
    recorded = read_desired(current.content if current.exists else None, f"{state.host}: {dest}")
    if state.recompose is not None:  # a rollback by recomposition: everything but the undone run's part
        wanted = state.recompose(recorded, dest)
        result: ComposeResult = {**composed(wanted)}
        result.setdefault("drop", [])  # the launch template reads it (sglang-service's defaults)
        result["changed"] = (record_file(state, task, "desired", dest, render_desired(wanted),
                                         normalize_mode(args.get("mode", "0600"), task.where))
                             if wanted else _delete_desired(state, task, dest))
        return result
    image, image_base = str(args.get("image") or ""), str(args.get("image_base") or "")
    python = str(args.get("python") or "")
    renames = args.get("renames") or {}
    if not isinstance(renames, dict):
        raise GpuopsError(f"{where}: compose renames must map a flag to its replacement words, not {renames!r}")
    drop = args.get("drop") or []
    if not isinstance(drop, (list, tuple)) or not all(isinstance(f, str) and f.startswith("--") for f in drop):
        raise GpuopsError(f"{where}: compose drop must be a list of launch flags (--name), not {drop!r}")
    wanted = with_contribution(recorded, state.role, [str(f) for f in flags], env, state.run_id, image, image_base,
                               python, renames, drop)
    changed = False
    if wanted != recorded and (current.exists or wanted):
        mode = normalize_mode(args.get("mode", "0600"), task.where)
        changed = record_file(state, task, "desired", dest, render_desired(wanted), mode)
    result = {**composed(wanted)}
    result.setdefault("drop", [])
    result["changed"] = changed
    launch_image = str(args.get("launch_image") or "")
    if result["image"] and launch_image and result["image_base"] != launch_image and result["image"] != launch_image:
        # The derived image patches another image than the one the inventory now names (an upgrade):
        # the launch takes the new image, unpatched. Said out loud, never silently. (The inventory
        # naming the very image a run put in place, sglang-release's, is no such upgrade.)
        owner = next((role for role, c in wanted.items() if c.get("image") == result["image"]), "a gpuops run")
        state.warn(f"the image {result['image']} that {owner} built patches {result['image_base']}, but "
                   f"sglang_docker_image is now {launch_image}: the server runs {launch_image} without that patch; "
                   f"apply {owner} again to patch it")
    return result
