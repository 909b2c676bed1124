"""What gpuops manages in a host's launch: the composed desired state (plan/compose.py) as a fact.

``inspect host`` shows it ("managed by gpuops: flags ..., env ..., from runs ..."), so an operator
sees which runs still in effect shape the server's launch, and which one to roll back; and the
SGLang release environments gpuops built under ``gpuops_envs_dir`` (sglang-release), the one the
launch runs marked.
"""

from __future__ import annotations

import json
import shlex
from typing import TypedDict, TypeGuard

from gpuops.gather import Probe, ProbeOutput
from gpuops.errors import GpuopsError
from gpuops.desired_state import RunRef, composed, read_desired
from gpuops.secret_policy import mask_args, mask_env

DEFAULT_STATE_DIR = "/var/lib/gpuops"
DEFAULT_ENVS_DIR = "/opt/gpuops/envs"  # roles/sglang-release/defaults.yml
_ENVS = "#--gpuops-envs--"


class ReleaseEnvironment(TypedDict):
    """A release environment gpuops built (sglang-release), from its marker: the fields as written."""

    path: str
    version: object
    created: object
    tool: object
    launched: bool  # the launch runs its python


class ManagedLaunch(TypedDict, total=False):
    """``managed_launch`` of the inspect document: the composed launch (``desired_state.composed``,
    its values masked) and the release environments; only args, env, runs and error when
    desired.json cannot be read."""

    args: list[str]
    env: dict[str, str]
    runs: list[RunRef]
    image: str
    image_base: str
    python: str
    renames: dict[str, list[str]]
    drop: list[str]
    environments: list[ReleaseEnvironment]
    error: str


def managed_launch_probe(state_dir: str | None, envs_dir: str | None = None) -> Probe[ManagedLaunch | None]:
    path = shlex.quote(f"{state_dir or DEFAULT_STATE_DIR}/desired.json")
    envs = shlex.quote(envs_dir or DEFAULT_ENVS_DIR)
    # Exit 0 with no output when absent: a host gpuops never composed anything on. Then each
    # finished release environment: its marker's path, and the marker on one line.
    script = (f"if [ -r {path} ]; then cat {path}; fi; echo; echo '{_ENVS}'; "
              f"for gpuops_m in {envs}/sglang-*/.gpuops-env.json; do [ -r \"$gpuops_m\" ] || continue; "
              "printf '%s\\n' \"$gpuops_m\"; tr '\\n' ' ' <\"$gpuops_m\"; echo; done")
    return Probe("gpuops.desired", script, parse_managed)


def _environments(text: str, launched: str) -> list[ReleaseEnvironment]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    out: list[ReleaseEnvironment] = []
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


def parse_managed(output: ProbeOutput) -> ManagedLaunch | None:
    """{"args", "env" (values masked), "runs": [{role, run_id}], "environments": [...]}, None when
    nothing is recorded and gpuops built no release environment."""

    desired, _, envs = output.stdout.partition(_ENVS)
    try:
        contributions = read_desired(desired.strip() or None, "desired.json")
    except GpuopsError as exc:
        return {"args": [], "env": {}, "runs": [], "error": str(exc)}
    result: ManagedLaunch = {**composed(contributions)}
    environments = _environments(envs, str(result.get("python") or ""))
    if not contributions and not environments:
        return None
    if environments:
        result["environments"] = environments

    result["args"] = mask_args(result["args"])
    result["env"] = mask_env(result["env"])
    return result


def is_managed_launch(value: object) -> TypeGuard[ManagedLaunch]:
    """``parse_managed``'s answer, as the gather hands it on by probe name: a JSON object whose
    launch parts (args, env, runs) are of their kinds where present."""
    return (isinstance(value, dict) and isinstance(value.get("args", []), list)
            and isinstance(value.get("env", {}), dict) and isinstance(value.get("runs", []), list))


def describe(managed: ManagedLaunch | None) -> str | None:
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
