"""A multi-node deployment left split between its nodes' commits, found and rolled back as one.

The two-phase commit (``apply/deployment.py``) commits a run on every node only once every node
is healthy, but the commits are still one message per node: a client killed between them (or a
node's session frozen past its lease while the others commit) leaves the run committed on some
nodes while the others' leases lapse and roll it back. One server on two configurations, and
since a node's rollback restarts its server, usually no server at all (the committed leader goes
down with its worker).

No message sent before the commits closes that window: a "decided" record made durable on every
node first only moves it (the client can die between those messages too, and a node that
decided cannot tell whether its partners did), so the repair below is the mechanism, and the
next ``gpuops apply`` or ``gpuops rollback`` on any node of the deployment runs it first:

* every node's journal is read (the ``started`` record of a deployment's run names its deployment:
  name, members, init address), and the deployment's last run ``X`` judged (``multi_node.find_split``, pure):
  committed on some nodes, rolled back (its lease, an abort, a later rollback) on others: a split;
* the rule is ROLLBACK, not roll-forward: the client going away rolls back every node (the issue's
  promise), and the nodes that rolled back did what the protocol promises; rolling forward would
  commit on a node a run whose commit nobody sent. So ``X`` is undone on every node as one
  (``rollback_hosts(finish_split=True)``: the held rollback of ``apply/rollback_node.DeploymentRollbacks``,
  where a node that rolled ``X`` back already restores nothing and restarts its previous server
  with the others, workers before the leader, committed once every node is healthy again);
* then the command goes on (apply) or stops there (rollback: undoing ``X`` was what it was for);
* an apply whose own run ended committed on some nodes and not on others reads the journals again
  and rolls a split back before it returns (``around``), its client being still there.

A node of the split that the command does not select (``-l``), or whose journal cannot be read
while another node committed ``X``: one line naming it, nothing changed (``GpuopsError``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuops import transport
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.host_report import HostReport
from gpuops.apply.options import inventory_state_dir, new_run_id
from gpuops.apply.probes import journal_probe
from gpuops.apply.undo import rollback_hosts
from gpuops.errors import GpuopsError
from gpuops.gather import ProbeFailure, gather
from gpuops.multi_node import Split, deployment_name, find_split
from gpuops.remote.host_protocol import STATUS_FINISHED, STATUS_ROLLED_BACK, STATUS_SKIPPED
from gpuops.transport import run_on_hosts

if TYPE_CHECKING:
    from gpuops.apply.options import ApplyOptions
    from gpuops.inventory import Host


# ---------------------------------------------------------------- reading the nodes, repairing


def _journals(hosts: Sequence["Host"], extra: ExtraVars,
              options: "ApplyOptions") -> dict[str, list[dict[str, Any]] | str]:
    """Each node's journal (its state dir: ``-e``'s, else the inventory's; one read-only exec
    each): records, or why not."""
    def one(host: "Host") -> list[dict[str, Any]] | str:
        conn = transport.connect(host, options.connect)
        try:
            state_dir = str(extra.get("gpuops_state_dir") or inventory_state_dir(host))
            value = gather(conn, [journal_probe(state_dir)]).get("apply.journal")
        finally:
            conn.close()
        return value.reason if isinstance(value, ProbeFailure) else list(value or [])

    outcomes = run_on_hosts(hosts, one, forks=max(options.forks, len(hosts)))
    return {name: (o.value if o.ok and o.value is not None else str(o.error or "it did not answer"))
            for name, o in outcomes.items()}


def splits(selected: Sequence["Host"], inventory: Sequence["Host"], extra: ExtraVars,
           options: "ApplyOptions") -> list[Split]:
    """The splits of the deployments the selected hosts are nodes of (``sglang_deployment``, as the
    inventory or ``-e`` name it), every node's journal read. A node of a split that is not selected:
    one line naming it (``GpuopsError``), nothing changed."""
    names = {n for h in selected for n in [deployment_name(extra.for_host(h))] if n is not None}
    if not names:
        return []
    nodes = {name: [h for h in inventory if deployment_name(extra.for_host(h)) == name]
             for name in names}
    journals = _journals([h for name in sorted(names) for h in nodes[name]], extra, options)
    chosen = {h.name for h in selected}
    found = []
    for name in sorted(names):
        split = find_split(name, {h.name: journals[h.name] for h in nodes[name]})
        if split is None:
            continue
        missing = [m for m in split.deployment.members if m not in chosen]
        if missing:
            raise GpuopsError(f"{missing[0]}: {split.line()}; it is rolled back on every node at once, and "
                              f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not in this run (-l): "
                              f"run it again with every node of {name}; nothing changed")
        found.append(split)
    return found


def finish(split: Split, inventory: Sequence["Host"], options: "ApplyOptions") -> dict[str, "HostReport"]:
    """Undo ``split``'s run on every node as one (the held rollback): each node's report, its notes
    saying what was done."""
    by_name = {h.name: h for h in inventory}
    hosts = [by_name[m] for m in split.deployment.members]
    # Every node at once, in one batch: the held rollback refuses a deployment split over batches.
    held = dataclasses.replace(options, rollout=None, forks=max(options.forks, len(hosts)), force=False)
    reports = rollback_hosts(hosts, split.run_id, held, finish_split=True)
    for name, report in reports.items():
        done = "undone here" if name in split.committed else "rolled back here already; restarted with the others"
        report.notes.insert(0, f"{split.line()}: finished that rollback on every node first ({done})"
                            if report.ok else f"{split.line()}: finishing that rollback failed here")
    return reports


def before_command(selected: Sequence["Host"], inventory: Sequence["Host"], extra: ExtraVars,
                   options: "ApplyOptions") -> tuple[dict[str, "HostReport"], dict[str, list[str]]]:
    """What ``gpuops apply`` / ``gpuops rollback`` do first: with ``--check``, each split as a
    warning on its nodes (nothing changed); else every split finished. Returns (the repaired
    nodes' reports, the warnings by node)."""
    found = splits(selected, inventory, extra, options)
    if options.check:
        return {}, {m: [f"{s.line()}: apply without --check (or gpuops rollback) rolls it back on every node "
                        "first"] for s in found for m in s.deployment.members}
    reports: dict[str, "HostReport"] = {}
    for split in found:
        reports.update(finish(split, inventory, options))
    return reports, {}


def around(hosts: Sequence["Host"], extra: ExtraVars, options: "ApplyOptions",
           transactions: Callable[[str], dict[str, "HostReport"]]) -> tuple[str, dict[str, "HostReport"]]:
    """``gpuops apply``'s transactions (``transactions(run_id)``: every host's report), with the
    splits of their deployments rolled back first, and a split the run leaves itself (a node's
    session frozen past its lease while the others committed, its client still here) rolled back
    before it returns: its nodes then report the run rolled back, with what was done."""

    repaired, warnings = before_command(hosts, hosts, extra, options)
    run_id = new_run_id()
    if not all(r.ok for r in repaired.values()):
        return run_id, stopped_after(hosts, repaired)
    reports = transactions(run_id)
    if not options.check and _may_be_split(hosts, extra, reports):
        for name, report in before_command(hosts, hosts, extra, options)[0].items():
            own = reports[name]
            own.ok, own.changed, own.notes = False, 0, own.notes + report.notes
            what = report.notes[0].split(": finish")[0] if report.notes else "the deployment was split"
            if report.ok:
                own.status = STATUS_ROLLED_BACK
                own.error = f"{what}: this run, rolled back on every node as one (rollback {report.run_id})"
            else:
                own.status = report.status
                own.error = f"{what}: rolling it back on every node failed: {report.error}"
    fold_into(reports, repaired, warnings)
    return run_id, reports


def _may_be_split(hosts: Sequence["Host"], extra: ExtraVars, reports: Mapping[str, "HostReport"]) -> bool:
    """A deployment with a node that committed and one that did not: its journals decide."""
    by_deployment: dict[str, list["HostReport"]] = {}
    for host in hosts:
        name = deployment_name(extra.for_host(host))
        if name is not None and host.name in reports:
            by_deployment.setdefault(name, []).append(reports[host.name])
    return any(any(r.status == STATUS_FINISHED for r in nodes) and not all(r.ok for r in nodes)
               for nodes in by_deployment.values())


def fold_into(reports: dict[str, "HostReport"], repaired: Mapping[str, "HostReport"],
              warnings: Mapping[str, list[str]]) -> None:
    """The command's own reports, with what the repair did (or would do) on each node first."""
    for name, report in reports.items():
        if name in repaired:
            report.notes[:0] = repaired[name].notes
        report.warnings[:0] = warnings.get(name, [])


def stopped_after(selected: Sequence["Host"], repaired: Mapping[str, "HostReport"]) -> dict[str, "HostReport"]:
    """A repair that failed: its nodes' reports, and every other host skipped (nothing done there)."""

    return {h.name: repaired.get(h.name) or HostReport(
        host=h.name, ok=False, status=STATUS_SKIPPED, error="not run: finishing a split deployment's rollback failed")
        for h in selected}
