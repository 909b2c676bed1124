"""gpuops rollback and gpuops history: undo a run from its backups on the host; list the journal.

Both go through the host helper, so both first roll back any run whose host-side worker died
(and say so). Both look in every state dir this machine ever used for the host (the inventory's,
and any ``-e gpuops_state_dir=...`` an earlier apply recorded in the home journal).

A rollback runs every host through the one rollback pipeline (apply/rollback_pipeline.py:
connect -> transaction -> answer -> journal) with the strategies chosen once per host here,
``rollback_strategies``: a deployment's node (apply/rollback_node.py) and a recomposition
(apply/recompose.py), as apply runs every host through apply/pipeline.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from gpuops import transport
from gpuops.apply.deployment import deployment_of, forks_for
from gpuops.apply.host_report import HostReport
from gpuops.apply.journal import fold_runs, host_key, read_home, reconcile_home
from gpuops.apply.options import ApplyOptions, current_user, inventory_state_dir, new_run_id
from gpuops.apply.recompose import Recompose
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.rollback_node import DeploymentRollbacks, HeldRollback, batches_note, held_as_one
from gpuops.apply.rollback_pipeline import RollbackRun, RollbackStrategy, rollback_host
from gpuops.errors import GpuopsError
from gpuops.remote.host_protocol import MODE_JOURNAL, STATUS_FAILED, STATUS_JOURNAL, STATUS_SKIPPED
from gpuops.transport import run_on_hosts

if TYPE_CHECKING:
    from gpuops.inventory import Host


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


def rollback_strategies(deployments: DeploymentRollbacks, finish_split: bool = False) -> list[RollbackStrategy]:
    """What wraps one host's rollback, in the order they step in. Both for every host: whether its
    target run was a deployment's the host says at its first hold, and whether later runs stand on
    the target's files when it answers (apply/rollback_pipeline.py)."""
    return [HeldRollback(deployments, finish_split), Recompose()]


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

    def one(host: "Host") -> HostReport:
        run = RollbackRun(host=host, target=target, run_id=run_id, options=options, deadline=options.deadline(),
                          state_dir=_rollback_state_dir(host, target))
        return rollback_host(run, rollback_strategies(deployments, finish_split))

    outcomes = run_on_hosts(hosts, one, forks=forks, rollout=options.rollout, failed=lambda r: not r.ok,
                            together=together)
    reports = {name: (o.value if o.ok and o.value is not None
                      else HostReport(host=name, ok=False, status=STATUS_SKIPPED if o.skipped else STATUS_FAILED,
                                      error=o.error))
               for name, o in outcomes.items()}
    for txn in deployments.txns():
        nodes = deployments.reports_of(txn, reports)
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
