"""The desired-state file, ``gpuops_state_dir/desired.json``: its format and what it composes to.

Each run that changes the launch records its contribution there, keyed by role (``plan/compose.py``
plans it); the launch is the inventory plus every contribution still in effect, later ones winning.
Pure and below both of its readers: the plan writes it (``plan/compose.py``, ``plan/release.py``),
``inspect`` reports it (``facts/managed.py``), a recomposition reads it (``apply/recompose.py``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from gpuops.errors import GpuopsError
from gpuops.release.flags import merge_flags

SCHEMA = 1
COMMENT = ("managed by gpuops: the launch flags and environment each gpuops run still in effect adds "
           "to the inventory's; `gpuops rollback` of a run removes its part. Do not edit.")


def read_desired(text: str | None, where: str) -> dict[str, dict[str, Any]]:
    """The contributions recorded on the host (role -> {args, env, run_id}); {} when none."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise GpuopsError(f"{where}: not valid JSON ({exc}); restore it with `gpuops rollback` or remove it") from None
    runs = data.get("contributions") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
        raise GpuopsError(f"{where}: expected {{\"contributions\": {{ROLE: {{args, env, run_id}}}}}}")
    return {str(k): dict(v) for k, v in runs.items()}


def render_desired(contributions: Mapping[str, Mapping[str, Any]]) -> str:
    return json.dumps({"schema": SCHEMA, "comment": COMMENT, "contributions": contributions}, indent=2) + "\n"


def composed(contributions: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Flags and environment of all contributions, older first (later ones win); the image of the
    latest contribution that names one (a docker server's derived image) with the inventory image
    it stands in for (``image_base``: the launch uses it only while the inventory still names that)."""
    args = merge_flags(*[c.get("args") or [] for c in contributions.values()])
    drop = list(dict.fromkeys(str(f) for c in contributions.values() for f in c.get("drop") or []))
    env: dict[str, str] = {}
    image, image_base, python = "", "", ""
    renames: dict[str, list[str]] = {}
    for contribution in contributions.values():
        env.update({str(k): str(v) for k, v in (contribution.get("env") or {}).items()})
        if contribution.get("image"):
            image, image_base = str(contribution["image"]), str(contribution.get("image_base") or "")
        if contribution.get("python"):  # sglang-release: the environment the launch runs from
            python = str(contribution["python"])
            renames = {str(k): [str(w) for w in v] for k, v in (contribution.get("renames") or {}).items()}
    runs = [{"role": role, "run_id": c.get("run_id")} for role, c in contributions.items()]
    result = {"args": args, "env": env, "runs": runs, "image": image, "image_base": image_base, "python": python,
              "renames": renames}
    if drop:  # inventory flags a run takes out of the launch (tune's run without speculation)
        result["drop"] = drop
    return result
