"""The seam to the gates part: its pure gate patch plan, as file changes for a role.

``gpuops.gates.patch.plan_gate_patch(scan, sources, feature, target_sm)`` decides what to widen;
this module only turns its ``GatePatchPlan`` into (absolute path, before, after) triples, launch
flags and notes.
"""

from __future__ import annotations

import posixpath

from gpuops.errors import GpuopsError
from gpuops.plan.model import PlanFacts
from gpuops.gates.patch import plan_gate_patch
from gpuops.frozen import frozen


@frozen
class PatchChanges:
    """A gate patch plan as a role's changes: absolute paths with their texts before and after, the launch flags
    and the plan's notes."""

    files: tuple[tuple[str, str, str], ...]     # (absolute path, before, after)
    launch_flags: tuple[str, ...]
    notes: tuple[str, ...]                      # the plan's own (what was widened, what stays closed)


def patch_changes(facts: PlanFacts | None, feature: str, target_sm: str, host: str) -> PatchChanges:
    if facts is None or facts.gate_scan is None:
        raise GpuopsError(f"{host}: the gate scan did not come back; cannot plan the {feature} patch")
    scan = facts.gate_scan
    if not scan.known:
        raise GpuopsError(f"{host}: cannot scan the installed SGLang: {scan.reason or 'unknown reason'}")

    plan = plan_gate_patch(scan, dict(scan.sources or {}), feature, target_sm)
    if plan.changes and not scan.root:
        raise GpuopsError(f"{host}: the {feature} patch names {plan.changes[0].path} but the scan has no package root")
    # The plan's paths are relative to the sglang package dir the scan found.
    files = tuple((posixpath.join(str(scan.root), change.path), change.before, change.after)
                  for change in plan.changes)
    return PatchChanges(files, plan.launch_args, plan.notes)
