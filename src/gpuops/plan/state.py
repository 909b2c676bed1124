"""What one planning pass accumulates (``plan_role``/``discover`` in plan/planner.py), handed to
every module's planner. Apart from the planner so that importing the planner for ``Discovery`` (a
no-op apply) does not build this class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from gpuops.desired_state import Contribution
    from gpuops.plan.changes import AuditCheck, Change, CompileCheck, ImageBuild, LogCheck, ReleaseEnv, ReleaseImage
    from gpuops.plan.model import PlanFacts
    from gpuops.plan.task import Role
    from gpuops.plan.templating import Templar, VarScope


# A rollback by recomposition: (recorded contributions, desired.json path) -> the contributions to
# write instead of this role's own (plan/compose.py, apply/recompose.py).
Recomposer = Callable[["dict[str, Contribution]", str], "dict[str, Contribution]"]


@dataclass
class PlanState:
    """What a planning pass accumulates; private to one ``plan_role`` call."""

    host: str
    templar: Templar
    roles: Mapping[str, Role]
    facts: PlanFacts | None
    secrets: list[str]
    role: str = ""                      # the role the run was asked for (keys its contribution)
    run_id: str | None = None
    recompose: Recomposer | None = None  # a rollback by recomposition (see Recomposer)
    desired_path: str | None = None     # where the compose task keeps the contributions
    changes: list[Change] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compile_checks: list[CompileCheck] = field(default_factory=list)
    audit: AuditCheck | None = None
    log_check: LogCheck | None = None
    image: ImageBuild | None = None     # a derived image to build (docker)
    release: ReleaseEnv | ReleaseImage | None = None  # an environment (image) the host holds first
    registered: dict[str, object] = field(default_factory=dict)  # task results by `register` name
    role_scopes: dict[str, VarScope] = field(default_factory=dict)
    paths: set[str] = field(default_factory=set)
    needs_gate_scan: bool = False
    needs_server_state: bool = False    # a `server` task: the gather asks whether the server runs
    starts: bool = False                # ... and it does not: the plan starts it
    entrypoint_pythons: list[str] = field(default_factory=list)  # `entrypoint` tasks: the pythons to read
    entrypoints_unread: list[str] = field(default_factory=list)  # ... that the facts do not hold
    tasks_ok: int = 0

    @property
    def discovery(self) -> bool:
        return self.facts is None

    def add_change(self, change: Change) -> None:
        if any(c.path == change.path for c in self.changes):
            raise GpuopsError(f"{self.host}: {change.task}: {change.path} is changed by two tasks of one run")
        self.changes.append(change)
        for name in change.notify:
            if name not in self.notified:
                self.notified.append(name)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
