"""The pipeline's verify step: what gpuops checks before a host commits (the gate re-audit, the
server's log for a feature, greedy prompts before and after the restart), and the helper's result
folded into the host's report. Each check answers (keep the run?, why not)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from gpuops.apply.host_report import HostReport
from gpuops.remote.host_protocol import HostEvent, STATUS_FAILED, STATUS_FINISHED, STATUS_REFUSED, STATUS_ROLLBACK_FAILED, STATUS_ROLLED_BACK, STATUS_UNCHANGED, STATUS_UNKNOWN

if TYPE_CHECKING:
    from gpuops.plan.model import LogCheck, Plan
    from gpuops.remote.host_protocol import HelperResult
    from gpuops.transport import Connection

Check = Callable[[], tuple[bool, str | None]]


def commit_checks(plan: "Plan", smoke_after: Check | None, verified: list[HostEvent], report: HostReport,
                  log_failure: list[str]) -> Check | None:
    """The plan's checks before the commit (the feature's log line, then the smoke prompts); None: none."""
    if plan.log_check is None and smoke_after is None:
        return None

    def checked() -> tuple[bool, str | None]:
        if plan.log_check is not None:
            keep, why = judge_log(plan.log_check, verified[-1] if verified else None, report, log_failure)
            if not keep:
                return keep, why
        return smoke_after() if smoke_after is not None else (True, None)

    return checked


def smoke_check(conn: "Connection", plan: "Plan", variables: Mapping[str, Any],
                 report: HostReport) -> Callable[[], tuple[bool, str | None]] | None:
    """Greedy prompts before the restart now, and after it (from the transaction, before the commit).

    Runs only for roles that touch kernels, when the run restarts a server that answers now.
    Different answers are a warning; with ``-e smoke_rollback=true`` the run is rolled back."""
    from gpuops.apply import smoke

    if not plan.handlers or plan.service is None or not smoke.wanted(plan.role, variables):
        return None
    python = str(variables.get("gpuops_python") or "python3")  # any python3 on the host sends the prompts
    limit = smoke.timeout_s(variables)
    before = smoke.run_prompts(conn, plan.service.port, python, limit)
    if before.outputs is None:
        report.notes.append(f"smoke check skipped: the server did not answer before the restart ({before.error})")
        return None
    rollback = smoke.truthy(variables.get("smoke_rollback", False))

    def after_restart() -> tuple[bool, str | None]:
        after = smoke.run_prompts(conn, plan.service.port, python, limit)  # type: ignore[union-attr]
        if after.outputs is None:  # it answered before the restart: a server that cannot answer now is not kept
            return False, f"smoke check: the restarted server did not answer the prompts ({after.error})"
        changed = smoke.differences(before.outputs or [], after.outputs)
        if not changed:
            report.notes.append(f"smoke check: {len(smoke.PROMPTS)} greedy prompts answer the same after the restart")
            return True, None
        what = (f"smoke check: {len(changed)} of {len(smoke.PROMPTS)} greedy prompts (temperature 0, "
                f"{smoke.MAX_TOKENS} tokens) answer differently after the restart: " + "; ".join(changed))
        if rollback:
            return False, what + " (smoke_rollback=true: rolled back)"
        report.warnings.append(what + " (pass -e smoke_rollback=true to roll such a change back)")
        return True, None

    return after_restart


def judge_log(check: "LogCheck", event: HostEvent | None, report: HostReport,
               failure: list[str]) -> tuple[bool, str | None]:
    """The server's log since its start (sent with "verified") judged for ``check.feature``:
    (keep the run?, why not). A feature that fell back is rolled back with ``check.rollback``,
    else the run stands and ``failure`` gets the line that fails the host's report."""
    from gpuops import pcie_ipc

    up, line = pcie_ipc.log_verdict((event.log if event is not None else None) or "")
    if up:
        report.notes.append(f"in effect: the server logged \"{line}\"")
        return True, None
    if up is None:
        report.warnings.append(f"not confirmed in effect: {line}")
        return True, None
    what = f"not in effect: the server logged \"{line}\""
    if check.rollback:
        return False, what + " (pcie_rollback_on_fallback=true: rolled back)"
    failure.append(what + "; the change stands (pass -e pcie_rollback_on_fallback=true to roll such a run back)")
    return True, None


def judge_reaudit(output: Any, plan: "Plan", cuda: str | None) -> tuple[bool, str]:
    """gpuops' verdict on the re-audit the helper ran after patching: the feature must be open."""
    from gpuops.apply.verdict import judge_audit

    assert plan.audit is not None
    try:
        verdict = judge_audit(output, plan.audit, cuda)
    except Exception as exc:  # a judge that cannot read the scan must not leave the run open
        return False, f"the gate re-audit could not be judged: {type(exc).__name__}: {exc}"
    return verdict.ok, verdict.reason


def fold_result(report: HostReport, result: "HelperResult", secrets: list[str]) -> None:
    from gpuops.secret_policy import mask_text as redact_text

    status = result.status
    if result.log_tail:
        report.log_tail = redact_text(result.log_tail, secrets)
    report.run_id = result.run_id or report.run_id
    report.pid = result.pid
    report.restored = list(result.restored)
    report.recovered = [redact_text(r, secrets) for r in result.recovered]
    report.notes.extend(redact_text(n, secrets) for n in result.notes)
    if status in (STATUS_FINISHED, STATUS_UNCHANGED):
        report.status = status
        report.ok = True
        if status == STATUS_UNCHANGED:
            report.changed = 0
        if result.audit_verdict:
            report.notes.append("gate re-audit: " + result.audit_verdict)
        return
    report.ok = False
    known = (STATUS_ROLLED_BACK, STATUS_REFUSED, STATUS_ROLLBACK_FAILED, STATUS_UNKNOWN)
    report.status = status if status in known else STATUS_FAILED
    report.error = redact_text(result.error or f"the helper ended with status {status!r}", secrets)
    if status != STATUS_UNKNOWN:
        report.changed = 0  # whatever was planned, nothing of it stands on the host now
    if status == STATUS_ROLLED_BACK:
        report.error += f" -- rolled back: {len(report.restored)} file(s) restored; {result.service or ''}".rstrip("; ")
    elif status == STATUS_ROLLBACK_FAILED:
        # What the host left the server as (a previous server still starting, not running, ...).
        failed = list(result.problems) + ([result.service] if result.service else [])
        report.error += " -- ROLLBACK FAILED: " + "; ".join(failed)
