"""The deployment strategy: a host that is one node of a multi-node server. The nodes' pipelines
run at once and meet at the deployment's two-phase commit (apply/deployment.DeploymentTxn): each
waits for every node's plan, a node with nothing to change restarts with the others, the host's
holds wait for every node, the whole server is judged before any node commits
(apply/deployment_health.py), and one node rolling back rolls every node back."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from gpuops.apply import deployment_health
from gpuops.apply.pipeline import HostRun, Refusal, Strategy
from gpuops.apply.verify_checks import Check
from gpuops.plan.changes import HandlerRun
from gpuops.remote.host_protocol import EVENT_RECOVERING, EVENT_ROLLING_BACK, HostEvent

if TYPE_CHECKING:
    from gpuops.apply.deployment import DeploymentTxn
    from gpuops.plan.model import Plan


class DeploymentNode(Strategy):
    def __init__(self, txn: "DeploymentTxn") -> None:
        self.txn = txn

    def planned(self, run: HostRun) -> None:
        txn, host = self.txn, run.host.name
        if run.options.check:
            run.report.notes.append(txn.deployment.plan_line(host))
            return
        # A run left open here (its rollback failed) is finished first on the host, which
        # restarts this node alone: every node then restarts, together, after it.
        refused = txn.planned(host, run.restarts or run.pending is not None)
        if refused is not None:
            raise Refusal(refused)
        if not run.restarts and txn.restarts():
            self._restart_with_the_others(run)

    def _restart_with_the_others(self, run: HostRun) -> None:
        """Another node restarts: this one goes down with it, so it restarts with the others."""
        name = self.txn.deployment.name
        if run.plan.service is None:  # a recalled no-op plan names no server: plan for real
            run.plan = run.replan()
        if run.plan.service is None:
            why = f"deployment {name}: the other nodes restart and this role names no server to restart here; nothing changed"
            self.txn.fail(run.host.name, why)
            raise Refusal(why)
        run.plan = multi_node_restart(run.plan)
        run.restarts = True
        run.report.handlers = [h.name for h in run.plan.handlers]
        run.report.notes.append(f"nothing to change here; restarted with the other nodes of deployment {name}")

    def commit_check(self, run: HostRun, payload: dict[str, Any], check: Check | None) -> Check | None:
        payload["deployment"] = self.txn.deployment.record(run.host.name)
        return deployment_health.gate(self.txn, run.host.name, check, run.conn, run.variables, payload,
                                      lambda: run.verified[-1].pid if run.verified else None)

    def helper_hooks(self, run: HostRun) -> dict[str, Any]:
        return {"on_open": functools.partial(self.txn.opened, run.host.name),
                "on_hold": functools.partial(self.txn.hold, run.host.name)}

    def on_event(self, run: HostRun, event: HostEvent) -> None:
        if event.name == EVENT_ROLLING_BACK or (event.name == EVENT_RECOVERING and event.run_id == run.run_id):
            # the others roll back too (this run recovered by its relay: this node's worker died;
            # an earlier run left open, recovered first, is no failure of this one)
            # (its relay's recovery holds the previous server's restart for the others, as a rollback does)
            self.txn.fail(run.host.name, event.why or "its host-side worker died")


def multi_node_restart(plan: "Plan") -> "Plan":
    """``plan`` with its server's restart, for a node of a deployment whose other nodes restart."""
    assert plan.service is not None
    return dataclasses.replace(plan, handlers=(HandlerRun(name="restart sglang", service=plan.service),))
