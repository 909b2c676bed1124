"""What a plan holds: the file changes, the server and its restart, the checks after patching
(``Plan`` itself, and the facts it is planned from, are in ``plan/model.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


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
class LogCheck:
    """After the restart, read the server's log since its start and judge whether ``feature`` came
    up (``pcie_ipc_allreduce``: pcie_ipc.log_verdict); ``rollback``: a feature that did not is
    rolled back instead of reported."""

    feature: str
    rollback: bool


@dataclass(frozen=True)
class AuditCheck:
    """Re-run the gate scanner after patching; the feature must come out ``open`` for ``target_sm``."""

    feature: str
    target_sm: str
    python: str
