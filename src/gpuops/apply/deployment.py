"""The nodes of one multi-node SGLang server (``sglang_deployment: NAME``), changed as one.

SGLang runs one server over several hosts with ``--nnodes N --node-rank R --dist-init-addr
HOST:PORT``: node 0 (the leader) serves the API and waits at the init address until every rank has
joined; a node of rank > 0 serves only a health route; one node gone takes the whole server down.
So its nodes are one unit for gpuops:

* ``plan_deployments`` (pure): the nodes of each deployment in rank order (inventory order, or
  ``sglang_node_rank`` on every node), the leader's init address (its ``ansible_host`` and
  ``sglang_dist_port``, default 20000), and each node's launch flags, refusing an inventory whose
  own launch flags say otherwise (one line naming the host);
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

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.remote import host_protocol as hp
from gpuops.release.flags import merge_flags
from gpuops.remote.sglang_argv import flag_value

if TYPE_CHECKING:
    from gpuops.inventory import Host

DEPLOYMENT_VAR = "sglang_deployment"
RANK_VAR = "sglang_node_rank"
DIST_PORT_VAR = "sglang_dist_port"
DEFAULT_DIST_PORT = 20000
# The launch flags gpuops derives, as a host var the sglang-service role merges into the launch.
FLAGS_VAR = "sglang_deployment_args"
DERIVED_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")


@dataclass(frozen=True)
class Deployment:
    """One multi-node server: its name, its nodes' host names in rank order, its init address."""

    name: str
    members: tuple[str, ...]
    init_addr: str

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def leader(self) -> str:
        return self.members[0]

    def rank(self, host: str) -> int:
        return self.members.index(host)

    def launch_flags(self, host: str) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.rank(host)), "--dist-init-addr", self.init_addr]

    def plan_line(self, host: str) -> str:
        """``--check``: this node's place and how the run goes."""
        rank = self.rank(host)
        role = "the leader (its health is the server's)" if rank == 0 else "a worker (healthy by /health)"
        return (f"deployment {self.name}: node {rank} of {self.nnodes} ({', '.join(self.members)}), {role}; launch "
                f"{' '.join(self.launch_flags(host))}; changed as one server: every node written and checked, then "
                "all stopped, workers started before the leader, committed once every node is healthy, else all "
                "rolled back")

    def record(self, host: str) -> dict[str, Any]:
        """What the host's journal keeps with the run (``started``): enough to find the others."""
        return {"name": self.name, "rank": self.rank(host), "nnodes": self.nnodes, "members": list(self.members),
                "init_addr": self.init_addr}


def deployment_name(variables: Mapping[str, Any]) -> str | None:
    name = variables.get(DEPLOYMENT_VAR)
    return str(name) if name not in (None, "") else None


def plan_deployments(hosts: Sequence["Host"], extra: Mapping[str, Any]) -> dict[str, Deployment]:
    """Every deployment the run's hosts belong to (pure); bad input: one ``GpuopsError`` naming the host."""
    groups: dict[str, list["Host"]] = {}
    for host in hosts:
        name = deployment_name({**dict(host.vars or {}), **dict(extra)})
        if name is not None:
            groups.setdefault(name, []).append(host)
    found = {name: _one(name, nodes, extra) for name, nodes in groups.items()}
    for deployment in found.values():
        for host in groups[deployment.name]:
            _check_own_flags(host, deployment, extra)
    return found


def deployment_of(extra: Mapping[str, Any]) -> Callable[["Host"], str | None]:
    """``together`` for ``Rollout.batches`` / ``run_on_hosts`` (apply and rollback): a rolling
    batch never splits a deployment, its nodes restart together."""
    return lambda host: deployment_name({**dict(host.vars or {}), **dict(extra)})


def forks_for(hosts: Sequence["Host"], forks: int, together: Callable[["Host"], str | None]) -> int:
    """``--forks``, raised to the largest deployment's size: its nodes wait for each other at their holds."""
    sizes: dict[str, int] = {}
    for host in hosts:
        name = together(host)
        if name is not None:
            sizes[name] = sizes.get(name, 0) + 1
    return max([forks, *sizes.values()])


def check_whole(selected: Sequence["Host"], inventory: Sequence["Host"], extra: Mapping[str, Any]) -> None:
    """A run takes every node of a deployment it touches (``-l`` may not leave one out): one node
    restarted alone takes the whole server down, and its configuration would split from the others'."""
    chosen = {h.name for h in selected}
    for host in selected:
        name = deployment_name({**dict(host.vars or {}), **dict(extra)})
        if name is None:
            continue
        missing = [h.name for h in inventory if h.name not in chosen
                   and deployment_name({**dict(h.vars or {}), **dict(extra)}) == name]
        if missing:
            raise GpuopsError(f"{host.name}: deployment {name} also has {', '.join(missing)}, left out of this run "
                              "(-l): a multi-node server is changed with all its nodes")


def _one(name: str, nodes: list["Host"], extra: Mapping[str, Any]) -> Deployment:
    variables = {h.name: {**dict(h.vars or {}), **dict(extra)} for h in nodes}
    given = {h.name: variables[h.name].get(RANK_VAR) for h in nodes}
    if all(rank in (None, "") for rank in given.values()):
        members = [h.name for h in nodes]  # inventory order
    else:
        ranks: dict[int, str] = {}
        for host in nodes:
            raw = given[host.name]
            if raw in (None, ""):
                raise GpuopsError(f"{host.name}: {RANK_VAR} is set on other nodes of deployment {name} but not "
                                  "here; set it on every node or on none (inventory order)")
            try:
                rank = int(raw)
            except (TypeError, ValueError):
                raise GpuopsError(f"{host.name}: {RANK_VAR} must be a whole number, not {raw!r}") from None
            if not 0 <= rank < len(nodes) or isinstance(raw, bool):
                raise GpuopsError(f"{host.name}: {RANK_VAR} {raw!r} is outside 0..{len(nodes) - 1} "
                                  f"(deployment {name} has {len(nodes)} nodes in this run)")
            if rank in ranks:
                raise GpuopsError(f"{host.name}: {RANK_VAR} {rank} is also {ranks[rank]}'s in deployment {name}")
            ranks[rank] = host.name
        members = [ranks[r] for r in range(len(nodes))]
    leader = next(h for h in nodes if h.name == members[0])
    raw_port = variables[leader.name].get(DIST_PORT_VAR, DEFAULT_DIST_PORT)
    try:
        port = int(raw_port)
    except (TypeError, ValueError):
        port = -1
    if isinstance(raw_port, bool) or not 0 < port < 65536:
        raise GpuopsError(f"{leader.name}: {DIST_PORT_VAR} must be a TCP port (1-65535), not {raw_port!r}")
    address = leader.address or leader.name
    host_part = f"[{address}]" if ":" in address else address
    return Deployment(name=name, members=tuple(members), init_addr=f"{host_part}:{port}")


def _check_own_flags(host: "Host", deployment: Deployment, extra: Mapping[str, Any]) -> None:
    """The inventory may spell the flags itself, but must agree with what gpuops derives."""

    variables = {**dict(host.vars or {}), **dict(extra)}
    words = merge_flags(_words(variables.get("sglang_args")), _words(variables.get("sglang_extra_args")))
    derived = deployment.launch_flags(host.name)
    for flag, value in zip(derived[0::2], derived[1::2]):
        given = flag_value(words, flag)
        if given is not None and given.strip() != value:
            why = {"--nnodes": f"deployment {deployment.name} has {deployment.nnodes} nodes "
                               f"({', '.join(deployment.members)})",
                   "--node-rank": f"it is node {deployment.rank(host.name)} of deployment {deployment.name} "
                                  f"(inventory order, or {RANK_VAR})",
                   "--dist-init-addr": f"deployment {deployment.name}'s leader {deployment.leader} is at "
                                       f"{deployment.init_addr} (its address and {DIST_PORT_VAR})"}[flag]
            raise GpuopsError(f"{host.name}: the launch flags say {flag} {given} but {why}")


def _words(value: Any) -> list[str]:
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        return []  # not a list: the role's own assert names it
    return [str(v) for v in value]


def with_launch_flags(host: "Host", deployment: Deployment) -> "Host":
    """The host with the derived flags as the var the sglang-service role merges into the launch."""
    return dataclasses.replace(host, vars={**dict(host.vars or {}), FLAGS_VAR: deployment.launch_flags(host.name)})


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
