"""gpuops apply/rollback/history for a set of hosts: gather, plan, apply, verify, journal.

Per host: ONE exec to gather (files the role touches, the journal, the gate scan when a role
patches), a pure plan, then ONE exec that applies the whole plan through the host-side helper.
A role that patches SGLang's source ends that exec after the re-audit (files written, compiled,
scanned); gpuops judges the scan and a second short exec restarts or rolls back.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.plan.model import Plan
    from gpuops.plan.planner import Discovery
    from gpuops.transport import ConnectOptions, Connection

TEST_FAULT_ENV = "GPUOPS_TEST_FAULT"          # test hook: before_write (helper) | audit_verdict (here)
TEST_CORRUPT_PATCH_ENV = "GPUOPS_TEST_CORRUPT_PATCH"  # test hook: patched text that cannot compile


@dataclass(frozen=True)
class ApplyOptions:
    connect: "ConnectOptions"
    check: bool = False
    diff: bool = False
    become: bool = False
    become_password: str | None = None
    forks: int = 16


@dataclass
class HostReport:
    """The outcome for one host (the JSON schema in roles/README.md)."""

    host: str
    ok: bool
    status: str                      # checked | unchanged | finished | rolled_back | refused | failed
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

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "status": self.status, "changed": self.changed, "changes": self.changes,
            "error": self.error, "run_id": self.run_id, "warnings": self.warnings, "notes": self.notes,
            "handlers": self.handlers, "restored": self.restored, "tasks_ok": self.tasks_ok, "pid": self.pid,
            "log_tail": self.log_tail,
        }


def _import_ssh_first(hosts: Sequence["Host"]) -> None:
    # run_on_hosts preloads fabric in a thread; importing it here first avoids a concurrent
    # import of paramiko from two threads (seen as "partially initialized module" errors).
    if any(h.connection != "local" for h in hosts):
        import fabric  # noqa: F401


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _merged(host: "Host", extra: Mapping[str, Any]) -> dict[str, Any]:
    return {**dict(host.vars or {}), **dict(extra)}


# ---------------------------------------------------------------- running the helper


BECOME_MARK = "gpuops-become-stdin-starts-here"


def become_wrap(command: str, password: str | None) -> tuple[str, bytes]:
    """sudo around ``command``; the password (if any) travels as the first stdin line, never argv.

    sudo reads the password line only when it needs one (NOPASSWD rules skip it), so a marker line
    follows it and the shell skips everything up to the marker: either way the helper's stdin
    starts exactly at its own source, and a password can never end up parsed as code.
    """
    skip = f'while IFS= read -r gpuops_l; do [ "$gpuops_l" = {BECOME_MARK} ] && break; done; {command}'
    if password:
        return f"sudo -S -p '' -- /bin/sh -c {shlex.quote(skip)}", (password + "\n" + BECOME_MARK + "\n").encode()
    return f"sudo -n -- /bin/sh -c {shlex.quote(skip)}", (BECOME_MARK + "\n").encode()


def _helper_command(variables: Mapping[str, Any], with_preamble: bool, options: ApplyOptions) -> tuple[str, bytes]:
    from gpuops.remote import python_command

    python = variables.get("gpuops_python")
    command = python_command(str(python) if python else None)
    if with_preamble:
        # The re-audit must see the packages the server sees: the gather preamble picks that python.
        from gpuops.facts.python_select import preamble_for_vars

        command = "/bin/sh -c " + shlex.quote(preamble_for_vars(dict(variables)) + "\n" + command)
    if options.become:
        return become_wrap(command, options.become_password)
    return command, b""


def gather_as(conn: "Connection", probes: list[Any], preamble: str, options: ApplyOptions) -> dict[str, Any]:
    """``gpuops.gather.gather``, under sudo when --become (the state dir is root's, mode 0700)."""
    from gpuops.gather import GATHER_COMMAND, build_gather_script, gather, new_nonce, parse_outputs, split_gather_output

    if not options.become:
        return gather(conn, probes, preamble=preamble)
    nonce = new_nonce()
    script = build_gather_script(probes, nonce, preamble)
    command, prefix = become_wrap(GATHER_COMMAND, options.become_password)
    result = conn.run(command, stdin=prefix + script.encode())
    outputs = split_gather_output(result.stdout_text(), nonce)
    why = ""
    if len(outputs) < len(probes):
        tail = (result.stderr_text().strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        why = f"the gather script stopped early (sudo?): {tail}"
    return parse_outputs(probes, outputs, why)


def run_helper(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any],
               options: ApplyOptions, with_preamble: bool = False) -> dict[str, Any]:
    """Ship apply_helper + payload in ONE exec; return its final ``result`` object."""
    from gpuops.remote import python_stdin

    command, prefix = _helper_command(variables, with_preamble, options)
    result = conn.run(command, stdin=prefix + python_stdin("apply_helper", payload), timeout=None)
    final = None
    for line in result.stdout_text().splitlines():
        if line.startswith('{"result"'):
            try:
                final = json.loads(line)["result"]
            except ValueError:
                continue
    if final is None:
        tail = (result.stderr_text().strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
        raise GpuopsError(
            f"{conn.host.name}: the apply helper gave no result ({tail}); if a run was started, "
            f"`gpuops history` shows it and `gpuops rollback` undoes it"
        )
    return final


# ---------------------------------------------------------------- apply


def discover_all(hosts: Sequence["Host"], role: str, extra: Mapping[str, Any]) -> dict[str, "Discovery"]:
    """Check the role and every host's variables before any connection (bad input changes nothing)."""
    from gpuops.plan.planner import discover

    return {host.name: discover(role, host.name, dict(host.vars or {}), dict(extra)) for host in hosts}


def _gather(conn: "Connection", host: "Host", extra: Mapping[str, Any], discovery: "Discovery",
            options: ApplyOptions) -> tuple[Any, dict[str, Any]]:
    from gpuops.apply.probes import files_probe, journal_probe
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gather import ProbeFailure
    from gpuops.plan.model import HostFacts

    probes: list[Any] = [files_probe(discovery.paths), journal_probe(discovery.state_dir)]
    if discovery.needs_gate_scan:
        from gpuops.gates.probe import gate_scan_probe

        # The GPUs and CUDA version judge the re-audit; the scan (with sources) feeds the patch.
        probes += _gpu_probes(host) + [gate_scan_probe(with_sources=True)]
    values = gather_as(conn, probes, preamble_for_vars(_merged(host, extra)), options)
    files = values["apply.files"]
    if isinstance(files, ProbeFailure):
        raise GpuopsError(f"{host.name}: cannot read the files the role manages: {files.reason}")
    journal = values["apply.journal"]
    journal = [] if isinstance(journal, ProbeFailure) else journal
    scan, sources, gpu = None, None, {}
    if discovery.needs_gate_scan:
        scan = values.get("gates.scan")
        if isinstance(scan, ProbeFailure):
            raise GpuopsError(f"{host.name}: the gate scan failed: {scan.reason}")
        sources = getattr(scan, "sources", None)
        gpu = _gpu_summary(values)
    facts = HostFacts(host=host.name, files=files["files"], gate_scan=scan, gate_sources=sources)
    return facts, {"journal": journal, "python": files["python"], "problems": files["problems"], "gpu": gpu}


def _gpu_probes(host: "Host") -> list[Any]:
    """The facts part's GPU probes (and the package list, for torch's CUDA), by their pinned entry."""
    try:
        from gpuops.facts.host import probes_for

        return [p for p in probes_for(host) if p.name.startswith("gpu.") or p.name == "software.python"]
    except Exception:  # facts help judge the re-audit; without them it is judged for the target
        return []


def _gpu_summary(values: Mapping[str, Any]) -> dict[str, Any]:
    """Compute capability and CUDA version from the facts probes (None where unknown)."""
    from gpuops.facts.host import host_facts

    try:
        facts = host_facts(values)
    except Exception:  # facts are a help for judging, never a reason to fail the apply
        return {}
    return {"compute_capability": facts.compute_capability,
            "cuda": facts.torch_cuda or getattr(facts.banner, "cuda_driver_version", None)}


def _unfinished(journal: list[dict[str, Any]]) -> dict[str, Any] | None:
    from gpuops.apply.journal import fold_runs

    pending = [r for r in fold_runs(journal) if r["outcome"].startswith("unfinished")]
    return pending[-1] if pending else None


def _corrupt_for_test(plan: "Plan") -> "Plan":
    # Test hook (GPUOPS_TEST_CORRUPT_PATCH=1): make every patched file fail to compile on the host.
    from dataclasses import replace

    changes = tuple(replace(c, after=c.after + "\n)(  # gpuops test: does not compile\n") if c.kind == "patch" else c
                    for c in plan.changes)
    return replace(plan, changes=changes)


def apply_host(host: "Host", role: str, extra: Mapping[str, Any], discovery: "Discovery",
               options: ApplyOptions, run_id: str) -> HostReport:
    from gpuops.apply.journal import append_home
    from gpuops.apply.payload import apply_payload
    from gpuops.plan.planner import plan_role, vars_digest
    from gpuops.plan.redact import secret_values
    from gpuops.remote import source
    from gpuops.transport import connect

    conn = connect(host, options.connect)
    try:
        facts, extra_facts = _gather(conn, host, extra, discovery, options)
        plan = plan_role(role, facts, dict(host.vars or {}), dict(extra))
        report = HostReport(
            host=host.name, ok=True, status="checked", changed=plan.changed,
            changes=[c.summary() for c in plan.changes], warnings=list(plan.warnings), notes=list(plan.notes),
            handlers=[h.name for h in plan.handlers], tasks_ok=plan.tasks_ok,
        )
        pending = _unfinished(extra_facts["journal"])
        if pending and options.check:
            # Not refused here: the helper decides (a run in progress holds the lock; a dead one
            # left an unfinished journal entry), so the message says which it is.
            report.warnings.append(
                f"run {pending['run_id']} ({pending.get('role')}) is in progress or did not finish on this host; "
                f"if it is not running, undo it with `gpuops rollback --run {pending['run_id']}`")
        if options.check:
            return report
        if os.environ.get(TEST_CORRUPT_PATCH_ENV):
            plan = _corrupt_for_test(plan)
        gpu = extra_facts.get("gpu") or {}
        if plan.audit is not None and gpu.get("compute_capability"):
            from gpuops.apply.verdict import compute_capability_of

            wanted = compute_capability_of(plan.audit.target_sm)
            if gpu["compute_capability"] != wanted:
                report.warnings.append(
                    f"this host's GPUs are compute capability {gpu['compute_capability']}, not {wanted} "
                    f"({plan.audit.target_sm}): the patch only matters on {plan.audit.target_sm} GPUs")
        audit_sh = None
        if plan.audit is not None:
            from gpuops.gates.probe import gate_scan_probe

            audit_sh = gate_scan_probe(with_sources=False).script
        digest = vars_digest(dict(host.vars or {}), dict(extra))
        payload = apply_payload(plan, run_id, digest, source("process_manager"), audit_sh,
                                fault=os.environ.get(TEST_FAULT_ENV))
        variables = _merged(host, extra)
        result = run_helper(conn, variables, payload, options, with_preamble=audit_sh is not None)
        if result.get("status") == "audited":
            result = _finish_after_audit(conn, variables, payload, plan, result, options, gpu.get("cuda"))
        _fold_result(report, result, secret_values(variables))
        append_home({
            "run_id": run_id, "host": host.name, "role": role, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "user": payload["meta"]["user"], "vars_sha256": digest, "outcome": report.status,
            "changes": [{"path": c["path"], "before_sha256": c["before_sha256"], "after_sha256": c["after_sha256"]}
                        for c in report.changes],
            "error": report.error,
        })
        return report
    finally:
        conn.close()


def _finish_after_audit(conn: "Connection", variables: Mapping[str, Any], payload: dict[str, Any],
                        plan: "Plan", result: dict[str, Any], options: ApplyOptions,
                        cuda: str | None = None) -> dict[str, Any]:
    from gpuops.apply.verdict import Verdict, judge_audit

    assert plan.audit is not None
    try:
        verdict = judge_audit(result.get("audit_output"), plan.audit, cuda)
    except Exception as exc:  # a judge that cannot read the scan must not leave the run open
        verdict = Verdict(False, f"the gate re-audit could not be judged: {type(exc).__name__}: {exc}")
    if os.environ.get(TEST_FAULT_ENV) == "audit_verdict":  # test hook: a re-audit that fails
        verdict = Verdict(False, "injected fault at audit_verdict (test hook)")
    resume = dict(payload, mode="resume", verdict="ok" if verdict.ok else "failed", verdict_reason=verdict.reason,
                  changes=[], audit=None)
    final = run_helper(conn, variables, resume, options)
    final["audit_verdict"] = verdict.reason
    return final


def _fold_result(report: HostReport, result: dict[str, Any], secrets: list[str]) -> None:
    from gpuops.plan.redact import redact_text

    status = result.get("status", "failed")
    if result.get("log_tail"):
        report.log_tail = redact_text(str(result["log_tail"]), secrets)
    report.run_id = result.get("run_id")
    report.pid = result.get("pid")
    report.restored = list(result.get("restored", []))
    if status in ("finished", "unchanged"):
        report.status = status
        report.ok = True
        if status == "unchanged":
            report.changed = 0
        if result.get("audit_verdict"):
            report.notes.append("gate re-audit: " + result["audit_verdict"])
        return
    report.ok = False
    report.status = status if status in ("rolled_back", "refused", "rollback_failed") else "failed"
    report.error = redact_text(result.get("error") or "unknown failure", secrets)
    if status == "rolled_back":
        report.error += f" -- rolled back: {len(report.restored)} file(s) restored; {result.get('service', '')}".rstrip("; ")
    elif status == "rollback_failed":
        report.error += " -- ROLLBACK FAILED: " + "; ".join(result.get("problems", []))


def apply_role(hosts: Sequence["Host"], role: str, extra: Mapping[str, Any], options: ApplyOptions) -> tuple[str, dict[str, HostReport]]:
    from gpuops.transport import run_on_hosts

    discoveries = discover_all(hosts, role, extra)
    run_id = new_run_id()
    _import_ssh_first(hosts)

    def one(host: "Host") -> HostReport:
        return apply_host(host, role, extra, discoveries[host.name], options, run_id)

    outcomes = run_on_hosts(hosts, one, forks=options.forks)
    reports: dict[str, HostReport] = {}
    for name, outcome in outcomes.items():
        if outcome.ok and outcome.value is not None:
            reports[name] = outcome.value
        else:
            reports[name] = HostReport(host=name, ok=False, status="failed", error=outcome.error)
    return run_id, reports


# ---------------------------------------------------------------- rollback and history


def rollback_hosts(hosts: Sequence["Host"], target: str | None, options: ApplyOptions) -> dict[str, HostReport]:
    from gpuops.apply.journal import append_home
    from gpuops.remote import source
    from gpuops.transport import connect, run_on_hosts

    run_id = new_run_id()
    _import_ssh_first(hosts)

    def one(host: "Host") -> HostReport:
        variables = dict(host.vars or {})
        state_dir = str(variables.get("gpuops_state_dir") or "/var/lib/gpuops")
        payload = {
            "mode": "rollback", "run_id": run_id, "state_dir": state_dir, "target": target,
            "meta": {"role": "rollback", "user": _user()},
            "process_manager": source("process_manager"),
        }
        conn = connect(host, options.connect)
        try:
            result = run_helper(conn, variables, payload, options)
        finally:
            conn.close()
        ok = bool(result.get("ok"))
        report = HostReport(host=host.name, ok=ok, status=result.get("status", "failed"), run_id=run_id,
                            restored=list(result.get("restored", [])), changed=len(result.get("restored", [])),
                            error=None if ok else result.get("error"))
        if ok:
            report.notes.append(f"undid run {result.get('target')}: {result.get('service', '')}")
        append_home({"run_id": run_id, "host": host.name, "role": "rollback", "target": result.get("target"),
                     "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "outcome": report.status,
                     "changes": [{"path": p} for p in report.restored], "error": report.error})
        return report

    outcomes = run_on_hosts(hosts, one, forks=options.forks)
    return {name: (o.value if o.ok and o.value is not None else HostReport(host=name, ok=False, status="failed", error=o.error))
            for name, o in outcomes.items()}


def history_hosts(hosts: Sequence["Host"], options: ApplyOptions) -> dict[str, Any]:
    """Each host's journal, folded into runs (one gather exec per host)."""
    from gpuops.apply.journal import fold_runs
    from gpuops.apply.probes import journal_probe
    from gpuops.gather import ProbeFailure
    from gpuops.transport import connect, run_on_hosts

    def one(host: "Host") -> list[dict[str, Any]]:
        state_dir = str((host.vars or {}).get("gpuops_state_dir") or "/var/lib/gpuops")
        conn = connect(host, options.connect)
        try:
            values = gather_as(conn, [journal_probe(state_dir)], "", options)
        finally:
            conn.close()
        records = values["apply.journal"]
        if isinstance(records, ProbeFailure):
            raise GpuopsError(f"{host.name}: cannot read the journal: {records.reason}")
        return fold_runs(records)

    _import_ssh_first(hosts)
    return run_on_hosts(hosts, one, forks=options.forks)
