"""``sglang.env`` and ``sglang-launch.sh`` in the format pinned in docs/INTERFACES.md (pure text)."""

from __future__ import annotations

import re
import shlex
from typing import Mapping, Sequence

from gpuops.errors import GpuopsError

ENV_FILE = "sglang.env"
LAUNCH_SCRIPT = "sglang-launch.sh"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def single_quoted(value: str) -> str:
    """sh single quotes, always (also what systemd's EnvironmentFile= reads)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def env_file_text(env: Mapping[str, str]) -> str:
    lines = ["# SGLang server environment (gpuops): one KEY='value' per line"]
    for key, value in env.items():
        if not _NAME.match(key):
            raise GpuopsError(f"sglang env: {key!r} is not a valid variable name")
        if "\n" in value or "\0" in value:
            raise GpuopsError(f"sglang env: the value of {key} holds a newline or NUL")
        lines.append(f"{key}={single_quoted(value)}")
    return "\n".join(lines) + "\n"


def launch_script_text(python: str, args: Sequence[str], env_file: str) -> str:
    words = [python, "-m", "sglang.launch_server", *args]
    return (
        "#!/bin/sh\n"
        "# Launches the SGLang server (gpuops): environment from sglang.env, then the server.\n"
        "set -a\n"
        f". {shlex.quote(env_file)}\n"
        "set +a\n"
        f"exec {' '.join(shlex.quote(w) for w in words)}\n"
    )
