"""One host's apply, always the same steps: gather -> plan -> transaction -> verify -> journal.

The pipeline knows nothing of deployments, replicas or releases: those are ``Strategy`` objects
chosen once, at the top (``runner.apply_role``), that step in at named points of the one run
(pyinfra runs every host through one executor; Ansible's TaskExecutor knows nothing of the strategy
plugins around it). A refusal is a ``Refusal`` raised anywhere and turned into the report in one
place; ``RunEnds`` ends a run whose report is already what it should say.

  gather    ONE exec (apply/host_gather.py): facts and the host's journal
  plan      pure, or a no-op recalled (apply/noop_memo.py); strategies' ``planned``
  check     ``--check`` stops here: notes and warnings of what a run would do; strategies' ``checked``
  ready     strategies' ``ready``; nothing to do -> ``unchanged``, journaled at home, host untouched
  prepare   strategies' ``prepare`` (a release's environment) before anything stops
  transaction + verify   ONE exec (apply/remote_exec.run_helper) with the plan's commit checks
            (apply/verify_checks.py), wrapped by strategies' ``commit_check`` and ``around``
  journal   the outcome at home (apply/journal.record_run_home)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpuops import timings, transport
from gpuops.apply import container_audit
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.host_gather import Gathered, HostProbes, gather_host, gather_probes
from gpuops.apply.host_report import HostReport
from gpuops.apply.journal import fold_runs, host_key, reconcile_home, record_run_home
from gpuops.apply.noop_memo import plan_or_recall
from gpuops.apply.options import ApplyOptions, current_user
from gpuops.apply.payload import apply_payload
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.verify_checks import (
    Check,
    commit_checks,
    fold_result,
    judge_reaudit,
    smoke_check,
)
from gpuops.gates.probe import gate_scan_probe
from gpuops.plan.planner import plan_role, vars_digest
from gpuops.remote.host_protocol import (
    EVENT_VERIFIED,
    STATUS_FINISHED,
    STATUS_UNCHANGED,
    HostEvent,
)
from gpuops.secret_policy import secret_values

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.plan.model import Plan, PlanFacts
    from gpuops.plan.planner import Discovery
    from gpuops.transport import Connection

Transaction = Callable[[Check | None], None]  # runs the host's transaction with this check before its commit


class Refusal(Exception):
    """The run is refused on this host before anything changed there. ``journaled``: the refusal
    is also a line in the home journal (a release refused after its environment was readied)."""

    def __init__(self, why: str, journaled: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.journaled = journaled


class RunEnds(Exception):
    """The run ends here on this host; its report already says how (staged, a replica not put back)."""


@dataclass
class HostRun:
    """One host's run as the steps see it: its inputs, and what the steps read and decided."""

    host: "Host"
    role: str
    extra: ExtraVars                    # checked at the boundary (apply/extra_vars.py)
    discovery: "Discovery"
    options: ApplyOptions
    run_id: str
    conn: "Connection"
    deadline: float | None
    facts: "PlanFacts"
    gathered: Gathered
    plan: "Plan"
    report: HostReport
    restarts: bool                      # the plan restarts a server (a strategy may make it so)
    pending: dict[str, Any] | None      # a run left open on the host, finished first
    verified: list[HostEvent] = field(default_factory=list)  # the helper's "verified" event

    @property
    def variables(self) -> dict[str, Any]:
        return self.extra.for_host(self.host)

    def replan(self) -> "Plan":
        """The plan made again from the run's facts (a recalled no-op plan names no server)."""

        return plan_role(self.role, self.facts, dict(self.host.vars or {}), dict(self.extra), run_id=self.run_id)

    def journal_home(self) -> None:
        report = self.report
        record_run_home(report.run_id, report.host, host_key(self.host), self.role, report.status, report.error,
                        self.discovery.state_dir,
                        [{"path": c["path"], "before_sha256": c["before_sha256"], "after_sha256": c["after_sha256"]}
                         for c in report.changes],
                        user=current_user(), vars_sha256=vars_digest(dict(self.host.vars or {}), dict(self.extra)))


class Strategy:
    """What wraps the pipeline for some hosts (a deployment's node, a replica, a release). Every
    hook does nothing here; a strategy overrides the points it needs. Raise ``Refusal`` to refuse."""

    def planned(self, run: HostRun) -> None:
        """After the plan, ``--check`` too: notes, refusals, a changed plan."""

    def checked(self, run: HostRun) -> None:
        """``--check``: what a run would do, after the pipeline's own warnings."""

    def ready(self, run: HostRun) -> None:
        """Before the pipeline looks whether there is anything to do on the host."""

    def prepare(self, run: HostRun) -> None:
        """Before the transaction, when there is something to do: nothing has stopped yet."""

    def commit_check(self, run: HostRun, payload: dict[str, Any], check: Check | None) -> Check | None:
        """The check before the host commits, wrapped (the payload may carry the strategy's part)."""
        return check

    def helper_hooks(self, run: HostRun) -> dict[str, Any]:
        """run_helper's ``on_open`` / ``on_hold`` (a deployment's holds)."""
        return {}

    def on_event(self, run: HostRun, event: HostEvent) -> None:
        """A progress event of the host's transaction other than ``verified``."""

    def around(self, run: HostRun, transaction: Transaction) -> Transaction:
        """The transaction wrapped (a replica's drain and return)."""
        return transaction


def run_host(host: "Host", role: str, extra: ExtraVars, discovery: "Discovery", options: ApplyOptions,
             run_id: str, strategies: Sequence[Strategy] = ()) -> HostReport:
    """One host through every step, the strategies stepping in; the report of how it ended."""
    deadline = options.deadline()
    opening = transport.Opening(host, dataclasses.replace(options.connect, deadline=deadline))  # every command within --timeout
    try:
        planned = gather_probes(host, discovery, offer_kept=not options.flush_cache)  # while the connection is made
    except BaseException:
        opening.discard()
        raise
    conn = opening.connection()
    try:
        run = _gather_and_plan(conn, host, role, extra, discovery, planned, options, run_id, deadline)
        return run_steps(run, strategies)
    finally:
        conn.close()


def run_steps(run: HostRun, strategies: Sequence[Strategy]) -> HostReport:
    """The steps after the plan; a refusal or an early end, wherever raised, is turned into the report here."""
    try:
        _steps(run, strategies)
    except Refusal as refused:
        run.report.refuse(refused.why)
        if refused.journaled:
            run.journal_home()
    except RunEnds:
        pass
    return run.report


def _gather_and_plan(conn: "Connection", host: "Host", role: str, extra: ExtraVars, discovery: "Discovery",
                     planned: HostProbes, options: ApplyOptions, run_id: str, deadline: float | None) -> HostRun:
    facts, gathered = gather_host(conn, host, extra, discovery, planned)
    with timings.span("plan", host.name):  # an empty plan of the same inputs is recalled, not redone
        plan = plan_or_recall(role, facts, dict(host.vars or {}), dict(extra), run_id, gathered.journal,
                              lambda: plan_role(role, facts, dict(host.vars or {}), dict(extra), run_id=run_id),
                              recall_kept=not options.flush_cache)
    report = HostReport(
        host=host.name, ok=True, status="checked", changed=plan.changed,
        changes=[c.summary() for c in plan.changes], warnings=list(plan.warnings), notes=list(plan.notes),
        handlers=[h.name for h in plan.handlers], tasks_ok=plan.tasks_ok,
    )
    if plan.starts and plan.service is not None:
        report.changed += 1  # a start is a change, as Ansible counts `state: started`
        if options.check:
            report.notes.append(f"would start the server: none runs on port {plan.service.port} "
                                "(sglang-service keeps it running: Ansible's state: started)")
    return HostRun(host=host, role=role, extra=extra, discovery=discovery, options=options, run_id=run_id,
                   conn=conn, deadline=deadline, facts=facts, gathered=gathered, plan=plan, report=report,
                   restarts=bool(plan.handlers) and plan.service is not None,
                   pending=unfinished(gathered.journal))


def unfinished(journal: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last run the host's journal shows open (its worker alive, or dead and not rolled back)."""

    pending = [r for r in fold_runs(journal) if r["outcome"].startswith("unfinished")]
    return pending[-1] if pending else None


def _steps(run: HostRun, strategies: Sequence[Strategy]) -> None:
    for strategy in strategies:
        strategy.planned(run)
    reconcile_home(run.host.name, fold_runs(run.gathered.journal), host_key(run.host))
    if run.options.check:
        _check(run, strategies)
        return
    for strategy in strategies:
        strategy.ready(run)
    plan = run.plan
    if not plan.changes and not plan.handlers and not run.pending:
        # Nothing to do and no other run open on the host: like --check, the host is left
        # untouched (no exec, no lock, no journal line there); the run is journaled at home.
        run.report.status, run.report.run_id = STATUS_UNCHANGED, run.run_id
        run.journal_home()
        return
    for strategy in strategies:
        strategy.prepare(run)
    _transaction(run, strategies)
    if run.plan.starts and run.plan.service is not None and run.report.status == STATUS_FINISHED:
        run.report.notes.insert(0, f"started: no server ran on port {run.plan.service.port}; the transaction "
                                   f"started it and it is healthy (pid {run.report.pid})")
    run.journal_home()


def _check(run: HostRun, strategies: Sequence[Strategy]) -> None:
    pending = run.pending
    if pending:
        # The next real run on this host rolls it back first (unless its worker is still alive
        # and holds the lock, in which case that run finishes or rolls back by itself).
        run.report.warnings.append(
            f"run {pending['run_id']} ({pending.get('role') or pending.get('kind')}) is in progress or did not "
            "finish on this host; the next apply, rollback or history rolls it back first if it is not running")
    for strategy in strategies:
        strategy.checked(run)


def _transaction(run: HostRun, strategies: Sequence[Strategy]) -> None:
    """The host's transaction: ONE exec, the plan's checks and the strategies' before its commit."""

    plan, report, variables = run.plan, run.report, run.variables
    # Applicability (GPU generation) and P2P are decided by the plan, from the GPU facts
    # gathered with the gate scan (plan/applicability.py).
    found = (run.facts.gpu or {}).get("cuda")
    cuda = found if isinstance(found, str) else None
    audit_sh = None
    if plan.audit is not None:
        audit_sh = container_audit.audit_script(plan, gate_scan_probe(with_sources=False).script)
    payload = apply_payload(plan, run.run_id, vars_digest(dict(run.host.vars or {}), dict(run.extra)), audit_sh)
    log_failure: list[str] = []
    check = commit_checks(plan, smoke_check(run.conn, plan, variables, report), run.verified, report, log_failure)
    hooks: dict[str, Any] = {}
    for strategy in strategies:
        check = strategy.commit_check(run, payload, check)
        hooks.update(strategy.helper_hooks(run))

    def on_event(event: HostEvent) -> None:
        if event.name == EVENT_VERIFIED:
            run.verified[:] = [event]
            return
        for strategy in strategies:
            strategy.on_event(run, event)

    def transaction(check: Check | None) -> None:
        result = run_helper(run.conn, variables, payload, with_preamble=audit_sh is not None, deadline=run.deadline,
                            on_audit=(lambda output: judge_reaudit(output, plan, cuda)) if plan.audit is not None else None,
                            on_event=on_event, on_verified=check, on_open=hooks.get("on_open"),
                            on_hold=hooks.get("on_hold"))
        fold_result(report, result, secret_values(variables))
        if log_failure and report.ok:  # committed, but the feature did not come up: the host failed its promise
            report.ok = False
            report.error = log_failure[0]

    wrapped: Transaction = transaction
    for strategy in strategies:
        wrapped = strategy.around(run, wrapped)
    wrapped(check)
