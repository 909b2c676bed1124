"""gpuops rollback and gpuops history: undo a run from its backups on the host; list the journal.

Both go through the host helper, so both first roll back any run whose host-side worker died
(and say so). Both look in every state dir this machine ever used for the host (the inventory's,
and any ``-e gpuops_state_dir=...`` an earlier apply recorded in the home journal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import threading

from gpuops.apply.deployment import Deployment, DeploymentTxn, deployment_of, forks_for
from gpuops.apply.host_report import HostReport
from gpuops.apply.options import ApplyOptions, current_user, inventory_state_dir, new_run_id
from gpuops.apply.remote_exec import run_helper
from gpuops.errors import GpuopsError
from gpuops.remote.host_protocol import EVENT_ROLLING_BACK, EVENT_STOP_READY, KIND_ROLLBACK, HostEvent, MODE_JOURNAL, MODE_ROLLBACK, STATUS_FAILED, STATUS_FINISHED, STATUS_JOURNAL, STATUS_LATER_RUNS_STAND, STATUS_REFUSED, STATUS_ROLLED_BACK, STATUS_SKIPPED
from gpuops.apply.journal import fold_runs, read_home, reconcile_home, record_run_home
from gpuops.apply.recompose import recompose_host
from gpuops import transport
from gpuops.transport import run_on_hosts

if TYPE_CHECKING:
    from gpuops.inventory import Host

def host_key(host: "Host") -> str:
    """Who a home journal record is about: the inventory name alone is not enough (two
    inventories can both call a different machine h01)."""
    return f"{host.user or ''}@{host.address or host.name}:{host.port or 22}"


def _same_host(record: dict[str, Any], host: "Host") -> bool:
    return record.get("host") == host.name and record.get("address") == host_key(host)


def state_dirs_of(host: "Host") -> list[str]:
    """The inventory's state dir first, then every other one the home journal saw for this host."""

    dirs = [inventory_state_dir(host)]
    for record in read_home():
        state_dir = record.get("state_dir")
        if _same_host(record, host) and isinstance(state_dir, str) and state_dir not in dirs:
            dirs.append(state_dir)
    return dirs


def _rollback_state_dir(host: "Host", target: str | None) -> str:
    """Where the run to undo lives: the named run's state dir, else the host's latest one."""

    chosen = None
    for record in read_home():
        if not _same_host(record, host) or not isinstance(record.get("state_dir"), str):
            continue
        if target is None or record.get("run_id") == target:
            chosen = record["state_dir"]
    return chosen or inventory_state_dir(host)


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


def rollback_hosts(hosts: Sequence["Host"], target: str | None, options: ApplyOptions,
                   finish_split: bool = False) -> dict[str, HostReport]:
    """``finish_split``: ``target`` is a deployment's run that committed on some of ``hosts`` and
    rolled back on the others (apply/deployment_repair.py): undone on every node as one, the nodes
    where it rolled back already restarting with the others."""
    run_id = new_run_id()
    batches = rollback_batches(hosts, options)
    together = deployment_of({})
    forks = forks_for(hosts, options.forks, together)  # a deployment's nodes all run at once
    deployments = DeploymentRollbacks([[h.name for h in batch] for batch in batches], forks)
    node_of: dict[str, DeploymentTxn] = {}  # the hosts that took part in a deployment's rollback

    def one(host: "Host") -> HostReport:
        deadline = options.deadline()
        variables = dict(host.vars or {})
        state_dir = _rollback_state_dir(host, target)
        payload = {
            "mode": MODE_ROLLBACK, "run_id": run_id, "state_dir": state_dir, "target": target,
            "force": options.force, "meta": {"role": KIND_ROLLBACK, "user": current_user()},
            "later_runs": "report",   # later runs standing on its files: say so (with the journal), change nothing
        }
        if finish_split:
            payload["finish_split"] = True
        recomposed: tuple[HostReport, str | None] | None = None
        node: dict[str, Any] = {}  # this host as a node of a deployment: its record, sender, transaction

        def on_event(event: HostEvent) -> None:
            if event.name == EVENT_STOP_READY and "txn" not in node:
                node["record"], node["manifest"] = event.deployment, event.manifest
            elif event.name == EVENT_ROLLING_BACK and node.get("txn") is not None:
                # its rollback failed: every node undoes it, restarted together again
                node["txn"].rolling_back(host.name, event.why or "its rollback failed")

        def on_hold(event: str) -> tuple[bool, str | None]:
            txn = node.get("txn")
            if event == EVENT_STOP_READY and txn is None:  # the first: the run's record, nothing changed yet
                txn, why = deployments.join(host.name, node.get("record"), node.get("manifest"))
                if txn is None:
                    return False, why
                node["txn"] = txn
                txn.opened(host.name, node["send"])
            elif event == EVENT_STOP_READY and txn is not None:  # the second: files back, server not yet stopped
                return txn.hold(host.name, DeploymentTxn.RESTORED)
            if txn is None:
                return False, "not a node of a deployment"
            return txn.hold(host.name, event)

        def on_verified() -> tuple[bool, str | None]:
            txn = node.get("txn")
            return (True, None) if txn is None else txn.commit_gate(host.name, None)()

        try:
            conn = transport.connect(host, options.connect)
        except GpuopsError as exc:
            deployments.left(host.name, str(exc))  # a node that cannot be reached holds nobody
            raise
        try:
            # One exec for a plain rollback; a second exec (and a read of the launch files) only
            # when later runs stand on the target's files and it is undone by recomposition.
            result = None
            error = "its rollback did not run"
            try:
                result = run_helper(conn, variables, payload, deadline=deadline, on_event=on_event,
                                    on_hold=on_hold, on_verified=on_verified,
                                    on_open=lambda send: node.__setitem__("send", send))
                error = str(result.error or result.status)
            except Exception as exc:
                error = str(exc)
                raise
            finally:
                # whatever happened: the other nodes never wait for it
                if node.get("txn") is not None:
                    node["txn"].ended(host.name, bool(result is not None and result.ok), error)
                else:
                    deployments.left(host.name, "its own rollback ended" if result is not None and result.ok
                                     else error)
            if result.status == STATUS_LATER_RUNS_STAND:
                try:
                    recomposed = recompose_host(conn, host, state_dir, target, run_id, options, deadline, result)
                except GpuopsError as exc:
                    recomposed = (HostReport(host=host.name, ok=False, status=STATUS_REFUSED, run_id=run_id,
                                             error=str(exc), recovered=list(result.recovered),
                                             notes=list(result.notes)), target)
        finally:
            conn.close()
        if node.get("txn") is not None:
            node_of[host.name] = node["txn"]
        if recomposed is not None:
            report, undid = recomposed
            record_run_home(run_id, host.name, host_key(host), KIND_ROLLBACK, report.status, report.error, state_dir,
                            [{"path": p} for p in report.restored], target=undid, recompose=True)
            return report
        ok = result.ok
        status = result.status
        report = HostReport(host=host.name, ok=ok, status=status, run_id=run_id,
                            restored=list(result.restored),
                            changed=len(result.restored) if ok else 0,
                            error=None if ok else result.error,
                            recovered=list(result.recovered),
                            notes=list(result.notes))
        if ok:
            report.notes.append(f"undid run {result.target}: {result.service or ''}")
            for kept in result.kept:
                report.notes.append(f"--force: the later version of {kept}")
        elif status == STATUS_ROLLED_BACK:
            report.error = f"{report.error} -- the rollback was undone: the host is as it was before it"
        record_run_home(run_id, host.name, host_key(host), KIND_ROLLBACK, report.status, report.error, state_dir,
                        [{"path": p} for p in report.restored], target=result.target)
        return report

    outcomes = run_on_hosts(hosts, one, forks=forks, rollout=options.rollout, failed=lambda r: not r.ok,
                            together=together)
    reports = {name: (o.value if o.ok and o.value is not None
                      else HostReport(host=name, ok=False, status=STATUS_SKIPPED if o.skipped else STATUS_FAILED,
                                      error=o.error))
               for name, o in outcomes.items()}
    for txn in deployments.txns():
        nodes = {m: reports[m] for m in txn.deployment.members if m in reports and node_of.get(m) is txn}
        if nodes:
            held_as_one(txn, nodes, batches_note(txn.deployment.members, batches))
    return reports


def rollback_batches(hosts: Sequence["Host"], options: ApplyOptions) -> list[list["Host"]]:
    """The batches a rollback takes (--serial): as apply's, a batch never splits a deployment (as
    the inventory names it, ``sglang_deployment``). A run whose record names nodes the inventory
    does not group is refused on the host's first hold (``DeploymentRollbacks.join``)."""
    if options.rollout is None:
        return [list(hosts)]
    return options.rollout.batches(list(hosts), deployment_of({}))


def rollback_plan(hosts: Sequence["Host"], options: ApplyOptions) -> list[dict[str, Any]]:
    """``gpuops rollback --check``: each batch's hosts and the deployments among them (no host asked)."""
    together = deployment_of({})
    plan = []
    for batch in rollback_batches(hosts, options):
        deployments: dict[str, list[str]] = {}
        for host in batch:
            name = together(host)
            if name is not None:
                deployments.setdefault(name, []).append(host.name)
        plan.append({"hosts": [h.name for h in batch], "deployments": deployments})
    return plan


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


def history_hosts(hosts: Sequence["Host"], options: ApplyOptions) -> dict[str, Any]:
    """Each host's journal (every state dir it was used with), folded into runs; dead runs are
    rolled back first. Value per host: ``{"runs": [...], "notes": [...]}``."""
    call_id = new_run_id()

    def one(host: "Host") -> dict[str, Any]:
        deadline = options.deadline()
        variables = dict(host.vars or {})
        runs: list[dict[str, Any]] = []
        notes: list[str] = []
        conn = transport.connect(host, options.connect)
        try:
            for state_dir in state_dirs_of(host):
                payload = {"mode": MODE_JOURNAL, "run_id": call_id, "state_dir": state_dir,
                           "meta": {"role": "history", "user": current_user()}}
                result = run_helper(conn, variables, payload, deadline=deadline)
                if result.status != STATUS_JOURNAL:
                    raise GpuopsError(f"{host.name}: cannot read the journal in {state_dir}: "
                                      f"{result.error or result.status}")
                notes.extend(f"{state_dir}: {n}" for n in result.recovered)
                notes.extend(result.notes)
                if result.busy:
                    notes.append(f"{state_dir}: a run is in progress on this host (it holds the lock)")
                records = [dict(r) for r in result.records]
                folded = fold_runs(records)
                for run in folded:
                    run["state_dir"] = state_dir
                runs.extend(folded)
                reconcile_home(host.name, folded, host_key(host))
        finally:
            conn.close()
        return {"runs": runs, "notes": notes}

    return run_on_hosts(hosts, one, forks=options.forks)
