"""Values shared by apply, rollback and history: options, the per-host report, run ids."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuops.transport import ConnectOptions
    from gpuops.transport.rollout import Rollout


@dataclass(frozen=True)
class ApplyOptions:
    connect: "ConnectOptions"
    check: bool = False
    diff: bool = False
    become: bool = False
    become_password: str | None = None
    forks: int = 16
    timeout: float | None = None       # seconds per host, for everything on it (--timeout)
    force: bool = False                # rollback: overwrite files changed since the run (kept aside)

    def deadline(self) -> float | None:
        """The monotonic time by which a host must be done (None: no limit)."""
        import time

        return None if self.timeout is None else time.monotonic() + self.timeout
    rollout: "Rollout | None" = None  # --serial / --max-fail-percentage: hosts in batches


@dataclass
class HostReport:
    """The outcome for one host (the JSON schema in roles/README.md)."""

    host: str
    ok: bool
    status: str                      # checked | unchanged | finished | rolled_back | refused | failed | unknown
    changed: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    run_id: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    handlers: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    tasks_ok: int = 0
    pid: int | None = None
    log_tail: str | None = None       # the server's log after a failed start (redacted)
    recovered: list[str] = field(default_factory=list)  # earlier runs this command rolled back first

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "status": self.status, "changed": self.changed, "changes": self.changes,
            "error": self.error, "run_id": self.run_id, "warnings": self.warnings, "notes": self.notes,
            "handlers": self.handlers, "restored": self.restored, "tasks_ok": self.tasks_ok, "pid": self.pid,
            "log_tail": self.log_tail, "recovered": self.recovered,
        }


def current_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


