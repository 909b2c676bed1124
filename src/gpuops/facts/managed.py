"""What gpuops manages in a host's launch: the composed desired state (plan/compose.py) as a fact.

``inspect host`` shows it ("managed by gpuops: flags ..., env ..., from runs ..."), so an operator
sees which runs still in effect shape the server's launch, and which one to roll back.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpuops.gather import Probe, ProbeOutput

DEFAULT_STATE_DIR = "/var/lib/gpuops"


def managed_launch_probe(state_dir: str | None) -> Probe[Any]:
    path = f"{state_dir or DEFAULT_STATE_DIR}/desired.json"
    # Exit 0 with no output when absent: a host gpuops never composed anything on.
    return Probe("gpuops.desired", f"if [ -r {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi", parse_managed)


def parse_managed(output: ProbeOutput) -> dict[str, Any] | None:
    """{"args", "env" (values masked), "runs": [{role, run_id}]}, None when nothing is recorded."""
    from gpuops.errors import GpuopsError
    from gpuops.plan.compose import composed, read_desired
    from gpuops.secret_policy import mask_env

    try:
        contributions = read_desired(output.stdout.strip() or None, "desired.json")
    except GpuopsError as exc:
        return {"args": [], "env": {}, "runs": [], "error": str(exc)}
    if not contributions:
        return None
    result = composed(contributions)
    from gpuops.secret_policy import mask_args

    result["args"] = mask_args(result["args"])
    result["env"] = mask_env(result["env"])
    return result


def describe(managed: dict[str, Any] | None) -> str | None:
    """One line for humans."""
    if not managed:
        return None
    if managed.get("error"):
        return f"managed by gpuops: {managed['error']}"
    parts = []
    if managed["args"]:
        parts.append("flags " + " ".join(managed["args"]))
    if managed["env"]:
        parts.append("env " + " ".join(f"{k}={v}" for k, v in managed["env"].items()))
    runs = ", ".join(f"{r['role']} ({r.get('run_id') or '?'})" for r in managed["runs"])
    return f"managed by gpuops: {'; '.join(parts) or 'nothing'}; from runs {runs}"
