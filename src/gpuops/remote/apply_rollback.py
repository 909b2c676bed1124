"""Rolling back an earlier run from its backups: which run, whether it may be undone, undone.

A rollback is a run of its own (backed up and journaled, under the lease, committed by gpuops). An
older run whose launch files later runs changed again is undone by recomposition instead: an apply
run the client plans (``apply_run.recomposition``). Stdlib only, Python 3.8+; bundled with
``apply_helper``.
"""

import os

from gpuops.remote.apply_common import StepFailed
from gpuops.remote.apply_journal import read_journal, runs_by_id
from gpuops.remote.apply_manifest import load_manifest
from gpuops.remote.apply_prune import DEFAULT_KEEP_RUNS, prune_runs
from gpuops.remote.apply_run import Run, guarded, server_running
from gpuops.remote.apply_service import Service
from gpuops.remote.container_image import prune_derived_images
from gpuops.remote.digest import sha256_file
from gpuops.remote.recompose import check_unchanged, later_standing, pick_target, undone_runs
from gpuops.remote.host_protocol import EVENT_STOP_READY, EVENT_VERIFIED, FINISHED, KIND_ROLLBACK, ROLLED_BACK, SERVER_TOUCHED, STATUS_FINISHED, STATUS_LATER_RUNS_STAND


class LaterRunsStand(StepFailed):
    """Later runs still standing changed the target's files: its backups are not the way back."""


def pick_rollback_target(records, wanted, finish_split=False):
    """The run to undo. ``finish_split``: a multi-node run that committed on other nodes of its
    deployment (apply/deployment_repair.py) may be named here although its lease rolled it back on
    this node (or a rollback undid it here while it failed on the others): undoing it again restores
    nothing, and restarts the previous server with the others."""
    runs = runs_by_id(records)
    undone = undone_runs(runs)
    if wanted:
        for run in runs:
            if run["run_id"] == wanted:
                if run.get("kind") == KIND_ROLLBACK and not run.get("recompose"):
                    raise StepFailed("run %s is itself a rollback; name the run it undid (%s), or apply again"
                                     % (wanted, run.get("target")))
                if finish_split and run.get("deployment") and (ROLLED_BACK in run["events"] or wanted in undone):
                    return dict(run, already_undone=True)
                if ROLLED_BACK in run["events"] or wanted in undone:
                    raise StepFailed("run %s was already rolled back" % wanted)
                if not run.get("changes"):
                    raise StepFailed("run %s changed nothing on this host" % wanted)
                later_conflict(runs, run)
                return run
        raise StepFailed("no run %s in the journal of this host" % wanted)
    run = pick_target(runs, None)  # the newest standing apply run that changed the host
    if run is not None:
        later_conflict(runs, run)  # a later recomposition may have rewritten its files
        return run
    raise StepFailed("nothing to roll back: no run still in effect on this host changed it (`gpuops history` lists them)")


def later_conflict(runs, target):
    """Refuse to restore the backups of a run whose files a later, still-standing run changed again.

    gpuops undoes such a run by recomposition instead (an apply run planned by the client,
    remote/recompose.py) where only launch files overlap; this refusal is what is left when the
    overlap cannot be recomposed (a later run changed a file the older one patched): the message
    names every later run that must go first, newest first."""
    paths = {c.get("path") for c in target.get("changes") or []}
    blocking, first_overlap = [], None
    for run in later_standing(runs, target):
        # a later run must go first when it touched a file of the target or of a run that must go first
        touched = {c.get("path") for c in run.get("changes") or []}
        overlap = sorted(paths & touched)
        if overlap:
            blocking.append(run)
            paths |= touched
            first_overlap = first_overlap or (run, overlap[0])
    if not blocking:
        return
    run, path = first_overlap
    order = list(reversed(blocking))
    undo = "; ".join("gpuops rollback --run %s" % r["run_id"] for r in order)
    roles = sorted({r.get("role") for r in blocking if r.get("role")})
    raise LaterRunsStand(
        "run %s changed %s again after %s, and that cannot be recomposed; roll back %s first: run %s; then "
        "gpuops rollback --run %s; then re-apply %s with the same -e values if you want them back"
        % (run["run_id"], path, target["run_id"], order[0]["run_id"], undo, target["run_id"],
           ", ".join(roles) if roles else "what those runs applied"))


def check_drift(manifest, target, force, later_dir):
    """Every file must still hold what the run wrote; a later change is refused (or kept, with force)."""
    wrote = {c.get("path"): c.get("after_sha256") for c in target.get("changes") or []}
    kept = []
    for index, entry in enumerate(manifest["files"]):
        path = entry["path"]
        _, note = check_unchanged(path, index, entry.get("after_sha256") or wrote.get(path), target["run_id"],
                                  force, later_dir, StepFailed)
        if note:
            kept.append(note)
    return kept


def check_rolled_back(manifest, target):
    """A run rolled back here already (``finish_split``): every file must still hold what the
    rollback put back (its backup, or no file), else someone changed it since: refused."""
    for entry in manifest["files"]:
        path = entry["path"]
        current = sha256_file(path) if os.path.lexists(path) else None
        if current != (entry.get("sha256") if entry.get("existed") else None):
            raise StepFailed("%s changed since run %s was rolled back on this host (sha256 %s); nothing was changed"
                             % (path, target["run_id"], (current or "absent")[:12]))


def do_rollback(payload, progress, lease, hooks, notes):
    """Undo a run from its backups, as a run of its own (backed up and journaled too)."""
    state_dir = payload["state_dir"]
    records = read_journal(state_dir, notes)
    try:
        target = pick_rollback_target(records, payload.get("target"), bool(payload.get("finish_split")))
    except LaterRunsStand as exc:
        if payload.get("later_runs") != "report":
            raise
        # The client may undo it by recomposition (apply/recompose.py): it gets the journal as read
        # here, after dead runs were rolled back, so it needs no second read. Nothing was changed;
        return {"ok": False, "status": STATUS_LATER_RUNS_STAND, "error": str(exc), "records": records,
                "run_id": payload.get("run_id")}
    manifest = load_manifest(state_dir, target)
    if manifest.get("deployment"):
        # A node of a multi-node server: its nodes are rolled back as one, so gpuops first learns
        # which deployment the run belongs to and lets this node go only once every node is here
        # (or refuses, nothing changed, when some are missing from the rollback).
        progress({"event": EVENT_STOP_READY, "deployment": manifest["deployment"],
                  "manifest": os.path.join(state_dir, "runs", target["run_id"], "manifest.json")})
        answer = lease.wait_message("stop", "before rolling back a node of deployment %s"
                                    % manifest["deployment"].get("name"))
        if answer.get("stop") is not True:
            raise StepFailed(answer.get("reason") or "gpuops stopped the rollback of this deployment node")
    run = Run(payload, progress, lease, hooks)
    # The rollback's own backups keep the deployment too: undoing it (its own rollback) restarts
    # the node with the others again, held the same way (``Run.hold_restart``).
    run.deployment = manifest.get("deployment")
    run.service = Service(manifest.get("service"), run.pm, progress)
    if target.get("already_undone"):  # finish_split: its files are back already; the server restarts
        check_rolled_back(manifest, target)
        kept = []
    else:
        kept = check_drift(manifest, target, payload.get("force"),
                           os.path.join(state_dir, "runs", target["run_id"], "files"))
    # remove_dirs: what restoring the target may take away, so that this run's own backups can make it again;
    # writes: restoring the file may make directories again (the target removed them), which this run's undo takes
    changes = [{"path": entry["path"], "remove_dirs": entry.get("created_dirs"), "writes": bool(entry.get("existed"))}
               for entry in manifest["files"]]
    run.payload = dict(payload, service=manifest.get("service"), handlers=manifest.get("handlers", []))
    # (after the payload names the service: before, this read "not running" on every host, and
    # undoing a failed rollback left the server stopped instead of restarting the run's own)
    run.server_running_before = server_running(run) if manifest.get("service") else False
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    own_manifest = run.backup(changes, {"kind": KIND_ROLLBACK, "target": target["run_id"]})
    run.journal_started(kind=KIND_ROLLBACK, target=target["run_id"], role=target.get("role"),
                        user=run.meta.get("user"), client=run.meta.get("client"), manifest_sha256=own_manifest["_sha256"],
                        managed_roots=own_manifest["managed_roots"], changes=[{"path": c["path"]} for c in changes])

    def forward():
        run.phase("before_write")
        restored, problems = run.restore_files(manifest)
        run.hooks.at_phase(run, "rollback_restore")
        if run.deployment and manifest.get("service"):
            # No node stops before every node has its files back: one node's stop takes the whole
            # server down, so a node that cannot restore its files fails here, no server touched.
            if problems:
                raise StepFailed("; ".join(problems))
            progress({"event": EVENT_STOP_READY})
            run.released(lease.wait_message("stop", "before stopping the server"), "stop")
        run.server_touched = bool(manifest.get("service"))
        if run.server_touched:
            run.event(SERVER_TOUCHED)  # durable before the server is touched: its undo restarts it
        service_note = run.restart_previous(manifest, problems)
        if problems:
            raise StepFailed("; ".join(problems))
        run.phase("confirm")
        progress({"event": EVENT_VERIFIED, "pid": None})
        answer = lease.wait_message("commit", "while waiting for gpuops to confirm the rollback")
        if answer.get("commit") is False:  # another node of its deployment failed: undone here too
            raise StepFailed(answer.get("reason") or "gpuops did not confirm the rollback")
        run.event(FINISHED, kind=KIND_ROLLBACK, target=target["run_id"], restored=restored, service=service_note,
                  **run.dirs_note())
        prune_runs(state_dir, int(payload.get("keep_runs") or DEFAULT_KEEP_RUNS), notes)
        prune_derived_images(run, notes)  # docker: the undone run's derived image, now unused
        return dict({"ok": True, "status": STATUS_FINISHED, "target": target["run_id"], "restored": restored,
                     "service": service_note, "run_id": run.run_id, "kept": kept}, **run.dirs_note())

    # A rollback that cannot finish puts back what it found (its own backups): the target stays
    # in effect and can be rolled back again; nothing is left half-undone.
    result = guarded(run, own_manifest, forward)
    result.setdefault("target", target["run_id"])
    return result
