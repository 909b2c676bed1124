"""One host's rollback, always the same steps: connect -> transaction -> answer -> journal.

``gpuops rollback`` runs every host through these steps as apply runs every host through
apply/pipeline.py, and they know nothing of deployments or recomposition: those are
``RollbackStrategy`` objects chosen once per host at the top (``undo.rollback_strategies``) that
step in at named points of the one run:

  connect      the host's connection; strategies' ``ended`` when it cannot be had (a node
               that cannot be reached holds nobody)
  transaction  ONE exec (apply/remote_exec.run_helper, mode rollback): the host undoes the run
               from its backups and starts the server it ran before; strategies' ``payload``,
               ``commit_check``, ``on_event`` and ``helper_hooks`` (a deployment's holds), and
               ``ended`` whatever happened
  answer       strategies' ``answered`` (later runs stand on the target's files: recomposed,
               a second exec), else the helper's own answer as the report
  journal      strategies' ``reported``, then the outcome at home (apply/journal.record_run_home)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from gpuops import transport
from gpuops.apply.host_report import HostReport
from gpuops.apply.journal import host_key, record_run_home
from gpuops.apply.options import ApplyOptions, current_user
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.verify_checks import Check
from gpuops.errors import GpuopsError
from gpuops.remote.host_protocol import KIND_ROLLBACK, MODE_ROLLBACK, STATUS_ROLLED_BACK, HelperResult, HostEvent

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport import Connection


@dataclass
class RollbackRun:
    """One host's rollback as the steps see it: its inputs, the same for every strategy."""

    host: "Host"
    target: str | None        # the run to undo; None: the host's newest standing run
    run_id: str               # this rollback's own run id (one for every host of the command)
    options: ApplyOptions
    deadline: float | None
    state_dir: str            # where the run to undo lives (its own state dir, else the inventory's)

    @property
    def variables(self) -> dict[str, Any]:
        return dict(self.host.vars or {})


@dataclass
class Undone:
    """A host's rollback as it is reported and journaled at home."""

    report: HostReport
    target: str | None        # the run it undid
    recompose: bool = False   # undone by recomposition (apply/recompose.py), not from its backups


class RollbackStrategy:
    """What wraps the rollback steps for some hosts (a deployment's node, a recomposition). Every
    hook does nothing here; a strategy overrides the points it needs."""

    def payload(self, run: RollbackRun, payload: dict[str, Any]) -> None:
        """The helper's payload, before it is sent (a strategy's part added)."""

    def commit_check(self, run: RollbackRun, check: Check | None) -> Check | None:
        """The check before the host commits, wrapped."""
        return check

    def helper_hooks(self, run: RollbackRun) -> dict[str, Any]:
        """run_helper's ``on_open`` / ``on_hold`` (a deployment's holds)."""
        return {}

    def on_event(self, run: RollbackRun, event: HostEvent) -> None:
        """A progress event of the host's rollback."""

    def ended(self, run: RollbackRun, ok: bool, error: str) -> None:
        """The host's exec ended, whatever happened (``error``: why not ok), or the host could not
        be reached."""

    def answered(self, run: RollbackRun, conn: "Connection", result: HelperResult) -> Undone | None:
        """The rollback done another way than the helper's answer says (a recomposition), or None."""
        return None

    def reported(self, run: RollbackRun, report: HostReport) -> None:
        """The host's rollback ended with ``report`` (not when a step raised), before it is journaled."""


def rollback_host(run: RollbackRun, strategies: Sequence[RollbackStrategy]) -> HostReport:
    """One host's rollback through every step, the strategies stepping in; its report."""
    try:
        conn = transport.connect(run.host, run.options.connect)
    except GpuopsError as exc:
        for strategy in strategies:
            strategy.ended(run, False, str(exc))
        raise
    try:
        result = _transaction(run, conn, strategies)
        undone = _answer(run, conn, result, strategies)
    finally:
        conn.close()
    for strategy in strategies:
        strategy.reported(run, undone.report)
    journal_home(run, undone)
    return undone.report


def rollback_payload(run: RollbackRun) -> dict[str, Any]:
    """The helper's rollback payload: which run to undo, where, and with what force."""
    return {
        "mode": MODE_ROLLBACK, "run_id": run.run_id, "state_dir": run.state_dir, "target": run.target,
        "force": run.options.force, "meta": {"role": KIND_ROLLBACK, "user": current_user()},
        "later_runs": "report",   # later runs standing on its files: say so (with the journal), change nothing
    }


def _transaction(run: RollbackRun, conn: "Connection", strategies: Sequence[RollbackStrategy]) -> HelperResult:
    """The host's rollback: ONE exec; the strategies told how it ended, whatever happened."""
    payload = rollback_payload(run)
    check: Check | None = None
    hooks: dict[str, Any] = {}
    for strategy in strategies:
        strategy.payload(run, payload)
        check = strategy.commit_check(run, check)
        hooks.update(strategy.helper_hooks(run))

    def on_event(event: HostEvent) -> None:
        for strategy in strategies:
            strategy.on_event(run, event)

    result = None
    error = "its rollback did not run"
    try:
        result = run_helper(conn, run.variables, payload, deadline=run.deadline, on_event=on_event,
                            on_hold=hooks.get("on_hold"), on_verified=check, on_open=hooks.get("on_open"))
        error = str(result.error or result.status)
    except Exception as exc:
        error = str(exc)
        raise
    finally:
        for strategy in strategies:
            strategy.ended(run, bool(result is not None and result.ok), error)
    return result


def _answer(run: RollbackRun, conn: "Connection", result: HelperResult,
            strategies: Sequence[RollbackStrategy]) -> Undone:
    for strategy in strategies:
        undone = strategy.answered(run, conn, result)
        if undone is not None:
            return undone
    return Undone(helper_report(run.host.name, run.run_id, result), result.target)


def helper_report(host: str, run_id: str, result: HelperResult) -> HostReport:
    """The helper's answer to a rollback from the run's backups, as the host's report."""
    ok = result.ok
    report = HostReport(host=host, ok=ok, status=result.status, run_id=run_id, restored=list(result.restored),
                        changed=len(result.restored) if ok else 0, error=None if ok else result.error,
                        recovered=list(result.recovered), notes=list(result.notes))
    if ok:
        report.notes.append(f"undid run {result.target}: {result.service or ''}")
        report.notes.extend(f"--force: the later version of {kept}" for kept in result.kept)
    elif result.status == STATUS_ROLLED_BACK:
        report.error = f"{report.error} -- the rollback was undone: the host is as it was before it"
    return report


def journal_home(run: RollbackRun, undone: Undone) -> None:
    """The rollback's line in the home journal (``recompose``: only on a recomposition's)."""
    report = undone.report
    extra: dict[str, Any] = {"target": undone.target}
    if undone.recompose:
        extra["recompose"] = True
    record_run_home(run.run_id, run.host.name, host_key(run.host), KIND_ROLLBACK, report.status, report.error,
                    run.state_dir, [{"path": p} for p in report.restored], **extra)
