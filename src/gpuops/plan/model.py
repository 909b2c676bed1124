"""Values that planning produces: what the host looks like, and what would change on it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # the gates part's value; planning never imports the scanner's parser itself
    from gpuops.gates.scan import GateScan


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class FileState:
    """A file as the gather saw it. ``content`` is None when absent or not UTF-8 text; then
    ``problem`` says why it cannot be managed ("is a symbolic link to X", "is not UTF-8 text")."""

    path: str
    exists: bool
    sha256: str | None = None
    mode: str | None = None        # "0644"
    uid: int | None = None
    gid: int | None = None
    content: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class PlanFacts:
    """Everything a plan reads about one host (the files its role manages; the gate scan and GPU
    summary when a role needs them); gathered in one exec, then planning is pure. Not the facts
    ``inspect`` reports (``gpuops.facts.host.HostFacts``)."""

    host: str
    files: Mapping[str, FileState] = field(default_factory=dict)
    gate_scan: GateScan | None = None      # the gate scan (when a role needs it), with the sources the patch planner reads
    # GPU summary gathered with the gate scan (apply.runner._gpu_summary): compute_capability,
    # cuda, gpu_count, p2p_all_pairs, p2p_failed_pairs [[GPUa, GPUb, status]]; None when not gathered.
    gpu: Mapping[str, Any] | None = None
    # sglang_manager: docker: what the container runs (facts.container_python.parse_container):
    # name, id, image, image_id, running, labels; None when not gathered or no such container.
    container: Mapping[str, Any] | None = None


@dataclass(frozen=True)
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

    def summary(self) -> dict[str, Any]:
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


@dataclass(frozen=True)
class ServiceSpec:
    """How the server runs: enough for the helper to restart it, wait for health and show logs."""

    manager: str              # "process" | "systemd" | "docker"
    name: str
    state_dir: str
    port: int
    health_timeout: float
    grace: float
    docker_run_script: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "manager": self.manager, "name": self.name, "state_dir": self.state_dir, "port": self.port,
            "health_timeout": self.health_timeout, "grace": self.grace,
            "docker_run_script": self.docker_run_script,
        }


@dataclass(frozen=True)
class HandlerRun:
    """A notified handler: restart the server (systemd needs a daemon-reload when a unit changed)."""

    name: str
    service: ServiceSpec
    daemon_reload: bool = False


@dataclass(frozen=True)
class CompileCheck:
    python: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class AuditCheck:
    """Re-run the gate scanner after patching; the feature must come out ``open`` for ``target_sm``."""

    feature: str
    target_sm: str
    python: str


@dataclass(frozen=True)
class Plan:
    host: str
    role: str
    changes: tuple[Change, ...]
    handlers: tuple[HandlerRun, ...]
    service: ServiceSpec | None
    compile_checks: tuple[CompileCheck, ...] = ()
    audit: AuditCheck | None = None
    image: Any = None         # plan.image_patch.ImageBuild (docker: the patch as a derived image)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tasks_ok: int = 0         # tasks evaluated (not skipped by `when`), Ansible's "ok"
    state_dir: str = "/var/lib/gpuops"

    @property
    def changed(self) -> int:
        return len(self.changes)
