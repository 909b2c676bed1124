"""Unified diffs of planned file changes (what --diff prints)."""

from __future__ import annotations

import difflib


def unified_diff(path: str, before: str | None, after: str) -> str:
    old = [] if before is None else before.splitlines(keepends=True)
    new = after.splitlines(keepends=True)
    lines = difflib.unified_diff(
        old, new,
        fromfile="/dev/null" if before is None else f"{path} (before)",
        tofile=f"{path} (after)",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
