"""gpuops apply/rollback/history for a set of hosts: gather, plan, apply, verify, journal.

Per host: ONE exec to gather (files the role touches, the journal, the gate scan when a role
patches), a pure plan, then ONE exec that carries the whole run as a host-owned transaction
(``apply.txn``): gpuops keeps its lease alive, judges the re-audit when the helper sends it, and
confirms once it has seen the verification; the host commits only then.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops.apply import container_audit, deployment_health
from gpuops.apply.host_report import HostReport
from gpuops.apply.options import ApplyOptions
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.undo import host_key
from gpuops import timings
from gpuops.errors import GpuopsError
from gpuops.remote import missing_python
from gpuops.remote.host_protocol import EVENT_RECOVERING, EVENT_ROLLING_BACK, EVENT_VERIFIED, HostEvent, STATUS_FAILED, STATUS_FINISHED, STATUS_REFUSED, STATUS_ROLLBACK_FAILED, STATUS_ROLLED_BACK, STATUS_STAGED, STATUS_UNCHANGED, STATUS_UNKNOWN

if TYPE_CHECKING:
    from gpuops.apply.deployment import DeploymentTxn
    from gpuops.remote.host_protocol import HelperResult
    from gpuops.apply.replicas import Replica
    from gpuops.inventory import Host
    from gpuops.plan.model import LogCheck, Plan, PlanFacts
    from gpuops.plan.planner import Discovery
    from gpuops.transport import Connection

__all__ = ["ApplyOptions", "HostReport", "apply_role", "apply_host", "rollback_hosts", "history_hosts"]


def _merged(host: "Host", extra: Mapping[str, Any]) -> dict[str, Any]:
    return {**dict(host.vars or {}), **dict(extra)}


# ---------------------------------------------------------------- apply


def discover_all(hosts: Sequence["Host"], role: str, extra: Mapping[str, Any]) -> dict[str, "Discovery"]:
    """Check the role and every host's variables before any connection (bad input changes nothing)."""
    from gpuops.apply.noop_memo import discover_or_recall  # the same role and variables: the same answer
    from gpuops.plan.planner import discover

    with timings.span("plan"):
        return {host.name: discover_or_recall(role, host.name, dict(host.vars or {}), dict(extra),
                                              functools.partial(discover, role, host.name, dict(host.vars or {}), dict(extra)))
                for host in hosts}


def _gather(conn: "Connection", host: "Host", extra: Mapping[str, Any],
            discovery: "Discovery", offer_kept: bool = True) -> tuple[Any, dict[str, Any]]:
    from gpuops.apply.probes import entrypoints_probe, files_probe, journal_probe, server_probe
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gather import ProbeFailure, gather
    from gpuops.plan.model import PlanFacts

    probes: list[Any] = [files_probe(discovery.paths), journal_probe(discovery.state_dir)]
    if discovery.needs_server_state:
        probes.append(server_probe())
    if discovery.entrypoint_pythons:
        probes.append(entrypoints_probe(discovery.entrypoint_pythons, discovery.desired_path))
    kept = None
    if discovery.needs_gate_scan:
        from gpuops.gates.probe import gate_scan_probe

        # with sources: the patch planner's input; kept per host (offered unless --flush-cache)
        probes.append(gate_scan_probe(with_sources=True, host=host, offer=offer_kept))
        gpu_probes = _gpu_probes(host)  # applicability (GPU generation, P2P) is planned from these
        if discovery.container is None:  # docker: the stack is read inside the container, never kept
            from gpuops.apply import kept_facts

            kept = kept_facts.guard(host, gpu_probes, offer=offer_kept)  # skipped on the host while its fingerprint holds
            gpu_probes = kept.probes
        probes.extend(gpu_probes)
    probes = container_audit.gather_probes(discovery, probes)  # docker: the SGLang in the container
    values = gather(conn, probes, preamble=preamble_for_vars(_merged(host, extra)))
    files = values["apply.files"]
    if isinstance(files, ProbeFailure):
        no_python = missing_python(files.reason)
        if no_python is not None:
            raise GpuopsError(f"{host.name}: {no_python} (nothing was changed)")
        raise GpuopsError(f"{host.name}: cannot read the files the role manages: {files.reason}")
    journal = values["apply.journal"]
    journal = [] if isinstance(journal, ProbeFailure) else journal
    scan = None
    if discovery.needs_gate_scan:
        scan = values.get("gates.scan")
        if isinstance(scan, ProbeFailure):
            raise GpuopsError(f"{host.name}: the gate scan failed: {scan.reason}")
    gpu = None
    if discovery.needs_gate_scan:
        if kept is None:
            gpu = _gpu_summary(values)
        else:
            from gpuops.apply import kept_facts

            gpu = kept_facts.summary(kept, host.name, values, _gpu_summary)
    running = values.get("apply.server")
    if isinstance(running, ProbeFailure):
        raise GpuopsError(f"{host.name}: cannot tell whether the server runs: {running.reason}")
    entrypoints = values.get("apply.entrypoints")
    if isinstance(entrypoints, ProbeFailure):  # unread: each launch keeps -m sglang.launch_server
        entrypoints = {}
    facts = PlanFacts(host=host.name, files=files["files"], gate_scan=scan, gpu=gpu,
                      container=container_audit.container_facts(values), server_running=running,
                      entrypoints=entrypoints)
    return facts, {"journal": journal, "python": files["python"], "problems": files["problems"]}


def _gpu_probes(host: "Host") -> list[Any]:
    """The facts part's GPU probes (and the package list, for torch's CUDA): the very probes
    ``facts.host.probes_for`` gathers under these names (tests/unit/test_gpu_probes_for_apply.py),
    built from their own modules so a no-op whose GPU facts are kept never imports the rest of the
    facts (server, launch, the host report: ~3 ms). Gathered with the gate scan only (a role that
    patches): a no-op nccl-env run does not pay for nvidia-smi and the package list."""
    del host  # the GPU probes are the same for every host (probes_for's host-specific ones are not GPU probes)
    try:
        from gpuops.facts import gpu as gpu_fact
        from gpuops.facts import topology as topology_fact
        from gpuops.facts.software import python_packages_probe

        return [*gpu_fact.probes(), *topology_fact.probes(), python_packages_probe()]
    except Exception:  # facts help judge the re-audit; without them it is judged for the target
        return []


def _gpu_summary(values: Mapping[str, Any]) -> dict[str, Any]:
    """Compute capability and CUDA version from the facts probes (None where unknown)."""
    from gpuops.facts.host import host_facts
    from gpuops.gates.kernels import versions_of

    try:
        facts = host_facts(values)
    except Exception:  # facts are a help for judging, never a reason to fail the apply
        return {}
    interconnect = facts.interconnect
    return {"compute_capability": facts.compute_capability,
            "cuda": facts.torch_cuda or facts.banner.cuda_driver_version,
            "gpu_count": len(facts.gpu.gpus) if facts.gpu.known else None,
            "nvlink": interconnect.nvlink,
            "p2p_all_pairs": interconnect.p2p_all_pairs if interconnect.p2p_known else None,
            "p2p_failed_pairs": [list(p) for p in interconnect.p2p_failed_pairs],
            # What the kernel libraries' files say and their versions (gates/kernels.py): a patch
            # whose kernel the host's FlashInfer cannot build is refused (plan/modules.py).
            "kernel_reads": facts.packages.kernels if facts.packages.known else None,
            "kernel_versions": versions_of(facts.packages)}


def _unfinished(journal: list[dict[str, Any]]) -> dict[str, Any] | None:
    from gpuops.apply.journal import fold_runs

    pending = [r for r in fold_runs(journal) if r["outcome"].startswith("unfinished")]
    return pending[-1] if pending else None


def apply_host(host: "Host", role: str, extra: Mapping[str, Any], discovery: "Discovery",
               options: ApplyOptions, run_id: str, replica: "Replica | None" = None,
               deployment: "DeploymentTxn | None" = None) -> HostReport:
    from gpuops.apply.payload import apply_payload
    from gpuops.plan.planner import plan_role, vars_digest
    from gpuops.secret_policy import secret_values
    from gpuops.transport import connect

    deadline = options.deadline()
    conn = connect(host, dataclasses.replace(options.connect, deadline=deadline))  # every command within --timeout
    try:
        facts, extra_facts = _gather(conn, host, extra, discovery, offer_kept=not options.flush_cache)
        with timings.span("plan", host.name):
            from gpuops.apply.noop_memo import plan_or_recall  # an empty plan of the same inputs is not redone

            plan = plan_or_recall(role, facts, dict(host.vars or {}), dict(extra), run_id, extra_facts["journal"],
                                  lambda: plan_role(role, facts, dict(host.vars or {}), dict(extra), run_id=run_id),
                                  recall_kept=not options.flush_cache)
        report = HostReport(
            host=host.name, ok=True, status="checked", changed=plan.changed,
            changes=[c.summary() for c in plan.changes], warnings=list(plan.warnings), notes=list(plan.notes),
            handlers=[h.name for h in plan.handlers], tasks_ok=plan.tasks_ok,
        )
        from gpuops.apply.journal import fold_runs, reconcile_home

        restarts = bool(plan.handlers) and plan.service is not None
        if plan.starts and plan.service is not None:
            report.changed += 1  # a start is a change, as Ansible counts `state: started`
            if options.check:
                report.notes.append(f"would start the server: none runs on port {plan.service.port} "
                                    "(sglang-service keeps it running: Ansible's state: started)")
        if replica is not None:
            from gpuops.apply import replicas as replica_set

            refused = replica_set.refusal(replica, plan.starts, restarts)
            if refused is not None and options.check:
                report.warnings.append(f"apply would refuse: {refused}")
            elif refused is not None:
                report.ok, report.status, report.changed, report.error = False, STATUS_REFUSED, 0, refused
                return report
            if (restarts or replica.left_out or replica.unreachable) and options.check:
                report.notes.append(("join plan: " if plan.starts else "drain plan: ") + replica.plan_line(plan.starts))
        pending = _unfinished(extra_facts["journal"])
        if deployment is not None:
            if options.check:
                report.notes.append(deployment.deployment.plan_line(host.name))
            else:
                # A run left open here (its rollback failed) is finished first on the host, which
                # restarts this node alone: every node then restarts, together, after it.
                refused = deployment.planned(host.name, restarts or pending is not None)
                if refused is not None:
                    report.ok, report.status, report.changed, report.error = False, STATUS_REFUSED, 0, refused
                    return report
                if not restarts and deployment.restarts():
                    # Another node restarts: this one goes down with it, so it restarts with the others.
                    if plan.service is None:  # a recalled no-op plan names no server: plan for real
                        plan = plan_role(role, facts, dict(host.vars or {}), dict(extra), run_id=run_id)
                    if plan.service is None:
                        why = (f"deployment {deployment.deployment.name}: the other nodes restart and this role "
                               "names no server to restart here; nothing changed")
                        deployment.fail(host.name, why)
                        report.ok, report.status, report.changed, report.error = False, STATUS_REFUSED, 0, why
                        return report
                    plan = multi_node_restart(plan)
                    restarts = True
                    report.handlers = [h.name for h in plan.handlers]
                    report.notes.append(f"nothing to change here; restarted with the other nodes of deployment "
                                        f"{deployment.deployment.name}")
        reconcile_home(host.name, fold_runs(extra_facts["journal"]), host_key(host))
        if pending and options.check:
            # The next real run on this host rolls it back first (unless its worker is still alive
            # and holds the lock, in which case that run finishes or rolls back by itself).
            report.warnings.append(
                f"run {pending['run_id']} ({pending.get('role') or pending.get('kind')}) is in progress or did not "
                "finish on this host; the next apply, rollback or history rolls it back first if it is not running")
        if options.check:
            if plan.release is not None:
                _release_check(conn, host, plan, report, _merged(host, extra))
            return report
        digest = vars_digest(dict(host.vars or {}), dict(extra))
        if replica is not None and replica.left_out and not restarts:
            _put_back_left_out(replica, report)  # nothing to restart: it only goes back
            if not report.ok:
                return report
        if not plan.changes and not plan.handlers and not pending:
            # Nothing to do and no other run open on the host: like --check, the host is left
            # untouched (no exec, no lock, no journal line there); the run is journaled at home.
            report.status, report.run_id = STATUS_UNCHANGED, run_id
            _journal_home(report, role, digest, discovery.state_dir, host_key(host))
            return report
        if plan.release is not None:
            # sglang-release: the new environment is built (or found), or the new image pulled (or
            # found), and checked before the transaction, which then only points the launch at it;
            # a refusal stops nothing.
            from gpuops.apply.release_env import EnvRefused

            try:
                report.notes.extend(_release_ready(conn, host, plan, _merged(host, extra)))
            except EnvRefused as exc:
                report.ok, report.status, report.changed, report.error = False, STATUS_REFUSED, 0, str(exc)
                _journal_home(report, role, digest, discovery.state_dir, host_key(host))
                return report
            if plan.entrypoints_unread:  # the environment is there now: its release says how to launch it
                facts, plan = _with_entrypoints(conn, host, extra, facts, plan, run_id)
                report.changes, report.changed = [c.summary() for c in plan.changes], plan.changed + int(plan.starts)
            if plan.release.stage:  # the fleet is prepared; the switch is a later run
                report.status, report.changed, report.run_id = STATUS_STAGED, 0, run_id
                report.notes.append("staged: the release is ready on the host and nothing was switched; apply again "
                                    "without sglang_release_stage to switch")
                return report
        # Applicability (GPU generation) and P2P are decided by the plan, from the GPU facts
        # gathered with the gate scan (plan/applicability.py).
        gpu = dict(facts.gpu or {})
        audit_sh = None
        if plan.audit is not None:
            from gpuops.gates.probe import gate_scan_probe

            audit_sh = container_audit.audit_script(plan, gate_scan_probe(with_sources=False).script)
        payload = apply_payload(plan, run_id, digest, audit_sh)
        variables = _merged(host, extra)

        def on_audit(output: Any) -> tuple[bool, str]:
            return _judge(output, plan, gpu.get("cuda"))

        smoke_after = _smoke_check(conn, plan, variables, report)
        verified: list[HostEvent] = []   # the helper's "verified" event (with the server's log when asked)
        log_failure: list[str] = []

        def on_event(event: HostEvent) -> None:
            if event.name == EVENT_VERIFIED:
                verified[:] = [event]
            elif (deployment is not None and (event.name == EVENT_ROLLING_BACK or (
                    event.name == EVENT_RECOVERING and event.run_id == run_id))):
                # the others roll back too (this run recovered by its relay: this node's worker died;
                # an earlier run left open, recovered first, is no failure of this one)
                # (its relay's recovery holds the previous server's restart for the others, as a rollback does)
                deployment.fail(host.name, event.why or "its host-side worker died")

        def checked() -> tuple[bool, str | None]:
            if plan.log_check is not None:
                keep, why = _judge_log(plan.log_check, verified[-1] if verified else None, report, log_failure)
                if not keep:
                    return keep, why
            return smoke_after() if smoke_after is not None else (True, None)

        on_verified = checked if (plan.log_check is not None or smoke_after is not None) else None
        if deployment is not None:
            payload["deployment"] = deployment.deployment.record(host.name)
            on_verified = deployment_health.gate(deployment, host.name, on_verified, conn, variables, payload,
                                                 lambda: verified[-1].pid if verified else None)

        def transaction(on_verified: Callable[[], tuple[bool, str | None]] | None) -> None:
            result = run_helper(conn, variables, payload, with_preamble=audit_sh is not None,
                                deadline=deadline, on_audit=on_audit if plan.audit is not None else None,
                                on_event=on_event, on_verified=on_verified,
                                on_open=None if deployment is None else functools.partial(deployment.opened, host.name),
                                on_hold=None if deployment is None else functools.partial(deployment.hold, host.name))
            _fold_result(report, result, secret_values(variables))
            if log_failure and report.ok:  # committed, but the feature did not come up: the host failed its promise
                report.ok = False
                report.error = log_failure[0]

        if replica is not None and plan.starts:
            assert plan.service is not None
            _joining_start(replica, conn, variables, plan.service.port, report, on_verified, transaction)
        elif replica is not None and restarts:
            assert plan.service is not None
            _drained_roll(replica, conn, variables, plan.service.port, report, on_verified, transaction)
        else:
            transaction(on_verified)
        if plan.starts and plan.service is not None and report.status == STATUS_FINISHED:
            report.notes.insert(0, f"started: no server ran on port {plan.service.port}; the transaction started it "
                                   f"and it is healthy (pid {report.pid})")
        _journal_home(report, role, digest, discovery.state_dir, host_key(host))
        return report
    finally:
        conn.close()


def _with_entrypoints(conn: "Connection", host: "Host", extra: Mapping[str, Any], facts: "PlanFacts",
                      plan: "Plan", run_id: str) -> tuple["PlanFacts", "Plan"]:
    """The facts with the entrypoints of the launch pythons the gather could not read (a release
    environment built since), and the plan made again from them (one more exec, only then)."""
    import dataclasses

    from gpuops.apply.probes import entrypoints_probe
    from gpuops.facts.python_select import preamble_for_vars
    from gpuops.gather import ProbeFailure, gather
    from gpuops.plan.planner import plan_role

    # Such a python is a release environment's (sglang-release's part of the launch): its launch
    # sets PYTHONPATH empty (plan/release.py), so it is asked without the gather's.
    read = gather(conn, [entrypoints_probe(plan.entrypoints_unread, None, isolated=True)],
                  preamble=preamble_for_vars(_merged(host, extra)))["apply.entrypoints"]
    if isinstance(read, ProbeFailure) or not read:
        return facts, plan
    facts = dataclasses.replace(facts, entrypoints={**dict(facts.entrypoints or {}), **read})
    return facts, plan_role(plan.role, facts, dict(host.vars or {}), dict(extra), run_id=run_id)


def multi_node_restart(plan: "Plan") -> "Plan":
    """``plan`` with its server's restart, for a node of a deployment whose other nodes restart."""
    import dataclasses

    from gpuops.plan.changes import HandlerRun

    assert plan.service is not None
    return dataclasses.replace(plan, handlers=(HandlerRun(name="restart sglang", service=plan.service),))


def _put_back_left_out(replica: "Replica", report: HostReport) -> None:
    from gpuops.apply import replicas

    try:
        report.notes.append(replicas.put_back(replica))
    except GpuopsError as exc:
        report.ok, report.status = False, "failed"
        report.error = str(exc).removeprefix(f"{replica.host}: ")


def _with_first_answer(replica: "Replica", conn: "Connection", variables: Mapping[str, Any], port: int,
                       on_verified: Callable[[], tuple[bool, str | None]] | None) -> Callable[[], tuple[bool, str | None]]:
    """The check before a replica's commit: a first generation answered, then the run's own checks."""
    from gpuops.apply import replicas

    answer = replicas.first_answer(replica, conn, variables, port)

    def verified() -> tuple[bool, str | None]:
        keep, why = answer()
        if not keep or on_verified is None:
            return keep, why
        return on_verified()

    return verified


def _joining_start(replica: "Replica", conn: "Connection", variables: Mapping[str, Any], port: int,
                   report: HostReport, on_verified: Callable[[], tuple[bool, str | None]] | None,
                   transaction: Callable[[Callable[[], tuple[bool, str | None]] | None], None]) -> None:
    """A replica whose server does not run (a first deploy, a crashed one): nothing to drain; it is
    started, checked for a first answer, then put in its router (``POST /workers``, unless the router
    lists it already) and awaited healthy there (apply/replicas.py)."""
    from gpuops.apply import replicas

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
                  report: HostReport, on_verified: Callable[[], tuple[bool, str | None]] | None,
                  transaction: Callable[[Callable[[], tuple[bool, str | None]] | None], None]) -> None:
    """A replica's restart (apply/replicas.py): out of its router, drained, changed and restarted
    with a first answer checked before the commit, then back in the router and healthy there."""
    from gpuops.apply import replicas

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


def _release_ready(conn: "Connection", host: "Host", plan: "Plan", variables: Mapping[str, Any]) -> list[str]:
    """sglang-release before anything stops: the environment built (or found) or the image pulled
    (or found) and checked, then the gate audit of the new tree against the running one, and each
    standing source patch judged on the new tree. Raises ``EnvRefused`` (nothing changed)."""
    from gpuops.apply.release_env import EnvRefused
    from gpuops.plan.release import ReleaseImage

    release = plan.release
    if isinstance(release, ReleaseImage):
        from gpuops.apply import release_image

        ready_image = release_image.make_ready(conn, release, host.name)
        assert ready_image is not None
        notes = [ready_image.note(release.version)]
    else:
        from gpuops.apply.release_env import make_ready

        notes = [make_ready(conn, release, host.name, variables.get("gpuops_python")).note(release.version)]
    audit_notes, refusal = _release_audit(conn, host, release)
    if refusal is not None:
        raise EnvRefused(f"{host.name}: {refusal}")
    return notes + audit_notes


def _release_audit(conn: "Connection", host: "Host", release: Any) -> tuple[list[str], str | None]:
    """The gate audit notes of the new tree (environment or image), and a standing patch's refusal."""
    from gpuops.apply import release_audit
    from gpuops.plan.release import ReleaseImage

    image = release.tag if isinstance(release, ReleaseImage) else None
    old, new = release_audit.audits(conn, host, None if image else release.python, image)
    patch_notes, refusal = release_audit.judge_patches(release.patches, old, new, release.version)
    return release_audit.notes(old, new) + patch_notes, refusal


def _release_check(conn: "Connection", host: "Host", plan: "Plan", report: HostReport,
                   variables: Mapping[str, Any]) -> None:
    """``--check`` of sglang-release: builds and pulls nothing; where the host already holds the
    finished environment (an earlier run built it) or the image, its gate audit against the running
    tree is shown."""
    from gpuops.apply.release_env import EnvRefused, find_ready
    from gpuops.plan.release import ReleaseImage

    image = plan.release if isinstance(plan.release, ReleaseImage) else None
    try:
        if image is not None:
            from gpuops.apply import release_image

            found = release_image.make_ready(conn, image, host.name, pull_missing=False)
            note = found.note(image.version) if found is not None else None
        else:
            ready = find_ready(conn, plan.release, host.name, variables.get("gpuops_python"))
            note = ready.note(plan.release.version) if ready is not None else None
    except EnvRefused as exc:
        report.warnings.append(str(exc))
        return
    if note is None:
        what = f"the image {image.tag} is not on the host yet: apply pulls it" if image is not None else \
            "the environment is not on the host yet: apply builds it"
        report.notes.append(f"{what} before the server stops, then shows the gate audit of the new tree (what SGLang "
                            f"{plan.release.version} opens and closes here) before the switch")
        return
    report.notes.append(note)
    audit_notes, refusal = _release_audit(conn, host, plan.release)
    report.notes.extend(audit_notes)
    if refusal is not None:
        report.warnings.append(f"apply would refuse: {refusal}")


def _smoke_check(conn: "Connection", plan: "Plan", variables: Mapping[str, Any],
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


def _judge_log(check: "LogCheck", event: HostEvent | None, report: HostReport,
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


def _judge(output: Any, plan: "Plan", cuda: str | None) -> tuple[bool, str]:
    """gpuops' verdict on the re-audit the helper ran after patching: the feature must be open."""
    from gpuops.apply.verdict import judge_audit

    assert plan.audit is not None
    try:
        verdict = judge_audit(output, plan.audit, cuda)
    except Exception as exc:  # a judge that cannot read the scan must not leave the run open
        return False, f"the gate re-audit could not be judged: {type(exc).__name__}: {exc}"
    return verdict.ok, verdict.reason


def _journal_home(report: HostReport, role: str, digest: str, state_dir: str | None = None,
                  address: str | None = None) -> None:
    from gpuops.apply.journal import record_run_home
    from gpuops.apply.options import current_user

    record_run_home(report.run_id, report.host, address, role, report.status, report.error, state_dir,
                    [{"path": c["path"], "before_sha256": c["before_sha256"], "after_sha256": c["after_sha256"]}
                     for c in report.changes],
                    user=current_user(), vars_sha256=digest)


def _fold_result(report: HostReport, result: "HelperResult", secrets: list[str]) -> None:
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


def apply_role(hosts: Sequence["Host"], role: str, extra: Mapping[str, Any], options: ApplyOptions) -> tuple[str, dict[str, HostReport]]:
    from gpuops.apply import deployment as multi_node, deployment_repair, replicas as replica_set
    from gpuops.transport import run_on_hosts

    # The nodes of a multi-node server: their launch flags derived (and checked) before anything else.
    deployments = multi_node.plan_deployments(hosts, extra)
    hosts = [multi_node.with_launch_flags(h, deployments[name]) if name is not None else h
             for h in hosts for name in [multi_node.deployment_name(_merged(h, extra))]]
    discoveries = discover_all(hosts, role, extra)
    # Routers are asked before any host is touched: one down is one clear error, nothing changed.
    replicas = replica_set.preflight(hosts, extra)
    warnings = replica_set.replica_warnings(hosts, extra, replicas,
                                            rolling=bool(options.rollout is not None and options.rollout.sizes))
    def transactions(run_id: str) -> dict[str, HostReport]:
        txns = {name: multi_node.DeploymentTxn(d) for name, d in deployments.items()}

        def one(host: "Host") -> HostReport:
            name = multi_node.deployment_name(_merged(host, extra))
            txn = txns.get(name) if name is not None else None
            ok = False
            why: str | None = "failed before its transaction"
            try:
                report = apply_host(host, role, extra, discoveries[host.name], options, run_id, replicas.get(host.name),
                                    txn)
                ok, why = report.ok, report.error
            except GpuopsError as exc:
                why = str(exc)
                raise
            finally:
                if txn is not None:
                    txn.ended(host.name, ok, why)  # whatever happened: the other nodes never wait for it
            if host.name in warnings:
                report.warnings.append(warnings[host.name])
            return report

        # The nodes of one multi-node server restart together: a rolling batch never splits them, and
        # they all run at once (each waits for the others at its holds).
        together = multi_node.deployment_of(extra)
        outcomes = run_on_hosts(hosts, one, forks=multi_node.forks_for(hosts, options.forks, together),
                                rollout=options.rollout, failed=lambda r: not r.ok, together=together)
        reports: dict[str, HostReport] = {}
        for name, outcome in outcomes.items():
            if outcome.ok and outcome.value is not None:
                reports[name] = outcome.value
            else:
                reports[name] = HostReport(host=name, ok=False, status="skipped" if outcome.skipped else "failed",
                                           error=outcome.error)
        return reports

    # Every input checked: a deployment left split between its nodes' commits (by an earlier client,
    # or by this run) is rolled back as one around the transactions (apply/deployment_repair.py).
    return deployment_repair.around(hosts, extra, options, transactions)


from gpuops.apply.undo import history_hosts, rollback_hosts  # noqa: E402  (re-exported for callers)
