"""Judging the gate re-audit that the helper ran on the host after patching (the gates part's judge)."""

from __future__ import annotations

from typing import Any

from gpuops.plan.changes import AuditCheck
from gpuops.gates.evaluate import judge
from gpuops.gates.probe import gate_scan_probe
from gpuops.gather import ProbeOutput
from gpuops.frozen import frozen


@frozen
class Verdict:
    """Whether the gate re-audit after patching shows the feature open for the target GPU, and why."""

    ok: bool
    reason: str


def compute_capability_of(target_sm: str) -> str:
    """"sm120" -> "12.0", "sm90" -> "9.0", "sm103" -> "10.3"."""
    digits = "".join(ch for ch in target_sm if ch.isdigit())
    if len(digits) < 2:
        raise ValueError(f"cannot read a compute capability from {target_sm!r}")
    return f"{int(digits[:-1])}.{digits[-1]}"


def judge_audit(audit_output: dict[str, Any] | None, check: AuditCheck, cuda: str | None = None) -> Verdict:
    """The audited feature must come out ``open`` for the target compute capability.
    ``audit_output``: the re-audit's framed output as the helper returns it
    (``{"stdout", "stderr", "exit_status"}``), parsed by the gate scan probe into a ``GateScan``
    and judged into a ``GateReport`` whose ``features[name]["status"]`` decides."""
    if not audit_output:
        return Verdict(False, "the gate re-audit produced no output")

    probe = gate_scan_probe(with_sources=False)
    scan = probe.parse(ProbeOutput(audit_output.get("stdout", ""), audit_output.get("stderr", ""),
                                   int(audit_output.get("exit_status", 0))))
    if not scan.known:
        return Verdict(False, f"the gate re-audit could not scan: {scan.reason or 'unknown reason'}")
    report = judge(scan, compute_capability_of(check.target_sm), cuda, None)
    feature = report.features.get(check.feature)
    status = feature["status"] if feature is not None else None
    if status == "open":
        return Verdict(True, f"{check.feature} is open for {check.target_sm}")
    reason = feature.get("reason", "") if feature is not None else ""
    return Verdict(False, f"the gate re-audit shows {check.feature} {status or 'missing'} for "
                          f"{check.target_sm}, not open ({reason})")
