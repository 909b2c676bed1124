"""A lab host's launch configuration (``sglang.env``, ``sglang-launch.sh``), rendered by the
sglang-service role itself, so a lab host starts exactly as gpuops would have set it up and the
first `apply` shows only the change it is about. Also the sh quoting the lab's wrapper scripts use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role


def single_quoted(value: str) -> str:
    """sh single quotes, always (also what systemd's EnvironmentFile= reads)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def write_launch_files(state: Path, host: str, python: str, args: Sequence[str], env: Mapping[str, str],
                       port: int) -> None:
    """Render the `process` manager's files for a new host with the sglang-service role; write them."""

    role_vars = {
        "sglang_manager": "process", "sglang_python": python, "sglang_args": list(args),
        "sglang_port": port, "sglang_env": dict(env), "gpuops_state_dir": str(state),
    }
    paths = discover("sglang-service", host, role_vars, {}).paths  # a new host: none exist yet
    facts = PlanFacts(host=host, files={p: FileState(path=p, exists=False) for p in paths})
    for change in plan_role("sglang-service", facts, role_vars, {}).changes:
        target = Path(change.path)
        if target.parent != state:
            raise GpuopsError(f"lab: the sglang-service role wrote outside the host's state dir: {target}")
        target.write_text(change.after)
        if change.mode:
            target.chmod(int(change.mode, 8))
