"""The nodes of one multi-node SGLang server (``sglang_deployment: NAME``), from the inventory; and
what their journals say of its last run. Pure.

SGLang runs one server over several hosts with ``--nnodes N --node-rank R --dist-init-addr
HOST:PORT``: node 0 (the leader) serves the API and waits at the init address until every rank has
joined; a node of rank > 0 serves only a health route; one node gone takes the whole server down.

* ``plan_deployments``: the nodes of each deployment in rank order (inventory order, or
  ``sglang_node_rank`` on every node), the leader's init address (its ``ansible_host`` and
  ``sglang_dist_port``, default 20000), and each node's launch flags, refusing an inventory whose
  own launch flags say otherwise (one line naming the host);
* ``find_split``: a deployment whose last run committed on some nodes and rolled back on others,
  from the nodes' journals.

Below both of their users: apply changes the nodes as one (``apply/deployment.py``: the two-phase
commit; ``apply/deployment_repair.py``: a split rolled back as one) and ``inspect`` reports them
(``facts/deployment.py``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.extravars import merged
from gpuops.release.flags import merge_flags
from gpuops.remote.host_protocol import FINISHED, KIND_ROLLBACK, REVERTED_BY_ROLLBACK, ROLLBACK_FAILED, ROLLED_BACK, STARTED, UNCHANGED
from gpuops.remote.sglang_argv import flag_value
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host

DEPLOYMENT_VAR = "sglang_deployment"
RANK_VAR = "sglang_node_rank"
DIST_PORT_VAR = "sglang_dist_port"
DEFAULT_DIST_PORT = 20000
# The launch flags gpuops derives, as a host var the sglang-service role merges into the launch.
FLAGS_VAR = "sglang_deployment_args"
DERIVED_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")


@frozen
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
        name = deployment_name(merged(host, extra))
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
    return lambda host: deployment_name(merged(host, extra))


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
        name = deployment_name(merged(host, extra))
        if name is None:
            continue
        missing = [h.name for h in inventory if h.name not in chosen
                   and deployment_name(merged(h, extra)) == name]
        if missing:
            raise GpuopsError(f"{host.name}: deployment {name} also has {', '.join(missing)}, left out of this run "
                              "(-l): a multi-node server is changed with all its nodes")


def _one(name: str, nodes: list["Host"], extra: Mapping[str, Any]) -> Deployment:
    variables = {h.name: merged(h, extra) for h in nodes}
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

    variables = merged(host, extra)
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


# ---------------------------------------------------------------- a split left by a run


class Outcome(enum.Enum):
    """What a node's journal says of one run of its deployment."""

    COMMITTED = "committed"      # finished, and no finished rollback undid it since
    ROLLED_BACK = "rolled back"  # rolled back (its lease, an abort, a failure), or being rolled back (its
    #                              previous server alone not healthy), or undone by a rollback
    OPEN = "open"                # started without an end: in progress, or its worker died (the next
    #                              command that takes the host's lock rolls it back first)
    ABSENT = "absent"            # no record of the run here, or "unchanged" (the node had nothing to do)


@frozen
class Split:
    """Run ``run_id`` of ``deployment`` committed on ``committed`` and rolled back on ``rolled_back``."""

    deployment: Deployment
    run_id: str
    committed: tuple[str, ...]
    rolled_back: tuple[str, ...]

    def line(self) -> str:
        return (f"deployment {self.deployment.name} is split: its run {self.run_id} committed on "
                f"{', '.join(self.committed)} and rolled back on {', '.join(self.rolled_back)}")


def last_run(records: Sequence[Mapping[str, Any]], name: str) -> tuple[str, dict[str, Any]] | None:
    """The newest run of deployment ``name`` in a node's journal: (run id, its deployment record)."""
    found = None
    for record in records:
        deployment = record.get("deployment")
        if record.get("event") == STARTED and isinstance(deployment, dict) and deployment.get("name") == name:
            found = (str(record.get("run_id")), deployment)
    return found


def outcome(records: Sequence[Mapping[str, Any]], run_id: str, name: str) -> Outcome:
    """Run ``run_id`` of deployment ``name`` on this node (one apply over two deployments gives
    both the same run id: a run of another deployment is not this one's)."""
    mine = [r for r in records if r.get("run_id") == run_id]
    if not any(r.get("event") == STARTED and isinstance(r.get("deployment"), dict) and r["deployment"].get("name") == name
               for r in mine):
        return Outcome.ABSENT
    events = [r.get("event") for r in mine]
    if FINISHED in events:
        undone = any(r.get("event") == FINISHED and r.get("kind") == KIND_ROLLBACK and r.get("target") == run_id
                     for r in records)
        return Outcome.ROLLED_BACK if undone else Outcome.COMMITTED
    if ROLLED_BACK in events or REVERTED_BY_ROLLBACK in events or ROLLBACK_FAILED in events:
        # rollback_failed: its files are back, its previous server alone could not be healthy (its
        # partner committed and went down with it): the next command that takes the lock closes it
        return Outcome.ROLLED_BACK
    if UNCHANGED in events:
        return Outcome.ABSENT
    return Outcome.OPEN


def find_split(name: str, journals: Mapping[str, Sequence[Mapping[str, Any]] | str]) -> Split | None:
    """The split of deployment ``name``'s last run, from its nodes' journals (a node's value: its
    records, or why they could not be read), or None. Pure.

    The last run is the newest one any node journaled for the deployment (run ids begin with their
    UTC start time); its members are those its ``started`` record names. A split needs a node that
    committed it and one that rolled it back, with every member's outcome known: a member whose
    journal could not be read, or that is not among ``journals``, is refused (``GpuopsError``,
    naming it) when another node committed; a run still open somewhere is left to settle."""
    lasts = {host: found for host, records in journals.items() if not isinstance(records, str)
             for found in [last_run(records, name)] if found is not None}
    if not lasts:
        return None
    run_id, record = max(lasts.values(), key=lambda found: found[0])
    members = record.get("members")
    if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
        raise GpuopsError(f"{min(h for h, f in lasts.items() if f[0] == run_id)}: the deployment record of run "
                          f"{run_id} is not readable: {str(record)[:200]!r}")
    outcomes: dict[str, Outcome] = {}
    unknown: dict[str, str] = {}
    for member in members:
        records = journals.get(member)
        if records is None:
            unknown[member] = f"not a node of deployment {name} in this inventory"
        elif isinstance(records, str):
            unknown[member] = records
        else:
            outcomes[member] = outcome(records, run_id, name)
    committed = tuple(m for m in members if outcomes.get(m) is Outcome.COMMITTED)
    if not committed:
        return None
    if unknown:
        host, why = next(iter(unknown.items()))
        raise GpuopsError(f"{host}: its journal cannot be read ({why}), so whether deployment {name}'s run "
                          f"{run_id}, committed on {', '.join(committed)}, is split cannot be told; nothing changed")
    if any(o is Outcome.OPEN for o in outcomes.values()):
        return None
    rolled_back = tuple(m for m in members if outcomes[m] is Outcome.ROLLED_BACK)
    if not rolled_back:
        return None
    return Split(Deployment(name=name, members=tuple(members), init_addr=str(record.get("init_addr") or "")),
                 run_id, committed, rolled_back)
