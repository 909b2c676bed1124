"""The desired-state file, ``gpuops_state_dir/desired.json``: its format and what it composes to.

Each run that changes the launch records its contribution there, keyed by role (``plan/compose.py``
plans it); the launch is the inventory plus every contribution still in effect, later ones winning.
Pure and below both of its readers: the plan writes it (``plan/compose.py``, ``plan/release.py``),
``inspect`` reports it (``facts/managed.py``), a recomposition reads it (``apply/recompose.py``).
"""

from __future__ import annotations

import json
from typing import Mapping, TypedDict

from gpuops.errors import GpuopsError
from gpuops.release.flags import merge_flags

SCHEMA = 1
COMMENT = ("managed by gpuops: the launch flags and environment each gpuops run still in effect adds "
           "to the inventory's; `gpuops rollback` of a run removes its part. Do not edit.")


# One run's part of desired.json (args, env, run_id; image, image_base, python, renames, drop where
# set), as read back: checked to be a JSON object, each value narrowed where it is read (``composed``).
Contribution = dict[str, object]


class RunRef(TypedDict):
    """A run still in effect: the role and its run id (as recorded)."""

    role: str
    run_id: object


class _Launch(TypedDict):
    args: list[str]
    env: dict[str, str]
    runs: list[RunRef]
    image: str
    image_base: str
    python: str
    renames: dict[str, list[str]]


class ComposedLaunch(_Launch, total=False):
    """What all contributions compose to (``composed``): the launch's flags and environment, the
    runs they come from, the derived image and release environment in effect."""

    drop: list[str]  # only when a run takes inventory flags out of the launch


def _words(value: object) -> list[object]:
    """A recorded list (args, drop, a rename's words); anything else is no words."""
    return list(value) if isinstance(value, (list, tuple)) else []


def _entries(value: object) -> dict[str, object]:
    """A recorded mapping (env, renames); anything else is no entries."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def read_desired(text: str | None, where: str) -> dict[str, Contribution]:
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


def render_desired(contributions: Mapping[str, Mapping[str, object]]) -> str:
    return json.dumps({"schema": SCHEMA, "comment": COMMENT, "contributions": contributions}, indent=2) + "\n"


def composed(contributions: Mapping[str, Mapping[str, object]]) -> ComposedLaunch:
    """Flags and environment of all contributions, older first (later ones win); the image of the
    latest contribution that names one (a docker server's derived image) with the inventory image
    it stands in for (``image_base``: the launch uses it only while the inventory still names that)."""
    args = merge_flags(*[_words(c.get("args")) for c in contributions.values()])
    drop = list(dict.fromkeys(str(f) for c in contributions.values() for f in _words(c.get("drop"))))
    env: dict[str, str] = {}
    image, image_base, python = "", "", ""
    renames: dict[str, list[str]] = {}
    for contribution in contributions.values():
        env.update({k: str(v) for k, v in _entries(contribution.get("env")).items()})
        if contribution.get("image"):
            image, image_base = str(contribution["image"]), str(contribution.get("image_base") or "")
        if contribution.get("python"):  # sglang-release: the environment the launch runs from
            python = str(contribution["python"])
            renames = {k: [str(w) for w in _words(v)] for k, v in _entries(contribution.get("renames")).items()}
    runs: list[RunRef] = [{"role": role, "run_id": c.get("run_id")} for role, c in contributions.items()]
    result: ComposedLaunch = {"args": args, "env": env, "runs": runs, "image": image, "image_base": image_base, "python": python,
              "renames": renames}
    if drop:  # inventory flags a run takes out of the launch (tune's run without speculation)
        result["drop"] = drop
    return result
