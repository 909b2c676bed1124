r"""The launch environment file: ``KEY='value'`` lines, read by sh (sourced with ``set -a``, the
process manager) and by systemd (``EnvironmentFile=``, the systemd manager) alike.

Values are data: quoting makes ``$(...)``, backticks and ``;`` literal when the file is sourced,
so a hostile variable can never run. Names are checked, because a name is not quoted. The two
readers differ: systemd does not read sh's ``'\''`` and treats a backslash inside single quotes as
an escape (checked against systemd 252), so a value holding ``'`` or ``\`` is double-quoted with
``\ " $ ` `` escaped, which both read as the same bytes.
"""

from __future__ import annotations

import re
from typing import Mapping

from gpuops.errors import GpuopsError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_text(value: object) -> str:
    """YAML gives ints and bools; the environment holds text (true -> "1", as NCCL expects)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        raise GpuopsError(f"environment value {value!r} must be a string or number, not a {type(value).__name__}")
    return str(value)


def env_quote(text: str) -> str:
    """Quoted so that sh and systemd's EnvironmentFile= read exactly ``text`` (no newlines here)."""
    if "'" not in text and "\\" not in text:
        return "'" + text + "'"
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return '"' + escaped + '"'


def check_entries(entries: object, where: str) -> dict[str, str]:
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
        lines.append(f"{name}={value}" if style == "docker" else f"{name}={env_quote(value)}")
    return "\n".join(lines) + "\n"
