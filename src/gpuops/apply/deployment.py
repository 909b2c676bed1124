"""The nodes of one multi-node SGLang server (``sglang_deployment: NAME``), changed as one.

Which hosts form a deployment, their ranks and init address (``plan_deployments``, pure) are
``gpuops/multi_node.py``'s, below apply: inspect reports them too. Here:

* ``DeploymentTxn``: the two-phase commit over the nodes' transactions. Each node's transaction is
  an ordinary host transaction under its own lease (``apply/txn.py``) that holds at the points a
  multi-node server needs (``host_protocol.HOLDS``): nobody stops until every node has written and
  passed its checks, nobody starts until every node has stopped (then the workers first, the
  leader last), nobody commits until every node is healthy (the leader's health is the whole
  server's: it waits for every rank), and in a rollback nobody starts the previous server until
  every node has stopped. The first node to fail aborts the others (``{"abort": why}``), so every
  node rolls back; a node whose lease lapses rolls back by itself, and so do all the others,
  whose leases this same process held.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from gpuops.remote import host_protocol as hp
# deployment_of, forks_for: apply/undo.py imports them from here (it is being restructured in
# another change); their home is gpuops/multi_node.py.
from gpuops.multi_node import Deployment, deployment_of, forks_for  # noqa: F401

# ---------------------------------------------------------------- the two-phase commit


class DeploymentTxn:
    """The nodes' transactions of one run held together (see the module's docstring).

    Every node's thread calls ``opened`` (how to send its host a message), ``planned`` (whether
    its plan restarts the server), ``hold`` at each of the host's holds and around the commit
    (``VERIFIED``), and ``ended`` once its transaction is over, whatever happened. A hold returns
    (go on?, why not): it waits until every node has reached the same point, or one failed."""

    VERIFIED = "verified"  # the client's own hold: the commit waits for every node healthy
    ANSWERED = "answered"  # ... then for the leader's first answer
    CHECKED = "checked"    # ... then for every worker's process, health and log
    # ``gpuops rollback``: its second ``stop_ready`` (every node's files back, before any stops),
    # and the ``rollback_stopped`` of a node undoing its failed rollback (the second restart).
    RESTORED = "files_restored"
    UNDONE = "rollback_undone"

    def __init__(self, deployment: Deployment, undoing: bool = False) -> None:
        self.deployment = deployment
        # ``gpuops rollback`` of the deployment's run: its ``rollback_stopped`` hold is the way
        # forward (every node stopped, then the previous servers start), not a node failing;
        # once any node's rollback fails, every node undoes it, restarted together once more.
        self.undoing = undoing
        self._undoing_nodes: set[str] = set()  # nodes whose rollback failed and is being undone
        self._cond = threading.Condition()
        self._reached: dict[str, set[str]] = {name: set() for name in deployment.members}
        self._released: dict[str, set[str]] = {name: set() for name in deployment.members}
        self._ended: set[str] = set()
        self._restarts: dict[str, bool] = {}
        self._senders: dict[str, Callable[[dict[str, Any]], bool]] = {}
        self.failure: str | None = None

    # -- per node

    def opened(self, host: str, send: Callable[[dict[str, Any]], bool]) -> None:
        with self._cond:
            self._senders[host] = send
            failure = self.failure
        if failure is not None:
            send({hp.MESSAGE_ABORT: failure})

    def planned(self, host: str, restarts: bool) -> str | None:
        """Wait for every node's plan; why this node must not go on (None: go on). Whether it then
        restarts is ``restarts()``: every node does when any does (one node's restart takes the
        whole server down), so a node with nothing to change restarts with the others."""
        with self._cond:
            self._restarts[host] = restarts
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.failure is not None
                                or all(n in self._restarts or n in self._ended for n in self.deployment.members))
            return self.failure

    def restarts(self) -> bool:
        with self._cond:
            return any(self._restarts.values())

    def rolling_back(self, host: str, why: str) -> None:
        """``host`` began rolling back its own run (``rolling_back``): every other node is told to.
        In ``gpuops rollback`` that undoes the rollback, and its next ``rollback_stopped`` is the
        restart of the configuration it ran before, held with every other node's (``UNDONE``)."""
        with self._cond:
            self._undoing_nodes.add(host)
        self.fail(host, why)

    def hold(self, host: str, point: str) -> tuple[bool, str | None]:
        """``point``: a host hold (``hp.HOLDS``), ``VERIFIED`` or ``RESTORED``. Ordered: at the
        start holds, a node of rank > 0 goes first and the leader only once every worker was let go.

        A rollback's restart is held even after a failure (every node stopped, then all start
        together): an apply's rollback, and the undo of a failed ``gpuops rollback``. The restart
        of ``gpuops rollback`` itself is not, once a node failed: the node stays stopped
        (``{"restart": false}``) and undoes its rollback with the others."""
        if point == hp.EVENT_ROLLBACK_STOPPED and self.undoing:
            with self._cond:
                if host in self._undoing_nodes:
                    point = self.UNDONE
        rollback = point == self.UNDONE or (point == hp.EVENT_ROLLBACK_STOPPED and not self.undoing)
        if rollback and not self.undoing:
            self.fail(host, "it is rolling back")  # (a recovery of its dead worker says no more)
        with self._cond:
            self._reached[host].add(point)
            self._cond.notify_all()

            def everyone_there() -> bool:
                if self.failure is not None and not rollback:
                    return True
                return all(point in self._reached[n] or n in self._ended for n in self.deployment.members)

            self._cond.wait_for(everyone_there)
            if self.failure is not None and not rollback:
                return False, self.failure
            if point in (hp.EVENT_STOPPED, hp.EVENT_ROLLBACK_STOPPED, self.UNDONE) and host == self.deployment.leader:
                workers = self.deployment.members[1:]
                self._cond.wait_for(lambda: all(point in self._released[n] or n in self._ended for n in workers))
            self._released[host].add(point)
            self._cond.notify_all()
            return True, None

    def commit_gate(self, host: str, checks: Callable[[], tuple[bool, str | None]] | None,
                    node_check: Callable[[], tuple[bool, str | None]] | None = None
                    ) -> Callable[[], tuple[bool, str | None]]:
        """The node's ``on_verified``: its own checks (the smoke check, the log), the wait for every
        other node healthy, then the whole server judged (``apply/deployment_health.py``): the
        leader's first answer, which every node waits for, then each worker's ``node_check`` (its
        process, health, log), which every node waits for too. The host commits only on (True, None)."""
        def verified() -> tuple[bool, str | None]:
            if checks is not None:
                keep, why = checks()
                if not keep:
                    self.fail(host, why or "its checks after the restart failed")
                    return keep, why
            go, why = self.hold(host, self.VERIFIED)
            if not go or node_check is None:
                return go, why
            leader = host == self.deployment.leader
            for point, mine in ((self.ANSWERED, leader), (self.CHECKED, not leader)):
                if mine:
                    keep, why = node_check()
                    if not keep:
                        self.fail(host, why or "its check before the commit failed")
                        return keep, why
                go, why = self.hold(host, point)
                if not go:
                    return go, why
            return True, None

        return verified

    def fail(self, host: str, why: str) -> None:
        """``host`` failed (or began rolling back): every other node is told to roll back."""
        with self._cond:
            first = self.failure is None
            if first:
                self.failure = f"node {host} of deployment {self.deployment.name} failed: {why}"
            failure = self.failure
            others = [send for name, send in self._senders.items() if name != host and name not in self._ended]
            self._cond.notify_all()
        if first:
            for send in others:
                send({hp.MESSAGE_ABORT: failure})

    def restarted(self) -> bool:
        """Did any node stop its server (and so every node restart)?"""
        with self._cond:
            return any(self._reached[n] & {hp.EVENT_STOPPED, hp.EVENT_ROLLBACK_STOPPED, self.UNDONE}
                       for n in self.deployment.members)

    def ended(self, host: str, ok: bool, why: str | None) -> None:
        if not ok:
            self.fail(host, why or "failed")
        with self._cond:
            self._ended.add(host)
            self._senders.pop(host, None)
            self._cond.notify_all()
