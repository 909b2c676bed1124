"""A run's manifest (``runs/ID/manifest.json``): the roots it may touch, and the checks that it is the
one the run wrote, naming only files that run managed, with backups inside its own folder, and
directories (``created_dirs``, ``removes_dirs``) only above those files.

Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import hashlib
import json
import os

from gpuops.remote.apply_common import StepFailed
from gpuops.remote.apply_fileops import under


def managed_roots(state_dir, paths):
    """The directories a run may touch: the state dir and the directory of each file it changes."""
    roots = {os.path.normpath(state_dir)}
    roots.update(os.path.dirname(os.path.normpath(p)) for p in paths)
    return sorted(roots)


def load_manifest(state_dir, run):
    """A run's manifest, checked against what its journal recorded: anything else is tampering."""
    run_id = run["run_id"]
    run_dir = os.path.join(state_dir, "runs", run_id)
    path = os.path.join(run_dir, "manifest.json")
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise StepFailed("run %s has no backups on this host any more (%s is missing)" % (run_id, path))
    try:
        manifest = json.loads(text.decode("utf-8"))
    except ValueError:
        raise StepFailed("tampering: the manifest of run %s (%s) is not valid JSON; refusing to touch anything"
                         % (run_id, path))
    recorded = run.get("manifest_sha256")
    if recorded and hashlib.sha256(text).hexdigest() != recorded:
        raise StepFailed("tampering: the manifest of run %s (%s) is not the one the run wrote; refusing to touch "
                         "anything" % (run_id, path))
    journal_paths = {c.get("path") for c in run.get("changes") or []}
    roots = run.get("managed_roots") or managed_roots(state_dir, sorted(p for p in journal_paths if p))
    files_dir = os.path.join(run_dir, "files")
    for entry in manifest.get("files") or []:
        where = entry.get("path") or ""
        if where not in journal_paths or not any(under(where, root) for root in roots):
            raise StepFailed("tampering: the manifest of run %s names %s, which that run did not manage; refusing "
                             "to touch anything" % (run_id, where))
        if entry.get("existed") and not under(entry.get("backup") or "", files_dir):
            raise StepFailed("tampering: the manifest of run %s takes %s's backup from %s, outside %s; refusing "
                             "to touch anything" % (run_id, where, entry.get("backup"), files_dir))
        for directory in dirs_of(entry):
            # An undo removes (or makes again) only directories above the entry's own file.
            if (not isinstance(directory, str) or not os.path.isabs(directory) or os.path.normpath(directory) != directory
                    or directory == where or not under(where, directory)):
                raise StepFailed("tampering: the manifest of run %s names the directory %r for %s, which is not "
                                 "above it; refusing to touch anything" % (run_id, directory, where))
    return manifest


def dirs_of(entry):
    """The directories a manifest entry names: those its run created, those it may remove."""
    named = list(entry.get("created_dirs") or [])
    named += [record.get("path") if isinstance(record, dict) else record for record in entry.get("removes_dirs") or []]
    return named
