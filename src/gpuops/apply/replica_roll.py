"""The replica strategy: a host whose server is one replica behind an sglang-router. Its restart is
a roll (out of the router, drained, changed and restarted with a first answer checked before the
commit, back in and healthy there); a server that did not run joins the router once started; one
left out by an earlier run goes back when nothing restarts (apply/replicas.py does the router work)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from gpuops.apply import replicas
from gpuops.apply.host_report import HostReport
from gpuops.apply.pipeline import HostRun, Refusal, RunEnds, Strategy, Transaction
from gpuops.apply.verify_checks import Check
from gpuops.errors import GpuopsError
from gpuops.remote.host_protocol import STATUS_FINISHED, STATUS_REFUSED, STATUS_ROLLED_BACK, STATUS_UNCHANGED

if TYPE_CHECKING:
    from gpuops.apply.replicas import Replica
    from gpuops.transport import Connection


class ReplicaRoll(Strategy):
    def __init__(self, replica: "Replica") -> None:
        self.replica = replica

    def planned(self, run: HostRun) -> None:
        replica, starts = self.replica, run.plan.starts
        refused = replicas.refusal(replica, starts, run.restarts)
        if refused is not None and run.options.check:
            run.report.warnings.append(f"apply would refuse: {refused}")
        elif refused is not None:
            raise Refusal(refused)
        if (run.restarts or replica.left_out or replica.unreachable) and run.options.check:
            run.report.notes.append(("join plan: " if starts else "drain plan: ") + replica.plan_line(starts))

    def ready(self, run: HostRun) -> None:
        if self.replica.left_out and not run.restarts:
            _put_back_left_out(self.replica, run.report)  # nothing to restart: it only goes back
            if not run.report.ok:
                raise RunEnds

    def around(self, run: HostRun, transaction: Transaction) -> Transaction:
        service = run.plan.service
        if service is None or not (run.plan.starts or run.restarts):
            return transaction
        roll = _joining_start if run.plan.starts else _drained_roll

        def rolled(check: Check | None) -> None:
            roll(self.replica, run.conn, run.variables, service.port, run.report, check, transaction)

        return rolled


def _put_back_left_out(replica: "Replica", report: HostReport) -> None:
    try:
        report.notes.append(replicas.put_back(replica))
    except GpuopsError as exc:
        report.ok, report.status = False, "failed"
        report.error = str(exc).removeprefix(f"{replica.host}: ")


def _with_first_answer(replica: "Replica", conn: "Connection", variables: Mapping[str, Any], port: int,
                       on_verified: Check | None) -> Check:
    """The check before a replica's commit: a first generation answered, then the run's own checks."""
    answer = replicas.first_answer(replica, conn, variables, port)

    def verified() -> tuple[bool, str | None]:
        keep, why = answer()
        if not keep or on_verified is None:
            return keep, why
        return on_verified()

    return verified


def _joining_start(replica: "Replica", conn: "Connection", variables: Mapping[str, Any], port: int,
                   report: HostReport, on_verified: Check | None,
                   transaction: Transaction) -> None:
    """A replica whose server does not run (a first deploy, a crashed one): nothing to drain; it is
    started, checked for a first answer, then put in its router (``POST /workers``, unless the router
    lists it already) and awaited healthy there (apply/replicas.py)."""
    replicas.record_joining(replica)  # before the start: a run that cannot put it in leaves word
    transaction(_with_first_answer(replica, conn, variables, port, on_verified))
    if report.status != STATUS_FINISHED:
        return  # rolled back: its server is stopped again, as it was; nothing joins the router
    if replica.unreachable is not None:
        report.ok = False
        report.error = (f"started and healthy, but not behind its router: {replica.unreachable}; the next apply "
                        f"puts {replica.worker_url} in once the router answers")
        return
    try:
        report.notes.append(replicas.put_back(replica, joining=True))
    except GpuopsError as exc:  # it serves (committed), but not behind the router: the host failed its promise
        report.ok = False
        report.error = str(exc).removeprefix(f"{replica.host}: ")


def _drained_roll(replica: "Replica", conn: "Connection", variables: Mapping[str, Any], port: int,
                  report: HostReport, on_verified: Check | None,
                  transaction: Transaction) -> None:
    """A replica's restart (apply/replicas.py): out of its router, drained, changed and restarted
    with a first answer checked before the commit, then back in the router and healthy there."""
    replicas.take_out(replica)  # fails the host before anything changed
    try:
        report.notes.append(replicas.drain(replica, conn, variables, port))
    except BaseException:
        replicas.put_back(replica)  # still busy (or not to be told): it serves on, unchanged
        raise
    try:
        transaction(_with_first_answer(replica, conn, variables, port, on_verified))
    finally:
        if report.status in (STATUS_FINISHED, STATUS_UNCHANGED, STATUS_ROLLED_BACK, STATUS_REFUSED):
            # After a rollback the old setting serves again (the helper saw it healthy), after a refusal
            # nothing was touched: it goes back either way. Otherwise its state is not known: it stays out.
            try:
                report.notes.append(replicas.put_back(replica))
            except GpuopsError as exc:
                report.ok = False
                report.error = "; ".join(e for e in (report.error, str(exc).removeprefix(f"{replica.host}: ")) if e)
        else:
            report.error = (report.error or report.status) + (
                f" -- left out of router {replica.router.url}: put {replica.worker_url} back (POST /workers) "
                "once it serves")
