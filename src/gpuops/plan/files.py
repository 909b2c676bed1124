"""The files a task manages, as every planner sees them: its destination checked, its mode read,
the file as gathered from the host, and the change recorded when the wanted content differs.
Shared by the task modules (``modules.py``, ``compose.py``, ``release.py``), below all of them."""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from gpuops.errors import GpuopsError
from gpuops.plan.changes import Change
from gpuops.plan.diff import unified_diff
from gpuops.plan.model import FileState
from gpuops.secret_policy import mask_text

if TYPE_CHECKING:
    from gpuops.plan.state import PlanState
    from gpuops.plan.task import Task

_MODE = re.compile(r"^0?[0-7]{3,4}$")


def normalize_mode(value: object, where: str) -> str | None:
    """YAML reads ``mode: 0644`` as the int 420 and ``"0644"`` as text; both mean octal 644."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        text = format(value, "04o")  # PyYAML already read 0644 as octal (420)
    else:
        text = str(value)
    if not _MODE.match(text):
        raise GpuopsError(f"{where}: mode {value!r} is not an octal file mode like '0644'")
    return "0" + text[-3:] if len(text) == 3 else text.zfill(4)


def absolute_dest(path: object, where: str) -> str:
    """A task's destination: a plain absolute path (no ``..``, ``//`` or newline), else one error."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise GpuopsError(f"{where}: destination {path!r} must be an absolute path")
    normal = posixpath.normpath(path)
    if normal != path.rstrip("/") or "\n" in path:
        raise GpuopsError(f"{where}: destination {path!r} must be a plain absolute path (no .., //)")
    return path


def gathered_file(state: "PlanState", path: str, where: str) -> FileState:
    """The file at ``path`` as the gather found it on the host (a managed file must be UTF-8 text)."""
    assert state.facts is not None
    current = state.facts.files.get(path)
    if current is None:
        raise GpuopsError(f"{where}: internal: {path} was not gathered from {state.facts.host}")
    if current.exists and current.content is None:
        why = current.problem or "is not a UTF-8 text file"
        raise GpuopsError(f"{state.facts.host}: {path} {why}; gpuops manages regular UTF-8 text files")
    return current


def record_file(state: "PlanState", task: "Task", kind: str, path: str, after: str, mode: str | None) -> bool:
    """Compare the wanted content with the gathered file; record a Change if they differ."""
    current = gathered_file(state, path, task.where)
    before = current.content if current.exists else None
    if current.exists and before == after and (mode is None or mode == current.mode):
        return False
    action = "create" if not current.exists else ("update" if before != after else "mode")
    diff = unified_diff(path, before, after) if action != "mode" else f"mode {current.mode} -> {mode}\n"
    state.add_change(Change(
        kind=kind, path=path, action=action, before=before, after=after,
        diff=mask_text(diff, state.secrets), mode=mode, task=task.where, notify=task.notify,
    ))
    return True
