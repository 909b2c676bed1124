"""Rollback of an older run by recomposition: which runs stand, and the host's half of the undo.

Stdlib only, Python 3.8+; bundled with the apply helper (``remote/bundle.py``) and imported by the
client too (``apply/undo.py``), so both sides judge a journal the same way.

Undoing the most recent run restores its backups byte for byte. Undoing an OLDER run A while later
runs stand cannot do that: A's backups of the launch files (``desired.json``, the env file, the
launch script or unit) hold the state before A, which lacks every later run's part. So gpuops
undoes A as a new apply run (a "recomposition", journaled as ``kind: rollback, recompose: true,
target: A``) whose planned files are:

- the launch files, computed by the client: the inventory plus every contribution still in effect
  except A's (``plan/compose.py``), rendered by the sglang-service role;
- A's other files (source patches), which no later standing run touched: put back from A's own
  backups here on the host (``restore_changes``), with the same drift and tampering checks as a
  plain rollback.

It is an apply transaction like any other (backups, lease, restart, health, rollback on failure,
recovery after a crash), and can itself be rolled back (which puts A back in effect).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil

from gpuops.remote.apply_journal import runs_by_id
from gpuops.remote.digest import sha256_file
from gpuops.remote.host_protocol import FINISHED, KIND_ROLLBACK, ROLLED_BACK


class RecomposeRefused(Exception):
    """The run cannot be undone this way; the message says why and what to do (one line)."""


def runs_in_order(records):
    """Journal events folded into one dict per run, in order of first appearance (the journal's
    own fold; records without a run id, as a client may read from a damaged journal, skipped)."""
    return runs_by_id([r for r in records if isinstance(r, dict) and isinstance(r.get("run_id"), str)])


def is_rollback(run):
    return run.get("kind") == KIND_ROLLBACK


def undone_runs(runs):
    """Run ids undone by a finished rollback. Undoing a recomposition puts its target back in
    effect, so the target of a recomposition that was itself undone is in effect again."""
    by_id = {run["run_id"]: run for run in runs}
    undone = set()
    for run in runs:
        if not is_rollback(run) or FINISHED not in run["events"]:
            continue
        target = run.get("target")
        undone.add(target)
        undid = by_id.get(target) or {}
        if undid.get("recompose"):
            undone.discard(undid.get("target"))
    return undone


def standing(run, undone):
    """A run whose changes are in effect: it finished, was not rolled back, nor undone since."""
    return FINISHED in run["events"] and ROLLED_BACK not in run["events"] and run["run_id"] not in undone


def paths_of(run):
    return [c.get("path") for c in run.get("changes") or [] if c.get("path")]


def pick_target(runs, wanted):
    """The run ``gpuops rollback`` undoes: the named one, else the newest standing apply run that
    changed the host. None when the host helper should judge (and word the refusal) itself."""
    undone = undone_runs(runs)
    if wanted:
        for run in runs:
            if run["run_id"] == wanted:
                plain_rollback = is_rollback(run) and not run.get("recompose")
                return run if standing(run, undone) and run.get("changes") and not plain_rollback else None
        return None
    for run in reversed(runs):
        if not is_rollback(run) and standing(run, undone) and run.get("changes"):
            return run
    return None


def later_standing(runs, target):
    """The runs after ``target`` still in effect, newest last (recompositions included: they
    rewrote launch files too; plain rollbacks are not: they put files back as they were)."""
    undone = undone_runs(runs)
    later, seen = [], False
    for run in runs:
        if run["run_id"] == target["run_id"]:
            seen = True
            continue
        if not seen or not standing(run, undone):
            continue
        if is_rollback(run) and not run.get("recompose"):
            continue
        later.append(run)
    return later


def touchers(later, path):
    return [run for run in later if path in paths_of(run)]


def name_runs(runs):
    """'r3 (nccl-env), r2 (fusion-sm120)': newest first, as they must be rolled back."""
    return ", ".join("%s (%s)" % (r["run_id"], "rollback of %s" % r.get("target") if is_rollback(r)
                                  else r.get("role") or "?") for r in reversed(runs))


# ---------------------------------------------------------------- the host's half


def check_target(records, target_id):
    """Under the lock: the target still stands (nothing undid it between the plan and now)."""
    runs = runs_in_order(records)
    target = next((r for r in runs if r["run_id"] == target_id), None)
    if target is None:
        raise RecomposeRefused("no run %s in the journal of this host" % target_id)
    if is_rollback(target) and not target.get("recompose"):
        raise RecomposeRefused("run %s is itself a rollback; name the run it undid (%s)" % (target_id, target.get("target")))
    if not standing(target, undone_runs(runs)):
        raise RecomposeRefused("run %s is not in effect on this host (already rolled back)" % target_id)
    return target


def check_unchanged(path, index, expected, target_id, force, kept_dir, error=RecomposeRefused):
    """A file must still hold what run ``target_id`` wrote (``expected``; None: nothing recorded, so
    nothing to compare). A later change raises ``error`` (rollback would destroy it), or with ``force``
    the current file is copied to ``kept_dir`` beside the backups. The one drift check of both a plain
    rollback and a recomposition. Returns (the file's sha256 now or None, the kept note or None)."""
    current = sha256_file(path)
    if expected is None or current == expected:
        return current, None
    if not force:
        raise error(
            "%s changed since run %s wrote it (sha256 now %s, the run wrote %s); rollback would destroy that "
            "change: merge it by hand, or run `gpuops rollback --run %s --force` (keeps the current file "
            "beside the backup)" % (path, target_id, (current or "absent")[:12], expected[:12], target_id))
    if current is None:
        return current, None
    os.makedirs(kept_dir, mode=0o700, exist_ok=True)
    copy = os.path.join(kept_dir, "%03d.later" % index)
    shutil.copy2(path, copy)
    return current, "%s (kept as %s)" % (path, copy)


def restore_changes(manifest, target, paths, force, kept_dir):
    """Changes (apply-payload form) that put ``paths`` back as they were before ``target`` ran,
    from its backups: each file must still hold what the target wrote (else refused, or with
    ``force`` the current file is kept beside the backups). Returns (changes, kept)."""
    wrote = {c.get("path"): c.get("after_sha256") for c in target.get("changes") or []}
    entries = {entry["path"]: (index, entry) for index, entry in enumerate(manifest.get("files") or [])}
    changes, kept = [], []
    for path in paths:
        if path not in entries:
            raise RecomposeRefused("run %s did not change %s; nothing of it to restore" % (target["run_id"], path))
        index, entry = entries[path]
        current, note = check_unchanged(path, index, entry.get("after_sha256") or wrote.get(path), target["run_id"],
                                        force, kept_dir)
        if note:
            kept.append(note)
        if not entry.get("existed"):
            changes.append({"path": path, "delete": True, "before_sha256": current, "after_sha256": None,
                            "remove_dirs": entry.get("created_dirs") or []})
            continue
        with open(entry["backup"], "rb") as handle:
            data = handle.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.get("sha256"):
            raise RecomposeRefused("the backup of %s (%s) is damaged; refusing to touch anything" % (path, entry["backup"]))
        # recreate_dirs: the directories the target removed with the file, made again as they were
        changes.append({"path": path, "after_b64": base64.b64encode(data).decode(), "before_sha256": current,
                        "after_sha256": digest, "mode": "%04o" % int(entry.get("mode") or 0o644),
                        "recreate_dirs": entry.get("removes_dirs") or []})
    return changes, kept


def prepare(payload, records, load_manifest, state_dir):
    """The apply payload's changes for a recomposition (restored files first, then the planned
    launch files) and the journal fields that mark it; raises RecomposeRefused."""
    spec = payload.get("recompose") or {}
    target = check_target(records, spec.get("target"))
    restore = [p for p in spec.get("restore") or [] if isinstance(p, str)]
    planned = list(payload.get("changes") or [])
    overlap = set(restore) & {c.get("path") for c in planned}
    if overlap:
        raise RecomposeRefused("a recomposition both restores and plans %s" % ", ".join(sorted(overlap)))
    restored, kept = [], []
    # Which directories a deletion may take away is the host's to say (the target's manifest), never the payload's.
    planned = [dict((k, v) for k, v in c.items() if k not in ("remove_dirs", "recreate_dirs")) for c in planned]
    deletes = [c for c in planned if c.get("delete")]
    manifest = None
    if restore or (deletes and os.path.isfile(os.path.join(state_dir, "runs", target["run_id"], "manifest.json"))):
        manifest = load_manifest(state_dir, target)
    if restore:
        restored, kept = restore_changes(manifest, target, restore, bool(spec.get("force")),
                                         os.path.join(state_dir, "runs", target["run_id"], "files"))
    created = {e.get("path"): e.get("created_dirs") for e in (manifest or {}).get("files") or [] if not e.get("existed")}
    for change in deletes:  # a planned deletion of a file the target created: the directories it made for it too
        if created.get(change.get("path")):
            change["remove_dirs"] = created[change["path"]]
    fields = {"kind": KIND_ROLLBACK, "recompose": True, "target": target["run_id"]}
    return restored + planned, fields, kept
