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
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError
from gpuops.plan.argspec import Arg, ModuleSpec, declares

if TYPE_CHECKING:
    from gpuops.plan.roles import Task
    from gpuops.plan.state import PlanState
    from gpuops.plan.templating import VarScope


@dataclass(frozen=True)
class ReleaseEnv:
    """An environment a host must hold before the switch (built, or found finished, by the host)."""
    version: str
    envs_dir: str
    name: str                      # sglang-<version>-<digest of what it is installed from>
    base_python: str               # the interpreter the venv is made from
    requirements: tuple[str, ...]  # sglang==X and the release's own stack pins, then extra packages
    expect: tuple[tuple[str, str], ...]  # (dist, version) the new environment must hold
    index_url: str
    wheelhouse: str                # a folder on the operator's machine, copied to the host; "" = none
    min_free_bytes: int
    stage: bool = False            # build and audit only: the switch is left for a later run
    keep_envs: int = 2             # finished environments kept besides those the launch or a run needs
    state_dir: str = ""            # where the launch files and the runs' backups are (what needs an env)

    @property
    def env_dir(self) -> str:
        return posixpath.join(self.envs_dir, self.name)

    @property
    def python(self) -> str:
        return posixpath.join(self.env_dir, "bin", "python")

    def payload(self, host_wheelhouse: str | None) -> dict[str, Any]:
        return {"version": self.version, "envs_dir": self.envs_dir, "name": self.name, "base_python": self.base_python,
                "requirements": list(self.requirements), "expect": dict(self.expect), "index_url": self.index_url,
                "wheelhouse": host_wheelhouse, "min_free_bytes": self.min_free_bytes,
                "keep_envs": self.keep_envs, "state_dir": self.state_dir,
                "source": self.wheelhouse and "wheelhouse" or self.index_url or "the host's index"}


def wheelhouse_digest(folder: str) -> str:
    """Names and sizes of the wheelhouse's files: a changed wheelhouse is another environment."""
    from pathlib import Path

    entries = sorted((p.name, p.stat().st_size) for p in Path(folder).expanduser().iterdir() if p.is_file())
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def _env_name(version: str, requirements: list[str], index_url: str, wheelhouse: str, base_python: str) -> str:
    source = wheelhouse_digest(wheelhouse) if wheelhouse else index_url
    blob = json.dumps([requirements, source, base_python])
    return f"sglang-{version}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _other_parts_args(state: "PlanState", desired: str) -> list[str]:
    """Launch flags other gpuops runs still in effect add (fusion-sm120's flag): checked too."""
    from gpuops.plan.compose import composed, read_desired
    from gpuops.plan.modules import _current

    if not desired:
        return []
    current = _current(state, desired, "sglang_release")
    recorded = read_desired(current.content if current.exists else None, f"{state.host}: {desired}")
    others = {role: c for role, c in recorded.items() if role != state.role}
    if "fusion-sm120" in others:
        state.warn("fusion-sm120 (run %s) patched the SGLang files of the running environment; the new one holds the "
                   "release as published, never a copy of that patch: apply fusion-sm120 again after the switch "
                   "(it re-plans on the new tree, or says the release admits the GPU by itself)"
                   % (others["fusion-sm120"].get("run_id") or "?"))
    return list(composed(others)["args"])


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
    "`keep_envs` newest are removed unless the launch files or a kept run's backups (its rollback) name them")))
def plan_sglang_release(task: "Task", args: dict, state: "PlanState", scope: "VarScope") -> dict:
    from gpuops.release.flags import check_launch, release_flags
    from gpuops.release.wheel import canonical, release

    where = f"{state.host}: {task.where}"
    version = str(args["version"]).strip()
    envs_dir = str(args["envs_dir"])
    if not envs_dir.startswith("/") or posixpath.normpath(envs_dir) != envs_dir.rstrip("/"):
        raise GpuopsError(f"{where}: gpuops_envs_dir {envs_dir!r} must be a plain absolute path")
    index_url = str(args.get("index_url") or "")
    wheelhouse = str(args.get("wheelhouse") or "")
    extra = [str(p) for p in args.get("extra_packages") or []]
    desired = str(args.get("desired") or "")
    try:
        found = release(version, wheelhouse or None, index_url or None)
    except GpuopsError as exc:
        raise GpuopsError(f"{task.where}: {exc}") from None
    requirements = found.install_requirements() + extra
    name = _env_name(version, requirements, index_url, wheelhouse, str(args["base_python"]))
    expect = (("sglang", version), *sorted((canonical(k), v) for k, v in found.pins.items()))
    env = ReleaseEnv(version, envs_dir.rstrip("/"), name, str(args["base_python"]), tuple(requirements), expect,
                     index_url, wheelhouse, int(float(args["min_free_gib"]) * 2 ** 30),
                     str(args["stage"]).strip().lower() in ("1", "true", "yes", "on"),
                     int(float(args["keep_envs"])), str(args.get("state_dir") or ""))
    result = {"python": env.python, "env_dir": env.env_dir, "name": name, "version": version, "renames": {},
              "pins": dict(found.pins)}
    if state.discovery:
        if desired:
            state.paths.add(desired)
        return result
    launch = [str(a) for a in args.get("launch_args") or []] + _other_parts_args(state, desired)
    checked = check_launch(launch, release_flags(found.sources), version, where)
    for note in checked.notes:
        state.note(note)
    state.note(f"SGLang {version}: environment {env.env_dir} ({', '.join(f'{d} {v}' for d, v in expect)}"
               f"{', +' + ' '.join(extra) if extra else ''}); built or found before the server stops")
    state.release = env
    return dict(result, renames={k: list(v) for k, v in checked.renames.items()})
