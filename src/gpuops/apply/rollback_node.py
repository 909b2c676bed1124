"""The deployment strategy of a rollback: a host whose run to undo was a multi-node server's.

Whether it was is known only from the host: its first hold (``stop_ready``, before anything
changed) carries the target run's deployment record, so ``HeldRollback`` is chosen for every host
and is idle on a host whose run was its own. A deployment's run is undone on every node as one
(``DeploymentRollbacks``, around one ``apply/deployment.DeploymentTxn`` with ``undoing=True``):
nobody starts its previous server before every node stopped the new one, the workers go before the
leader, nobody commits before every node is back and healthy, and a node whose rollback ends before
it joins refuses the others at once. ``held_as_one``: the deployment's outcome, one line on every
node's report.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops.apply.deployment import Deployment, DeploymentTxn
from gpuops.apply.host_report import HostReport
from gpuops.apply.rollback_pipeline import RollbackRun, RollbackStrategy
from gpuops.apply.verify_checks import Check
from gpuops.remote.host_protocol import (EVENT_ROLLING_BACK, EVENT_STOP_READY, STATUS_FINISHED, STATUS_REFUSED,
                                         STATUS_ROLLED_BACK, HostEvent)

if TYPE_CHECKING:
    from gpuops.inventory import Host


class HeldRollback(RollbackStrategy):
    """One host's part in a deployment's rollback, if its target run turns out to be a deployment's.
    ``finish_split``: the run committed on some nodes and rolled back on the others
    (apply/deployment_repair.py): the nodes where it rolled back already restart with the others."""

    def __init__(self, deployments: "DeploymentRollbacks", finish_split: bool = False) -> None:
        self.deployments, self.finish_split = deployments, finish_split
        self.record: Any = None    # the target run's deployment record, as the host sent it (untrusted)
        self.manifest: Any = None  # the host's file it was read from
        self.send: Callable[[dict[str, Any]], bool] | None = None  # how to tell the host (an abort)
        self.txn: DeploymentTxn | None = None  # once it joined its deployment's rollback

    def payload(self, run: RollbackRun, payload: dict[str, Any]) -> None:
        if self.finish_split:
            payload["finish_split"] = True

    def commit_check(self, run: RollbackRun, check: Check | None) -> Check | None:
        def verified() -> tuple[bool, str | None]:
            if self.txn is None:
                return check() if check is not None else (True, None)
            return self.txn.commit_gate(run.host.name, check)()

        return verified

    def helper_hooks(self, run: RollbackRun) -> dict[str, Any]:
        return {"on_open": self._opened, "on_hold": functools.partial(self._hold, run.host.name)}

    def _opened(self, send: Callable[[dict[str, Any]], bool]) -> None:
        self.send = send

    def on_event(self, run: RollbackRun, event: HostEvent) -> None:
        if event.name == EVENT_STOP_READY and self.txn is None:
            self.record, self.manifest = event.deployment, event.manifest
        elif event.name == EVENT_ROLLING_BACK and self.txn is not None:
            # its rollback failed: every node undoes it, restarted together again
            self.txn.rolling_back(run.host.name, event.why or "its rollback failed")

    def _hold(self, host: str, event: str) -> tuple[bool, str | None]:
        txn = self.txn
        if event == EVENT_STOP_READY and txn is None:  # the first: the run's record, nothing changed yet
            txn, why = self.deployments.join(host, self.record, self.manifest)
            if txn is None:
                return False, why
            self.txn = txn
            assert self.send is not None  # run_transaction calls on_open before the host can hold
            txn.opened(host, self.send)
        elif event == EVENT_STOP_READY and txn is not None:  # the second: files back, server not yet stopped
            return txn.hold(host, DeploymentTxn.RESTORED)
        if txn is None:
            return False, "not a node of a deployment"
        return txn.hold(host, event)

    def ended(self, run: RollbackRun, ok: bool, error: str) -> None:
        # whatever happened: the other nodes never wait for it
        if self.txn is not None:
            self.txn.ended(run.host.name, ok, error)
        else:
            self.deployments.left(run.host.name, "its own rollback ended" if ok else error)

    def reported(self, run: RollbackRun, report: HostReport) -> None:
        if self.txn is not None:
            self.deployments.took_part(run.host.name, self.txn)


class DeploymentRollbacks:
    """The deployments whose runs one ``gpuops rollback`` undoes, met as their nodes name them.

    A run of a multi-node server is undone on every node as one (``apply/deployment.py``): a node
    whose target run belongs to a deployment says so before it changes anything (the ``stop_ready``
    hold, with the journal's deployment record); this refuses it, nothing changed, when a member
    is not in the rollback, else holds it with the other nodes: nobody starts its previous server
    before every node stopped the new one, the workers go before the leader, and nobody commits
    before every node is back and healthy."""

    def __init__(self, batches: Sequence[Sequence[str]], forks: int) -> None:
        # The nodes must run at once: every one selected, in one batch (--serial), within --forks.
        self.batch_of = {name: number for number, batch in enumerate(batches) for name in batch}
        self.forks = forks
        self._lock = threading.Lock()
        self._txns: dict[str, DeploymentTxn] = {}
        self._gone: dict[str, str] = {}  # hosts whose rollback ended without joining a deployment: why
        self._took_part: dict[str, DeploymentTxn] = {}  # hosts whose rollback ended, a node of this deployment

    def txns(self) -> list[DeploymentTxn]:
        with self._lock:
            return list(self._txns.values())

    def left(self, host: str, why: str) -> None:
        """``host``'s rollback ended without joining a deployment (refused, unreadable, another
        run, unreachable): every deployment that counts it among its nodes is refused at once,
        nothing changed, instead of waiting for it until --timeout."""
        with self._lock:
            self._gone.setdefault(host, why)
            waiting = [t for t in self._txns.values() if host in t.deployment.members]
        for txn in waiting:
            txn.ended(host, False, f"its rollback stopped before it joined the others ({why}); nothing was changed")

    def join(self, host: str, record: Any, manifest: Any = None) -> tuple[DeploymentTxn | None, str | None]:
        """The deployment's transaction for this node, or why it is refused (nothing changed).
        ``manifest``: the host's file the record was read from (named when it is unreadable)."""
        if not isinstance(record, dict) or not isinstance(record.get("members"), list) \
                or not all(isinstance(m, str) for m in record["members"]) or host not in record["members"]:
            where = f" in {manifest}" if isinstance(manifest, str) else ""
            unreadable = (f"{host}: the run's deployment record{where} is not readable: {str(record)[:200]!r}; "
                          "nothing was changed")
            self.left(host, unreadable)  # the nodes waiting for it (their records name it) are let go now
            return None, unreadable
        name = str(record.get("name") or "")
        members: list[str] = record["members"]
        with self._lock:
            txn = self._txns.get(name)
            if txn is None or list(txn.deployment.members) != members:
                txn = self._txns[name] = DeploymentTxn(
                    Deployment(name=name, members=tuple(members), init_addr=str(record.get("init_addr") or "")),
                    undoing=True)
            gone = {m: self._gone[m] for m in members if m in self._gone}
        missing = [m for m in members if m not in self.batch_of]
        split = [m for m in members if m not in missing and self.batch_of[m] != self.batch_of[host]]
        why = None
        if gone:
            node, reason = next(iter(gone.items()))
            why = (f"{host}: deployment {name}'s node {node} stopped its rollback before it joined the others "
                   f"({reason}): a multi-node server is rolled back with all its nodes; nothing was changed")
        elif missing:
            why = (f"{host}: the run belongs to deployment {name} whose other nodes {', '.join(missing)} are not in "
                   "this rollback (-l): a multi-node server is rolled back with all its nodes")
        elif split:
            why = (f"{host}: deployment {name}'s nodes {', '.join(split)} fall in another batch (--serial): a "
                   "multi-node server is rolled back with all its nodes in one batch")
        elif len(members) > self.forks:
            why = f"{host}: deployment {name} has {len(members)} nodes, more than --forks {self.forks}"
        if why is not None:
            txn.ended(host, False, why)  # the other nodes, held for it, are refused too
            return None, why
        return txn, None


    def took_part(self, host: str, txn: DeploymentTxn) -> None:
        """``host``'s rollback ended, with its report, as a node of ``txn``'s deployment."""
        with self._lock:
            self._took_part[host] = txn

    def reports_of(self, txn: DeploymentTxn, reports: Mapping[str, HostReport]) -> dict[str, HostReport]:
        """The reports of ``txn``'s nodes that took part in its rollback, in the deployment's order."""
        with self._lock:
            return {m: reports[m] for m in txn.deployment.members if m in reports and self._took_part.get(m) is txn}


def batches_note(members: Sequence[str], batches: Sequence[Sequence["Host"]]) -> str | None:
    """Where --serial put the deployment's nodes (one batch, as apply does), or None: no batches."""
    if len(batches) < 2:
        return None
    number = next((i for i, batch in enumerate(batches, start=1) if members[0] in {h.name for h in batch}), 0)
    return f"its nodes in one batch (--serial): batch {number} of {len(batches)}"


def held_as_one(txn: DeploymentTxn, nodes: dict[str, HostReport], placed: str | None) -> None:
    """The deployment's outcome, one line on every node's report. A deployment is rolled back or
    not as one: a node rolled back beside one whose rollback was undone is a split, said so, and no
    node of it counts as done."""
    deployment = txn.deployment
    said = {STATUS_FINISHED: "rolled back", STATUS_ROLLED_BACK: "rollback undone",
            STATUS_REFUSED: "refused, nothing changed"}
    states = {name: said.get(r.status, r.status.replace("_", " ").upper()) for name, r in nodes.items()}
    each = ", ".join(f"{name} {state}" for name, state in states.items())
    statuses = {r.status for r in nodes.values()}
    head = f"deployment {deployment.name} ({', '.join(deployment.members)})"
    if statuses == {STATUS_FINISHED} and len(nodes) == deployment.nnodes:
        line = f"{head}: rolled back on every node as one server, restarted together, healthy"
    elif statuses <= {STATUS_ROLLED_BACK, STATUS_REFUSED}:
        restart = ("every node restarted together on it, healthy" if txn.restarted()
                   else "no server was stopped")
        line = (f"{head}: NOT rolled back ({txn.failure or 'refused'}); every node is on the configuration it ran "
                f"before this rollback, {restart} ({each})")
    else:
        line = (f"{head}: NOT ON ONE CONFIGURATION ({each}): {txn.failure or 'a node failed'}; the next gpuops "
                "command on a node whose rollback did not end finishes it, then `gpuops rollback` again")
        for report in nodes.values():
            if report.ok:
                report.ok = False
                report.error = f"{line}"
    if placed is not None:
        line = f"{line}; {placed}"
    for report in nodes.values():
        report.notes.append(line)

