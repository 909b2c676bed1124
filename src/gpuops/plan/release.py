"""The ``sglang_release`` module: move a host's server to another SGLang release, as a new
environment beside the running one.

Planning reads the release's own wheel on the operator's machine (``release/wheel.py``: its pins;
``release/flags.py``: its server's flags) and the host's composed launch; it refuses, before any
host is changed, a release that does not exist and a launch flag the release no longer has, and
records the environment to build (``ReleaseEnv``). ``gpuops apply`` builds it before the
transaction (``apply/release_env.py``, host side ``remote/release_env.py``); the transaction then
only points the launch at the new python (the role's contribution to desired.json, see
plan/compose.py) and restarts, so its rollback, like ``gpuops rollback``, is a restart of the old
environment, which nothing touched.

A docker server's release is its image (``ReleaseImage``): the same checks, then the new image is
pulled (or found) and checked from inside before anything stops (``apply/release_image.py``), and
the transaction points the docker run script at it; the old image is never removed, so rollback
recreates the old container from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re
from typing import TYPE_CHECKING

from gpuops.errors import GpuopsError
from gpuops.plan.argspec import Arg, ModuleSpec, TaskArgs, declares, list_arg, number_arg
from gpuops.plan.changes import ReleaseEnv, ReleaseImage, StandingPatch
from gpuops.plan.files import gathered_file
from gpuops.desired_state import composed, read_desired
from gpuops.release.flags import check_launch, release_flags
from gpuops.release.wheel import Release, canonical, release

if TYPE_CHECKING:
    from gpuops.plan.task import Task
    from gpuops.plan.state import PlanState
    from gpuops.plan.templating import VarScope


def release_tag(current_image: str, version: str) -> str:
    """``lmsysorg/sglang:latest`` -> ``lmsysorg/sglang:v0.5.21`` (the release's tag of that repository)."""
    repository = current_image.split("@", 1)[0]
    if repository.rfind(":") > repository.rfind("/"):
        repository = repository[:repository.rfind(":")]
    return f"{repository}:v{version}"


# What docker accepts as a reference (repository[:tag][@digest]); anything else is refused at plan time.
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._/:@+-]{0,254}$", re.I)


def wheelhouse_digest(folder: str) -> str:
    """Names and sizes of the wheelhouse's files: a changed wheelhouse is another environment."""
    from pathlib import Path

    entries = sorted((p.name, p.stat().st_size) for p in Path(folder).expanduser().iterdir() if p.is_file())
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def _env_name(version: str, requirements: list[str], index_url: str, wheelhouse: str, base_python: str) -> str:
    source = wheelhouse_digest(wheelhouse) if wheelhouse else index_url
    blob = json.dumps([requirements, source, base_python])
    return f"sglang-{version}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


# Roles whose runs patch the running release's source, and the catalog feature each patch opens.
# Such a patch belongs to the tree it was planned on: never copied to a new release; the switch
# asks the new tree's own verdict for that feature (apply/runner.py::_release_ready).
SOURCE_PATCH_ROLES = {"fusion-sm120": "flashinfer_allreduce_fusion"}


def _other_parts(state: "PlanState", desired: str) -> tuple[list[str], tuple[StandingPatch, ...]]:
    """Launch flags other gpuops runs still in effect add (fusion-sm120's flag): checked too; and
    the runs among them that patched the running release's source."""

    if not desired:
        return [], ()
    current = gathered_file(state, desired, "sglang_release")
    recorded = read_desired(current.content if current.exists else None, f"{state.host}: {desired}")
    others = {role: c for role, c in recorded.items() if role != state.role}
    patches = tuple(StandingPatch(role, str(others[role].get("run_id") or "?"), feature)
                    for role, feature in sorted(SOURCE_PATCH_ROLES.items()) if role in others)
    return list(composed(others)["args"]), patches


@declares(ModuleSpec("sglang_release", (
    Arg("version", required=True),
    Arg("envs_dir", required=True, doc="absolute"),
    Arg("base_python", default="python3"),
    Arg("index_url"),
    Arg("wheelhouse", doc="a folder on this machine"),
    Arg("extra_packages", "list"),
    Arg("launch_args", "list"),
    Arg("desired", doc="desired.json: other runs' launch flags are checked too"),
    Arg("min_free_gib", "number", default=20),
    Arg("stage", "bool", default=False),
    Arg("keep_envs", "number", default=2),
    Arg("state_dir", doc="absolute: its launch files and runs' backups say which environments are needed"),
    Arg("manager", default="process", doc="process, systemd or docker"),
    Arg("image", doc="docker: the release's image (default: `sglang_docker_image`'s repository, tag `vX`)"),
    Arg("current_image", doc="docker: `sglang_docker_image`, the image it replaces"),
), plans=(
    "reads the release's own wheel on this machine (`sglang_wheelhouse`, else `pip download --no-deps` from "
    "`sglang_index_url` or pip's index, kept under `$GPUOPS_CACHE/releases`): a release that does not exist is "
    "refused before any host is reached; checks every launch flag (the inventory's and other runs' parts) against "
    "the release's own server arguments (`server_args.py`, `arg_groups/`), refusing a flag it does not have and "
    "translating one it calls deprecated, with a note; registers `{python, env_dir, name, version, renames, pins}`. "
    "`apply` builds the environment `<envs_dir>/sglang-X-<digest>` on the host before anything stops "
    "(`remote/release_env.py`: disk space, `uv` or venv + pip, the release's `==` pins of sglang-kernel / "
    "sgl-kernel, flashinfer-python, flashinfer-cubin / -jit-cache and torch installed and checked, torch's CUDA "
    "against the driver's) and shows the gate audit of the new tree against the running one (what the release opens "
    "and closes on this GPU); a refusal there changes nothing. `stage`: only that, the switch is left for a later "
    "run (status `staged`; `--check` then shows the audit too). After a build, finished environments beyond the "
    "`keep_envs` newest are removed unless the launch files or a kept run's backups (its rollback) name them. "
    "`manager: docker`: the release is the `image` (registered as `image`, with `image_base` the `current_image`): "
    "`apply` pulls it before anything stops (its progress on stderr), unless the host has it, and checks inside it "
    "that it holds `sglang==X` and the release's pins, then the gate audit of the image against the running "
    "container; the transaction recreates the container from it, and its rollback from the old image, never removed. "
    "A standing run of a role that patched the running release's source (fusion-sm120) is judged on the new tree "
    "before anything stops: its feature open there by itself, a note; otherwise refused, naming the run")))
def plan_sglang_release(task: "Task", args: TaskArgs, state: "PlanState", scope: "VarScope") -> dict[str, object]:
    where = f"{state.host}: {task.where}"
    version = str(args["version"]).strip()
    envs_dir = str(args["envs_dir"])
    if not envs_dir.startswith("/") or posixpath.normpath(envs_dir) != envs_dir.rstrip("/"):
        raise GpuopsError(f"{where}: gpuops_envs_dir {envs_dir!r} must be a plain absolute path")
    index_url = str(args.get("index_url") or "")
    wheelhouse = str(args.get("wheelhouse") or "")
    extra = [str(p) for p in list_arg(args.get("extra_packages"))]
    desired = str(args.get("desired") or "")
    try:
        found = release(version, wheelhouse or None, index_url or None)
    except GpuopsError as exc:
        raise GpuopsError(f"{task.where}: {exc}") from None
    if str(args.get("manager") or "process") == "docker":
        return _plan_image(task, args, state, found, version, desired, where)
    requirements = found.install_requirements() + extra
    name = _env_name(version, requirements, index_url, wheelhouse, str(args["base_python"]))
    expect = (("sglang", version), *sorted((canonical(k), v) for k, v in found.pins.items()))
    env = ReleaseEnv(version, envs_dir.rstrip("/"), name, str(args["base_python"]), tuple(requirements), expect,
                     index_url, wheelhouse, int(float(number_arg(args["min_free_gib"])) * 2 ** 30),
                     str(args["stage"]).strip().lower() in ("1", "true", "yes", "on"),
                     int(float(number_arg(args["keep_envs"]))), str(args.get("state_dir") or ""))
    # The environment is the whole stack: a PYTHONPATH from the login or the inventory would put
    # another release's packages before its own (an empty PYTHONPATH is no path at all).
    result: dict[str, object] = {"python": env.python, "env_dir": env.env_dir, "name": name, "version": version, "renames": {},
              "pins": dict(found.pins), "image": "", "image_base": "", "env": {"PYTHONPATH": ""}}
    return _checked_release(state, args, found, version, desired, where, result, env,
                            f"SGLang {version}: environment {env.env_dir} ({', '.join(f'{d} {v}' for d, v in expect)}"
                            f"{', +' + ' '.join(extra) if extra else ''}); built or found before the server stops")


def _plan_image(task: "Task", args: TaskArgs, state: "PlanState", found: Release, version: str, desired: str,
                where: str) -> dict[str, object]:
    """sglang-release on a docker host: the release's image, checked flags, nothing built here."""

    current = str(args.get("current_image") or "")
    tag = str(args.get("image") or "") or (release_tag(current, version) if current else "")
    if not tag or not _IMAGE_REF.match(tag) or tag.startswith("-"):
        raise GpuopsError(f"{where}: sglang_release_image {tag!r} is not an image reference (e.g. lmsysorg/sglang:v{version})")
    expect = (("sglang", version), *sorted((canonical(k), v) for k, v in found.pins.items()))
    image = ReleaseImage(version, tag, current, expect, str(args["stage"]).strip().lower() in ("1", "true", "yes", "on"))
    result: dict[str, object] = {"python": "", "env_dir": "", "name": tag, "version": version, "renames": {}, "pins": dict(found.pins),
              "image": tag, "image_base": current, "env": {}}
    return _checked_release(state, args, found, version, desired, where, result, image,
                            f"SGLang {version}: image {tag} (replacing {current or '?'}; it must hold "
                            f"{', '.join(f'{d} {v}' for d, v in expect)}); pulled or found before the container stops")


def _checked_release(state: "PlanState", args: TaskArgs, found: Release, version: str, desired: str, where: str,
                     result: dict[str, object], planned: ReleaseEnv | ReleaseImage, summary: str) -> dict[str, object]:
    """What both kinds of release (an environment, an image) plan alike: in discovery only the path
    the launch will take; else the launch flags checked against the new release's own parsers, the
    standing source patches judged, the summary noted and the release recorded."""

    if state.discovery:
        if desired:
            state.paths.add(desired)
        return result
    others, patches = _other_parts(state, desired)
    launch = [str(a) for a in list_arg(args.get("launch_args"))] + others
    checked = check_launch(launch, release_flags(found.sources), version, where)
    for note in checked.notes:
        state.note(note)
    _note_patches(state, patches, version)
    state.note(summary)
    state.release = dataclasses.replace(planned, patches=patches)
    return dict(result, renames={k: list(v) for k, v in checked.renames.items()})


def _note_patches(state: "PlanState", patches: tuple[StandingPatch, ...], version: str) -> None:
    for patch in patches:
        state.note(f"{patch.role} (run {patch.run_id}) patched the running release's source for {patch.feature}; "
                   f"that patch is not copied to SGLang {version}: the new tree's own gate audit decides, before "
                   f"the server stops (open there: the switch goes on; not open: refused, with the way through)")
