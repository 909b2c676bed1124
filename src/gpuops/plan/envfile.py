"""The launch environment file: ``KEY='value'`` lines, sh-quoted (sourced with ``set -a``).

Values are data: single quotes make ``$(...)``, backticks and ``;`` literal when the file is
sourced, so a hostile variable can never run. Names are checked, because a name is not quoted.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from gpuops.errors import GpuopsError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_text(value: Any) -> str:
    """YAML gives ints and bools; the environment holds text (true -> "1", as NCCL expects)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        raise GpuopsError(f"environment value {value!r} must be a string or number, not a {type(value).__name__}")
    return str(value)


def sh_single_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def check_entries(entries: Mapping[str, Any], where: str) -> dict[str, str]:
    if not isinstance(entries, Mapping):
        raise GpuopsError(f"{where}: environment entries must be a mapping, got {type(entries).__name__}")
    checked: dict[str, str] = {}
    for name, value in entries.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise GpuopsError(f"{where}: {name!r} is not a valid environment variable name")
        text = env_text(value)
        if "\n" in text or "\r" in text or "\0" in text:
            raise GpuopsError(f"{where}: the value of {name} contains a newline or NUL byte")
        checked[name] = text
    return checked


def render_env_file(entries: Mapping[str, str], header: str, style: str = "sh") -> str:
    """One line per variable, sorted so that the same variables always give the same bytes.

    ``style="docker"``: ``docker --env-file`` takes values verbatim (no quoting), so none is added.
    """
    lines = [f"# {line}" for line in header.splitlines()]
    for name in sorted(entries):
        value = entries[name]
        lines.append(f"{name}={value}" if style == "docker" else f"{name}={sh_single_quote(value)}")
    return "\n".join(lines) + "\n"
