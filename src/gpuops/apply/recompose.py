"""gpuops rollback of an older run while later runs stand: the launch is recomposed without it.

``gpuops rollback`` restores a run's backups when nothing later changed its files (the plain way,
byte for byte). When later runs that still stand rewrote some of them, the backups would undo
those runs' parts too; then, if every file they share with the target is a launch file (what the
sglang-service role renders from the inventory and ``desired.json``), the rollback is a new apply
run, planned here:

- ``desired.json``: the current contributions with the target's part put back to what it was
  before the target ran (``plan.compose.without_run``; the "before" comes from the target's own
  backup of that file on the host, checked against the journal's sha256);
- the launch files: the sglang-service role rendered from the inventory and those contributions;
- the target's other files (source patches): restored by the host from the target's backups
  (``remote/recompose.py``), with the usable-backup, drift (``--force``) and tampering checks;
- a restart, health and identity checks, the lease, rollback on failure: the apply transaction.

A later standing run that changed one of the target's non-launch files (a later patch of the same
source) cannot be recomposed: refused, naming the runs to roll back first, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from gpuops.errors import GpuopsError
from gpuops.remote.host_protocol import (STATUS_FAILED, STATUS_FINISHED, STATUS_LATER_RUNS_STAND, STATUS_REFUSED,
                                         STATUS_ROLLBACK_FAILED, STATUS_ROLLED_BACK, STATUS_UNKNOWN)
from gpuops.apply.options import inventory_state_dir
from gpuops.apply.host_report import HostReport
from gpuops.apply.options import current_user
from gpuops.apply.payload import apply_payload
from gpuops.apply.probes import entrypoints_probe, files_probe
from gpuops.apply.recovery import has_unfinished
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.rollback_pipeline import RollbackRun, RollbackStrategy, Undone
from gpuops.facts.python_select import preamble_for_vars
from gpuops.gather import ProbeFailure, gather
from gpuops.desired_state import composed, read_desired
from gpuops.plan.compose import without_run
from gpuops.plan.model import PlanFacts
from gpuops.plan.planner import discover, plan_role, vars_digest
from gpuops.remote.recompose import is_rollback, later_standing, name_runs, paths_of, pick_target, runs_in_order, touchers
from gpuops.secret_policy import mask_text, secret_values

if TYPE_CHECKING:
    from gpuops.remote.host_protocol import HelperResult
    from gpuops.apply.host_report import HostReport
    from gpuops.apply.options import ApplyOptions
    from gpuops.inventory import Host
    from gpuops.plan.entrypoint import LaunchEntry
    from gpuops.plan.model import Plan
    from gpuops.transport import Connection

ROLE = "sglang-service"   # the role that renders the launch from the inventory and desired.json


@dataclass
class Recomposition:
    """How to undo ``target`` by recomposition on one host."""

    target: dict[str, Any]
    later: list[dict[str, Any]]
    desired_path: str
    restore: list[str] = field(default_factory=list)    # from the target's backups, on the host
    launch: list[str] = field(default_factory=list)     # recomposed here


class Recompose(RollbackStrategy):
    """The recomposition strategy of ``gpuops rollback``, chosen for every host: idle unless the
    helper answers ``later_runs_stand`` (it changed nothing), then the target is undone by
    recomposition over the same connection, or refused (nothing changed) when it cannot be."""

    def answered(self, run: RollbackRun, conn: "Connection", result: "HelperResult") -> Undone | None:
        if result.status != STATUS_LATER_RUNS_STAND:
            return None
        try:
            report, undid = recompose_host(conn, run.host, run.state_dir, run.target, run.run_id, run.options,
                                           run.deadline, result)
        except GpuopsError as exc:
            report = HostReport(host=run.host.name, ok=False, status=STATUS_REFUSED, run_id=run.run_id, error=str(exc),
                                recovered=list(result.recovered), notes=list(result.notes))
            return Undone(report, run.target, recompose=True)
        return Undone(report, undid, recompose=True)


def judge(records: list[dict[str, Any]], wanted: str | None, launch_files: set[str],
          desired_path: str | None) -> Recomposition | None:
    """None: the plain rollback applies (or the host helper words the refusal); else how to
    recompose. Raises GpuopsError when later runs make the undo impossible."""

    runs = runs_in_order(records)
    target = pick_target(runs, wanted)
    if target is None:
        return None
    later = later_standing(runs, target)
    shared = [p for p in paths_of(target) if touchers(later, p)]
    if not shared:
        return None   # nothing later stands on its files: its backups are the way back
    tid = target["run_id"]
    overlapping = [r for r in later if set(paths_of(r)) & set(paths_of(target))]
    if is_rollback(target):
        raise GpuopsError(f"run {tid} (a rollback by recomposition) cannot be undone while later runs that changed "
                          f"its files stand; roll back {name_runs(overlapping)} first")
    blocked = [p for p in shared if p not in launch_files]
    if blocked:
        runs_on = [r for r in later if blocked[0] in paths_of(r)]
        raise GpuopsError(
            f"run {tid} ({target.get('role')}) cannot be undone while later runs stand: {runs_on[-1]['run_id']} "
            f"({runs_on[-1].get('role')}) changed {blocked[0]} again, and only the launch (flags, environment) is "
            f"recomposed; roll back {name_runs(overlapping)} first (newest first), then {tid}")
    if desired_path is None or desired_path not in paths_of(target):
        raise GpuopsError(
            f"run {tid} ({target.get('role')}) recorded no part of the launch (its launch change came from the inventory "
            f"of the time), so it cannot be taken out of it; roll back {name_runs(overlapping)} first, then {tid}, or "
            "change the inventory and apply sglang-service")
    same_role = [r for r in later if not is_rollback(r) and r.get("role") == target.get("role")
                 and desired_path in paths_of(r)]
    if same_role:
        raise GpuopsError(
            f"run {same_role[-1]['run_id']} applied {target.get('role')} again after {tid} and replaced its part of the "
            f"launch; roll back {name_runs(same_role)} first, then {tid}")
    return Recomposition(target=target, later=later, desired_path=desired_path,
                         restore=[p for p in paths_of(target) if p not in launch_files],
                         launch=[p for p in paths_of(target) if p in launch_files])


def backup_path(state_dir: str, target: Mapping[str, Any], path: str) -> str | None:
    """Where the host keeps the target's copy of ``path`` as it was before it (None: it did not
    exist). The helper names backups by the change's position in the run's journaled list."""
    for index, change in enumerate(target.get("changes") or []):
        if change.get("path") == path:
            if not change.get("before_sha256"):
                return None
            return f"{state_dir.rstrip('/')}/runs/{target['run_id']}/files/{index:03d}"
    return None


def contributions_before(files: Mapping[str, Any], state_dir: str, host: str,
                         recomposition: Recomposition) -> dict[str, dict[str, Any]]:
    """desired.json's contributions as the target found them, from its backup (sha256-checked)."""

    target = recomposition.target
    where = backup_path(state_dir, target, recomposition.desired_path)
    if where is None:
        return {}
    backup = files.get(where)
    wanted = next(c.get("before_sha256") for c in target["changes"] if c.get("path") == recomposition.desired_path)
    if backup is None or not backup.exists:
        raise GpuopsError(f"{host}: run {target['run_id']} has no backups on this host any more ({where} is missing); "
                          "roll back the later runs first, newest first")
    if backup.sha256 != wanted or backup.content is None:
        raise GpuopsError(f"{host}: tampering: the backup {where} of run {target['run_id']} is not what it saved; "
                          "refusing to touch anything")
    return read_desired(backup.content, f"{host}: {where}")


def recompose_host(conn: "Connection", host: "Host", state_dir: str, target: str | None, run_id: str,
                   options: "ApplyOptions", deadline: float | None,
                   answer: "HelperResult") -> "tuple[HostReport, str]":
    """Undo ``target`` (or the newest standing run) by recomposition: the host helper's rollback
    mode answered ``later_runs_stand`` (``answer``: the journal as it read it after rolling back
    dead runs, and what it recovered), so no journal is read again here. (its report, the
    target's run id). Raises GpuopsError for an impossible undo (the helper's refusal when the
    records show no recomposition to do)."""

    variables = dict(host.vars or {})
    # the state dir the target ran with (an earlier -e gpuops_state_dir=...), else the inventory's
    extra = {} if state_dir == inventory_state_dir(host) else {"gpuops_state_dir": state_dir}
    discovery = discover(ROLE, host.name, variables, extra)
    preamble = preamble_for_vars({**variables, **extra})
    journal = [dict(r) for r in answer.records]
    recovered = list(answer.recovered)
    refusal = answer.error or "later runs stand on its files"
    if has_unfinished(journal):
        raise GpuopsError(refusal)
    recomposition = judge(journal, target, set(discovery.paths), discovery.desired_path)
    if recomposition is None:
        raise GpuopsError(refusal)   # the helper's pick and ours differ: its wording stands
    tid = recomposition.target["run_id"]
    backups = [b for b in [backup_path(state_dir, recomposition.target, recomposition.desired_path)] if b]
    paths = sorted(set(discovery.paths) | set(recomposition.launch) | set(backups))
    # The entrypoints too: the recomposed launch keeps `sglang serve` where its python's release recommends it.
    values = gather(conn, [files_probe(paths), entrypoints_probe(discovery.entrypoint_pythons, discovery.desired_path)],
                    preamble=preamble)
    gathered, entrypoints = values["apply.files"], values.get("apply.entrypoints")
    if isinstance(gathered, ProbeFailure):
        raise GpuopsError(f"{host.name}: cannot read the launch files: {gathered.reason}")
    entrypoints = {} if isinstance(entrypoints, ProbeFailure) else entrypoints
    plan = _plan(host, variables, extra, gathered["files"], state_dir, recomposition, run_id, entrypoints)
    payload = _payload(plan, recomposition, run_id, options, variables, extra)
    result = run_helper(conn, {**variables, **extra}, payload, deadline=deadline)
    return _report(host, run_id, result, recovered, plan, recomposition), tid


def _report(host: "Host", run_id: str, result: "HelperResult", recovered: list[str], plan: "Plan",
            recomposition: Recomposition) -> "HostReport":
    """The host's outcome as a rollback report (secrets of the host's variables masked)."""

    secrets = secret_values(dict(host.vars or {}))
    ok, status = result.ok, result.status
    known = (STATUS_FINISHED, STATUS_ROLLED_BACK, STATUS_REFUSED, STATUS_ROLLBACK_FAILED, STATUS_UNKNOWN)
    restored = list(result.restored)
    target = recomposition.target
    report = HostReport(host=host.name, ok=ok, status=status if status in known else STATUS_FAILED, run_id=run_id,
                        restored=restored, changed=len(restored) if ok else 0,
                        error=None if ok else mask_text(result.error or status, secrets),
                        recovered=[mask_text(r, secrets) for r in recovered + list(result.recovered)],
                        notes=[mask_text(n, secrets) for n in result.notes])
    if result.log_tail:
        report.log_tail = mask_text(result.log_tail, secrets)
    report.notes.insert(0, f"later runs stand on its files ({', '.join(r['run_id'] for r in recomposition.later)}): "
                           "recomposed instead of restoring its backups")
    if ok:
        desired = next((c for c in plan.changes if c.path == recomposition.desired_path), None)
        left = composed(read_desired(desired.after if desired else None, recomposition.desired_path))
        runs = ", ".join(f"{r['role']} {r['run_id']}" for r in left["runs"]) or "none"
        report.notes.append(f"undid run {target['run_id']} ({target.get('role')}) by recomposition: the launch is the "
                            f"inventory plus the runs still in effect ({runs}); {len(recomposition.restore)} file(s) "
                            "of it restored from its backups")
        report.notes.extend(f"--force: the later version of {kept}" for kept in result.kept)
    elif status == STATUS_ROLLED_BACK:
        report.error = f"{report.error} -- the rollback was undone: the host is as it was before it"
    return report


def _plan(host: "Host", variables: dict[str, Any], extra: dict[str, Any], files: Mapping[str, Any],
          state_dir: str, recomposition: Recomposition, run_id: str,
          entrypoints: Mapping[str, "LaunchEntry"] | None = None) -> "Plan":
    before = contributions_before(files, state_dir, host.name, recomposition)
    target = recomposition.target
    role, tid = str(target.get("role") or ""), target["run_id"]

    def recompose(recorded: dict[str, dict[str, Any]], dest: str) -> dict[str, dict[str, Any]]:
        mine = recorded.get(role)
        if mine is not None and mine.get("run_id") != tid:
            raise GpuopsError(f"{host.name}: {dest}: the part of {role} comes from run {mine.get('run_id')}, not {tid}; "
                              f"roll back {mine.get('run_id')} first")
        return without_run(recorded, before, role)

    facts = PlanFacts(host=host.name, files=dict(files), entrypoints=entrypoints)
    return plan_role(ROLE, facts, variables, extra, run_id=run_id, recompose=recompose)


def _payload(plan: "Plan", recomposition: Recomposition, run_id: str, options: "ApplyOptions",
             variables: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    payload = apply_payload(plan, run_id, vars_digest(dict(variables), dict(extra)), None)
    payload["meta"] = dict(payload["meta"], role=recomposition.target.get("role"), user=current_user())
    payload["recompose"] = {"target": recomposition.target["run_id"], "restore": recomposition.restore,
                            "force": options.force}
    if recomposition.restore and not payload["handlers"] and plan.service is not None:
        # restored sources are read by the server only when it starts again
        payload["handlers"] = [{"name": "restart sglang", "daemon_reload": False}]
    if payload["handlers"] and payload.get("service") is None:
        raise GpuopsError(f"{plan.host}: the recomposed launch has no service to restart")
    return payload

