"""The seam to the gates part: its pure fusion patch plan, as file changes for a role.

``gpuops.gates.patch.plan_fusion_patch(scan, sources, target_sm)`` decides what to widen; this
module only turns its answer into (absolute path, before, after) triples, launch flags and notes.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from gpuops.errors import GpuopsError
from gpuops.plan.model import HostFacts


@dataclass(frozen=True)
class PatchChanges:
    files: tuple[tuple[str, str, str], ...]     # (absolute path, before, after)
    launch_flags: tuple[str, ...]
    notes: tuple[str, ...]


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def _root_of(scan: Any) -> str | None:
    return _get(scan, "root", "sglang_root", "package_dir")


def patch_changes(facts: HostFacts | None, target_sm: str, host: str) -> PatchChanges:
    if facts is None or facts.gate_scan is None:
        raise GpuopsError(f"{host}: the gate scan did not come back; cannot plan the fusion patch")
    scan = facts.gate_scan
    reason = _get(scan, "reason")
    if _get(scan, "known", default=True) is False:
        raise GpuopsError(f"{host}: cannot scan the installed SGLang: {reason or 'unknown reason'}")
    from gpuops.gates.patch import plan_fusion_patch

    plan = plan_fusion_patch(scan, dict(facts.gate_sources or {}), target_sm=target_sm)
    root = _root_of(scan)
    files = []
    for item in _get(plan, "files", "changes", default=()) or ():
        path = str(_get(item, "path", "abs_path", "file"))
        if not path.startswith("/"):
            if not root:
                raise GpuopsError(f"{host}: fusion patch names {path} but the scan has no package root")
            path = posixpath.join(str(root), path)
        before = _get(item, "before", "before_text", "old")
        after = _get(item, "after", "after_text", "new")
        files.append((path, before, after))
    flags = _get(plan, "launch_flags", default=None)
    if flags is None:
        flag = _get(plan, "launch_flag", "flag")
        value = _get(plan, "flag_value")
        flags = ([flag] + ([str(value)] if value is not None else [])) if flag else []
    elif isinstance(flags, str):
        flags = [flags]
    notes = [str(n) for n in (_get(plan, "notes", default=()) or ())]
    for closed in _get(plan, "left_closed", default=()) or ():
        text = (f"left closed: {_get(closed, 'file')}:{_get(closed, 'line')} ({_get(closed, 'function')}): "
                f"{_get(closed, 'why')}")
        where = f"{_get(closed, 'file')}:{_get(closed, 'line')}"
        if not any(where in note for note in notes):  # the gates part may already say so
            notes.append(text)
    return PatchChanges(tuple(files), tuple(str(f) for f in flags), tuple(notes))
