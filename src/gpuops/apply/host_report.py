"""The outcome of apply, rollback or history for one host: what ``gpuops apply --json`` prints per
host (the schema in roles/README.md) and what the renderer shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuops.plan.changes import ChangeSummary
from gpuops.remote.host_protocol import STATUS_REFUSED


@dataclass
class HostReport:
    """The outcome for one host (the JSON schema in roles/README.md)."""

    host: str
    ok: bool
    status: str                      # checked | staged | unchanged | finished | rolled_back | refused | failed | unknown
    changed: int = 0
    changes: list[ChangeSummary] = field(default_factory=list)
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

    def refuse(self, why: str) -> None:
        """Refused before anything changed on the host: not ok, nothing changed, and why."""
        self.ok, self.status, self.changed, self.error = False, STATUS_REFUSED, 0, why

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "status": self.status, "changed": self.changed, "changes": self.changes,
            "error": self.error, "run_id": self.run_id, "warnings": self.warnings, "notes": self.notes,
            "handlers": self.handlers, "restored": self.restored, "tasks_ok": self.tasks_ok, "pid": self.pid,
            "log_tail": self.log_tail, "recovered": self.recovered,
        }
