"""What gpuops manages in a host's launch: the composed desired state (plan/compose.py) as a fact.

``inspect host`` shows it ("managed by gpuops: flags ..., env ..., from runs ..."), so an operator
sees which runs still in effect shape the server's launch, and which one to roll back; and the
SGLang release environments gpuops built under ``gpuops_envs_dir`` (sglang-release), the one the
launch runs marked.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpuops.gather import Probe, ProbeOutput
from gpuops.errors import GpuopsError
from gpuops.desired_state import composed, read_desired
from gpuops.secret_policy import mask_args, mask_env

DEFAULT_STATE_DIR = "/var/lib/gpuops"
DEFAULT_ENVS_DIR = "/opt/gpuops/envs"  # roles/sglang-release/defaults.yml
_ENVS = "#--gpuops-envs--"


def managed_launch_probe(state_dir: str | None, envs_dir: str | None = None) -> Probe[Any]:
    path = shlex.quote(f"{state_dir or DEFAULT_STATE_DIR}/desired.json")
    envs = shlex.quote(envs_dir or DEFAULT_ENVS_DIR)
    # Exit 0 with no output when absent: a host gpuops never composed anything on. Then each
    # finished release environment: its marker's path, and the marker on one line.
    script = (f"if [ -r {path} ]; then cat {path}; fi; echo; echo '{_ENVS}'; "
              f"for gpuops_m in {envs}/sglang-*/.gpuops-env.json; do [ -r \"$gpuops_m\" ] || continue; "
              "printf '%s\\n' \"$gpuops_m\"; tr '\\n' ' ' <\"$gpuops_m\"; echo; done")
    return Probe("gpuops.desired", script, parse_managed)


def _environments(text: str, launched: str) -> list[dict[str, Any]]:
    import json

    lines = [ln for ln in text.splitlines() if ln.strip()]
    out = []
    for marker, record in zip(lines[0::2], lines[1::2]):
        try:
            data = json.loads(record)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        path = marker.rsplit("/", 1)[0]
        out.append({"path": path, "version": data.get("version"), "created": data.get("created"),
                    "tool": data.get("tool"), "launched": launched == f"{path}/bin/python"})
    return out


def parse_managed(output: ProbeOutput) -> dict[str, Any] | None:
    """{"args", "env" (values masked), "runs": [{role, run_id}], "environments": [...]}, None when
    nothing is recorded and gpuops built no release environment."""

    desired, _, envs = output.stdout.partition(_ENVS)
    try:
        contributions = read_desired(desired.strip() or None, "desired.json")
    except GpuopsError as exc:
        return {"args": [], "env": {}, "runs": [], "error": str(exc)}
    result = composed(contributions)
    environments = _environments(envs, str(result.get("python") or ""))
    if not contributions and not environments:
        return None
    if environments:
        result["environments"] = environments

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
    if managed.get("python"):
        parts.append(f"python {managed['python']}")
    runs = ", ".join(f"{r['role']} ({r.get('run_id') or '?'})" for r in managed["runs"])
    lines = [f"managed by gpuops: {'; '.join(parts) or 'nothing'}; from runs {runs}"] if managed["runs"] else []
    for env in managed.get("environments") or []:
        mark = "launched" if env["launched"] else "kept"
        lines.append(f"release environment: {env['path']} (sglang {env.get('version') or '?'}, {mark}; "
                     f"built {env.get('created') or '?'})")
    return "\n".join(lines) or None
