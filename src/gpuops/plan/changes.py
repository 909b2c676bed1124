"""What a plan holds: the file changes, the server and its restart, the checks after patching, and
what the host must hold before the transaction (a derived image ``ImageBuild``, a release
environment ``ReleaseEnv`` or image ``ReleaseImage``). ``Plan`` itself, and the facts it is planned
from, are in ``plan/model.py``; the planners that make these values in ``plan/image_patch.py`` and
``plan/release.py``."""

from __future__ import annotations

import hashlib
import posixpath
from typing import TypedDict
from gpuops.frozen import frozen

PATCH_LABEL = "gpuops.patch"          # the patch hash a derived image was built for
BASE_REF_LABEL = "gpuops.base-ref"    # the inventory image it stands in for


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


class ChangeSummary(TypedDict):
    """A change as the plan's JSON shows it (``Change.summary``): hashes and diff, never contents."""

    kind: str
    path: str
    action: str
    mode: str | None
    task: str
    before_sha256: str | None
    after_sha256: str | None
    diff: str


class ServiceJSON(TypedDict):
    """How the server runs, as the plan's JSON and the helper's payload carry it (``ServiceSpec``)."""

    manager: str
    name: str
    state_dir: str
    port: int
    health_timeout: float
    grace: float
    docker_run_script: str | None


@frozen
class Change:
    """One file that would change. ``diff`` is redacted and safe to print; before/after are not."""

    kind: str                 # "template" | "env" | "lineinfile" | "patch" | "desired"
    path: str
    action: str               # "create" | "update" | "mode" | "delete" (after is then "")
    before: str | None
    after: str
    diff: str
    mode: str | None          # the mode to set ("0644"); None keeps the current one
    task: str                 # "role/tasks.yml: <task name>"
    notify: tuple[str, ...] = ()

    @property
    def before_sha256(self) -> str | None:
        return sha256_text(self.before)

    @property
    def after_sha256(self) -> str | None:
        return None if self.action == "delete" else sha256_text(self.after)

    def summary(self) -> ChangeSummary:
        """The JSON form (documented in roles/README.md): hashes and diff, never raw contents."""
        return {
            "kind": self.kind,
            "path": self.path,
            "action": self.action,
            "mode": self.mode,
            "task": self.task,
            "before_sha256": self.before_sha256,
            "after_sha256": self.after_sha256,
            "diff": self.diff,
        }


@frozen
class ServiceSpec:
    """How the server runs: enough for the helper to restart it, wait for health and show logs."""

    manager: str              # "process" | "systemd" | "docker"
    name: str
    state_dir: str
    port: int
    health_timeout: float
    grace: float
    docker_run_script: str | None = None

    def to_json(self) -> ServiceJSON:
        return {
            "manager": self.manager, "name": self.name, "state_dir": self.state_dir, "port": self.port,
            "health_timeout": self.health_timeout, "grace": self.grace,
            "docker_run_script": self.docker_run_script,
        }


@frozen
class HandlerRun:
    """A notified handler: restart the server (systemd needs a daemon-reload when a unit changed)."""

    name: str
    service: ServiceSpec
    daemon_reload: bool = False


@frozen
class CompileCheck:
    """Byte-compile the patched files with the task's ``python`` once they are written on the host: a file that
    does not compile fails the run."""

    python: str
    paths: tuple[str, ...]


@frozen
class LogCheck:
    """After the restart, read the server's log since its start and judge whether ``feature`` came
    up (``pcie_ipc_allreduce``: pcie_ipc.log_verdict); ``rollback``: a feature that did not is
    rolled back instead of reported."""

    feature: str
    rollback: bool


@frozen
class AuditCheck:
    """Re-run the gate scanner after patching; the feature must come out ``open`` for ``target_sm``."""

    feature: str
    target_sm: str
    python: str


@frozen
class ImageBuild:
    """A derived image to build on the host: ``base`` (an image id) plus patched files."""

    container: str
    base: str                 # image id the container runs (what the scan read)
    base_ref: str             # sglang_docker_image: the image the derived one stands in for
    tag: str                  # gpuops/<container>:<hash[:12]>
    patch_sha256: str
    python: str               # the container's python (compile check and re-audit in the image)

    def to_json(self) -> dict[str, object]:
        return {"container": self.container, "base": self.base, "base_ref": self.base_ref, "tag": self.tag,
                "patch_sha256": self.patch_sha256, "python": self.python,
                "labels": {PATCH_LABEL: self.patch_sha256, BASE_REF_LABEL: self.base_ref}}


@frozen
class StandingPatch:
    """A standing run that patched the running release's source (its part of desired.json)."""
    role: str
    run_id: str
    feature: str


@frozen
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
    patches: tuple["StandingPatch", ...] = ()  # standing source patches of the running release

    @property
    def env_dir(self) -> str:
        return posixpath.join(self.envs_dir, self.name)

    @property
    def python(self) -> str:
        return posixpath.join(self.env_dir, "bin", "python")

    def payload(self, host_wheelhouse: str | None) -> dict[str, object]:
        return {"version": self.version, "envs_dir": self.envs_dir, "name": self.name, "base_python": self.base_python,
                "requirements": list(self.requirements), "expect": dict(self.expect), "index_url": self.index_url,
                "wheelhouse": host_wheelhouse, "min_free_bytes": self.min_free_bytes,
                "keep_envs": self.keep_envs, "state_dir": self.state_dir,
                "source": self.wheelhouse and "wheelhouse" or self.index_url or "the host's index"}


@frozen
class ReleaseImage:
    """The image a docker host must hold before the switch (pulled, or found, then checked inside)."""
    version: str
    tag: str                       # the image the container is recreated from
    base: str                      # sglang_docker_image: the image it stands in for (the old one)
    expect: tuple[tuple[str, str], ...]  # (dist, version) the image must hold: sglang and its pins
    stage: bool = False
    python: str = "python3"        # the interpreter the run script launches in the image
    patches: tuple["StandingPatch", ...] = ()  # standing source patches of the running release (image)
