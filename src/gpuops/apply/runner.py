"""gpuops apply/rollback/history for a set of hosts: the strategies chosen once per host, and every
host run through the one pipeline (apply/pipeline.py: gather -> plan -> transaction -> verify -> journal).

Per host: ONE exec to gather (files the role touches, the journal, the gate scan when a role
patches), a pure plan, then ONE exec that carries the whole run as a host-owned transaction
(``apply.txn``): gpuops keeps its lease alive, judges the re-audit when the helper sends it, and
confirms once it has seen the verification; the host commits only then. Around the pipeline:
a multi-node deployment's nodes (apply/deployment_node.py), a replica behind a router
(apply/replica_roll.py), a release's environment (apply/release_step.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Sequence

from gpuops import multi_node, timings
from gpuops.apply import deployment_repair
from gpuops.apply import replicas as replica_set
from gpuops.apply.deployment import DeploymentTxn
from gpuops.apply.deployment_node import DeploymentNode
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.host_report import HostReport
from gpuops.apply.noop_memo import discover_or_recall
from gpuops.apply.options import ApplyOptions
from gpuops.apply.pipeline import Strategy, run_host
from gpuops.apply.release_step import ReleasePrep
from gpuops.apply.replica_roll import ReplicaRoll
from gpuops.errors import GpuopsError
from gpuops.plan.planner import discover
from gpuops.transport import run_on_hosts

if TYPE_CHECKING:
    from gpuops.apply.replicas import Replica
    from gpuops.inventory import Host
    from gpuops.plan.planner import Discovery

__all__ = ["ApplyOptions", "HostReport", "apply_role", "apply_host", "rollback_hosts", "history_hosts"]


# ---------------------------------------------------------------- apply


def discover_all(hosts: Sequence["Host"], role: str, extra: ExtraVars) -> dict[str, "Discovery"]:
    """Check the role and every host's variables before any connection (bad input changes nothing)."""

    with timings.span("plan"):
        return {host.name: discover_or_recall(role, host.name, dict(host.vars or {}), dict(extra),
                                              functools.partial(discover, role, host.name, dict(host.vars or {}), dict(extra)))
                for host in hosts}


def strategies_for(replica: "Replica | None", deployment: "DeploymentTxn | None") -> list[Strategy]:
    """What wraps this host's pipeline, in the order they step in: a replica's roll, a deployment's
    node, a release's environment (every host: a plan without a release leaves it idle)."""
    chosen: list[Strategy] = []
    if replica is not None:
        chosen.append(ReplicaRoll(replica))
    if deployment is not None:
        chosen.append(DeploymentNode(deployment))
    return [*chosen, ReleasePrep()]


def apply_host(host: "Host", role: str, extra: ExtraVars, discovery: "Discovery",
               options: ApplyOptions, run_id: str, replica: "Replica | None" = None,
               deployment: "DeploymentTxn | None" = None) -> HostReport:
    """One host's apply: the pipeline with the strategies its replica and deployment call for."""
    return run_host(host, role, extra, discovery, options, run_id, strategies_for(replica, deployment))


def apply_role(hosts: Sequence["Host"], role: str, extra: ExtraVars, options: ApplyOptions) -> tuple[str, dict[str, HostReport]]:
    # The nodes of a multi-node server: their launch flags derived (and checked) before anything else.
    deployments = multi_node.plan_deployments(hosts, extra)
    hosts = [multi_node.with_launch_flags(h, deployments[name]) if name is not None else h
             for h in hosts for name in [multi_node.deployment_name(extra.for_host(h))]]
    discoveries = discover_all(hosts, role, extra)
    # Routers are asked before any host is touched: one down is one clear error, nothing changed.
    replicas = replica_set.preflight(hosts, extra)
    warnings = replica_set.replica_warnings(hosts, extra, replicas,
                                            rolling=bool(options.rollout is not None and options.rollout.sizes))
    def transactions(run_id: str) -> dict[str, HostReport]:
        txns = {name: DeploymentTxn(d) for name, d in deployments.items()}

        def one(host: "Host") -> HostReport:
            name = multi_node.deployment_name(extra.for_host(host))
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
