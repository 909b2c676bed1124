"""Recovery of dead runs: a run whose worker died is rolled back from its manifest, under the lock.

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

from gpuops.remote.apply_common import StepFailed
from gpuops.remote.apply_journal import read_journal, unfinished_runs
from gpuops.remote.apply_lease import NoLease
from gpuops.remote.apply_manifest import load_manifest
from gpuops.remote.apply_run import SERVER_PROBLEM, Run
from gpuops.remote.host_protocol import EVENT_RECOVERING, PREVIOUS_STARTED, ROLLBACK_FAILED, ROLLED_BACK, SERVER_TOUCHED


def recover_unfinished(state_dir, progress, notes, restored_out=None, held=None):
    """Roll back every run whose worker died, or whose own rollback did not finish (we hold the
    lock, so no worker of theirs is alive). Idempotent.

    ``held``: (run id, lease) of the run the relay recovers while gpuops is still connected (its
    worker died mid-run). A node of a multi-node server then holds its previous server's restart
    for gpuops, as a rollback does: restarted on its own, the previous leader was joined by the
    worker node's new server (started just before), which the abort then stopped, taking the
    restarted leader down with it. A run found dead by a later command has nobody to wait for."""
    recovered = []
    records = read_journal(state_dir, notes)
    for run_record in unfinished_runs(records):
        run_id = run_record["run_id"]
        fake = {"state_dir": state_dir, "run_id": run_id, "meta": {}}
        run = Run(fake, progress, held[1] if held is not None and held[0] == run_id else NoLease())
        # The previous server its undo started, if any: waited for, never restarted (Run.restart_previous).
        run.previous_started = last_record(records, run_id, PREVIOUS_STARTED)
        if run_record.get("last_event") == ROLLBACK_FAILED:  # its worker ended it, not all undone
            why = "its rollback had failed"
        else:
            why = "its worker died before the run ended (last step: %s)" % run_record.get("last_event")
        try:
            manifest = load_manifest(state_dir, run_record)
        except StepFailed as exc:
            # No manifest: the worker died before its first write (backups come first), or the
            # backups were pruned/tampered. Nothing can be restored from here; say so and close it.
            run.event(ROLLED_BACK, error=why, restored=[], problems=[str(exc)])
            recovered.append("run %s (%s): %s; %s" % (run_id, run_record.get("role"), why, exc))
            continue
        run.payload = dict(fake, service=manifest.get("service"), handlers=manifest.get("handlers", []))
        run.server_touched = SERVER_TOUCHED in run_record["events"]
        progress({"event": EVENT_RECOVERING, "run_id": run_id})
        restored, problems, service_note = run.restore(manifest)
        if any(not p.startswith(SERVER_PROBLEM) for p in problems):
            # Files could not all be put back: leave the run open so the next command tries again.
            run.event(ROLLBACK_FAILED, error=why, problems=problems)
            raise StepFailed("run %s did not finish and could not be rolled back: %s" % (run_id, "; ".join(problems)))
        run.event(ROLLED_BACK, error="recovered: " + why, restored=restored, service=service_note,
                  problems=problems or None, **run.dirs_note())
        if restored_out is not None:
            restored_out.extend(restored)
        recovered.append("run %s (%s) had not finished (%s); rolled back first: %d file(s) restored, %s%s"
                         % (run_id, run_record.get("role") or run_record.get("kind"), why, len(restored),
                            service_note, ("; " + "; ".join(problems)) if problems else "")
                         + ("; kept %s: not empty any more" % ", ".join(run.kept_dirs) if run.kept_dirs else ""))
    return recovered


def last_record(records, run_id, event):
    """The last journal record of ``run_id`` with ``event`` (its fields as written), or None."""
    found = [r for r in records if r.get("run_id") == run_id and r.get("event") == event]
    return found[-1] if found else None
