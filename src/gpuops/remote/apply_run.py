"""One apply run as a transaction: back up, write, compile-check, re-audit, restart, verify, commit.

``Run`` holds the steps and the way back (``restore``, ``rollback``); ``guarded`` rolls the host back
on any failure before gpuops' commit; ``do_apply`` is the apply mode (also the undo of an older run
by recomposition, ``remote/recompose.py``). Stdlib only, Python 3.8+; bundled with ``apply_helper``.
"""

import base64
import hashlib
import json
import os
import shutil
import tempfile
import time

from gpuops.remote.apply_commands import run_polled
from gpuops.remote.apply_common import StepFailed, now
from gpuops.remote.apply_fileops import (append_line, atomic_write, dir_records, fsync_dir, missing_dirs,
                                        recreate_dirs, remove_created_dirs)
from gpuops.remote.apply_journal import JOURNAL_FILE, read_journal
from gpuops.remote.apply_common import LeaseLapsed
from gpuops.remote.apply_lease import NoLease
from gpuops.remote.apply_manifest import load_manifest, managed_roots
from gpuops.remote.apply_prune import DEFAULT_KEEP_RUNS, prune_runs
from gpuops.remote import process_manager
from gpuops.remote.apply_service import Service, backend_call, previous_service
from gpuops.remote.container_image import build_for_run, discard_built_image, prune_derived_images
from gpuops.remote.digest import sha256_file
from gpuops.remote.host_hooks import HostHooks
from gpuops.remote.host_protocol import EVENT_ROLLBACK_STOPPED, EVENT_STOP_READY, EVENT_STOPPED, EVENT_AUDITED, EVENT_COMMITTED, EVENT_COMPILED, EVENT_DIR_KEPT, EVENT_HEALTHY, EVENT_PHASE, EVENT_ROLLED_BACK, EVENT_ROLLING_BACK, EVENT_VERIFIED, EVENT_WROTE, FINISHED, PREVIOUS_STARTED, ROLLBACK_FAILED, ROLLED_BACK, SERVER_TOUCHED, STARTED, STATUS_FINISHED, STATUS_ROLLBACK_FAILED, STATUS_ROLLED_BACK, STATUS_UNCHANGED, UNCHANGED
from gpuops.remote.secret_mask import mask_reported


# How restore() words a failure of the server alone (the files are back): recovery closes such a run.
SERVER_PROBLEM = "restarting the previous server"


class Run:
    def __init__(self, payload, progress, lease, hooks=None):
        self.payload = payload
        self.state_dir = payload["state_dir"]
        self.run_id = payload["run_id"]
        self.run_dir = os.path.join(self.state_dir, "runs", self.run_id)
        self.progress = progress
        self.lease = lease
        self.hooks = hooks if hooks is not None else HostHooks()  # what the host installed (host_hooks.py)
        self.journal = os.path.join(self.state_dir, JOURNAL_FILE)
        self.meta = payload.get("meta", {})
        self.pm = process_manager  # bundled with the helper (remote/bundle.py), like every host module
        self.service = Service(payload.get("service"), self.pm, progress)
        self.server_touched = False  # set once a handler starts: only then does rollback restart
        self.server_running_before = False
        # The journal's record of the previous server this run's undo started (pid, health deadline):
        # a recovery of the run waits for that server rather than restart it (apply_recovery sets it).
        self.previous_started = None
        self.kept_dirs = []  # directories a run created that someone filled since: left in place
        # A node of a multi-node server (apply/deployment.py): it holds where gpuops says (HOLDS).
        self.deployment = payload.get("deployment")
        self.restarted_alone = 0.0  # the lease lost, when a node restarts with nobody ordering it: previous_healthy

    def event(self, event, **fields):
        record = {"run_id": self.run_id, "event": event, "time": now()}
        # What the journal keeps passes the secrets policy first: an error may quote the server's
        # own command line (its flags checked against the launch script's), --api-key and all.
        record.update(mask_reported(fields))
        _named(self.journal, append_line, self.journal, record)
        self.progress({"event": event, "run_id": self.run_id})

    def journal_started(self, **fields):
        """The run's first journal record, once its backup is complete. A journal that cannot take
        it (a full state dir: ENOSPC) ends the run before any change: its backup is removed and the
        cause named with the journal's path."""
        try:
            self.event(STARTED, **fields)
        except OSError as exc:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise StepFailed("cannot journal the run: %s (nothing was changed; its backup was removed)"
                             % _os_error(exc))

    def phase(self, name):
        """A named point of the run: the host's hooks may act here, then the lease is checked."""
        self.progress({"event": EVENT_PHASE, EVENT_PHASE: name})
        self.hooks.at_phase(self, name)
        self.lease.check("at " + name)

    # -- backups

    def backup(self, changes, extra=None):
        """Copy every file the run will touch (or note its absence), mode kept; write the manifest.

        Directories are part of the way back too: ``created_dirs`` (deepest last) are those writing
        the entry's file creates (each named by the first entry that needs it, so that the reversed
        restore empties it first); ``removes_dirs`` those a deletion of the file may take away
        (``change["remove_dirs"]``: the undone run's ``created_dirs``), with mode and owner. A change
        with ``writes`` (a rollback putting a file back from backups) creates directories too."""
        try:
            return self._backup(changes, extra)
        except OSError as exc:
            # A backup that cannot be completed (a full state dir: ENOSPC) is no way back: nothing
            # of it stays (the run has journaled nothing yet), and the cause is named with its path.
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise StepFailed("cannot back up the files before changing them: %s (%s)" % (
                _os_error(exc), "nothing was changed; the partial backup was removed"))

    def _backup(self, changes, extra):
        files_dir = os.path.join(self.run_dir, "files")
        os.makedirs(files_dir, mode=0o700, exist_ok=True)
        entries, claimed = [], set()
        for index, change in enumerate(changes):
            path = change["path"]
            entry = {"path": path, "existed": os.path.lexists(path),
                     "after_sha256": change.get("after_sha256")}
            if ("after_b64" in change or change.get("writes")) and not change.get("delete"):
                created = [d for d in missing_dirs(path) if d not in claimed]
                claimed.update(created)
                if created:
                    entry["created_dirs"] = created
            if change.get("remove_dirs"):
                entry["removes_dirs"] = dir_records(change["remove_dirs"])
            if entry["existed"]:
                st = os.stat(path)
                backup = os.path.join(files_dir, "%03d" % index)
                with open(path, "rb") as handle:
                    data = handle.read()
                _named(backup, atomic_write, backup, data, st.st_mode & 0o7777)  # the original's mode (a 0600 env stays 0600)
                entry.update(backup=backup, mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid,
                             sha256=hashlib.sha256(data).hexdigest())
            entries.append(entry)
        manifest = {
            "run_id": self.run_id,
            "role": self.meta.get("role"),
            "created": now(),
            "files": entries,
            "service": self.payload.get("service"),
            "handlers": self.payload.get("handlers", []),
            "server_running_before": self.server_running_before,
            "deployment": self.deployment,
            "managed_roots": managed_roots(self.state_dir, [c["path"] for c in changes]),
        }
        manifest.update(extra or {})
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        _named(os.path.join(self.run_dir, "manifest.json"), atomic_write, os.path.join(self.run_dir, "manifest.json"),
               text, 0o600)
        fsync_dir(files_dir)
        manifest["_sha256"] = hashlib.sha256(text).hexdigest()
        return manifest

    # -- the forward path

    def check_unchanged_since_plan(self, changes):
        for change in changes:
            current = sha256_file(change["path"])
            if current != change.get("before_sha256"):
                raise StepFailed(
                    "%s changed on the host since gpuops planned (sha256 %s, plan saw %s); nothing was "
                    "changed, run gpuops apply again" % (change["path"], (current or "absent")[:12],
                                                         (change.get("before_sha256") or "absent")[:12])
                )

    def write_changes(self, changes):
        # A recomposition: what the undone run removed comes back first, all of it, shallowest first
        # (a directory is named by one entry only, but others' may sit in it); mode and owner kept.
        recreate_dirs(by_depth(r for c in changes for r in c.get("recreate_dirs") or []))
        dropped = []  # the directories the deleted files' run created: taken once all those files are gone
        for number, change in enumerate(changes):
            self.lease.check("before writing %s" % change["path"])
            current = sha256_file(change["path"])
            if current != change.get("before_sha256"):
                raise StepFailed("%s changed on the host while gpuops was applying" % change["path"])
            if change.get("delete"):  # a recomposition removes a file the undone run created
                if os.path.lexists(change["path"]):
                    os.unlink(change["path"])
                    fsync_dir(os.path.dirname(change["path"]) or ".")
                dropped += change.get("remove_dirs") or []  # and the directories that run created for it
                self.progress({"event": EVENT_WROTE, "path": change["path"]})
                continue
            mode = int(change["mode"], 8) if change.get("mode") else None
            data = self.hooks.written_data(self, change["path"], base64.b64decode(change["after_b64"]))
            parent = os.path.dirname(change["path"])
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o755)  # named in the manifest's created_dirs: the undo removes them
            try:
                atomic_write(change["path"], data, mode)
            except OSError as exc:
                raise StepFailed("writing %s failed: %s" % (change["path"], _os_error(exc)))
            self.progress({"event": EVENT_WROTE, "path": change["path"]})
            if number == 0:
                self.phase("first_write")
        self.drop_dirs(dropped)

    def compile_checks(self):
        for check in self.payload.get("compile", []):
            self.phase("compile")
            cache = tempfile.mkdtemp(prefix="pyc-", dir=self.run_dir)
            # cfile outside the sglang tree: the check must not leave a __pycache__ behind.
            code = (
                "import py_compile,sys,os\n"
                "bad=0\n"
                "for i,p in enumerate(sys.argv[2:]):\n"
                "    try: py_compile.compile(p, cfile=os.path.join(sys.argv[1], '%d.pyc' % i), doraise=True)\n"
                "    except py_compile.PyCompileError as e: bad=1; sys.stderr.write(str(e.msg).strip()+'\\n')\n"
                "    except Exception as e: bad=1; sys.stderr.write('%s: %s\\n' % (p, e))\n"
                "sys.exit(bad)\n"
            )
            try:
                status, out, err = run_polled([check["python"], "-c", code, cache] + list(check["paths"]),
                                              self.lease, "the compile check", self.run_dir)
            except OSError as exc:
                raise StepFailed("the compile check could not run %s: %s" % (check["python"], exc))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            if status != 0:
                reason = (err or out).decode("utf-8", "replace").strip()[-800:] or silent_failure(status, self.run_dir)
                raise StepFailed("the patched files do not compile with %s: %s" % (check["python"], reason))
            self.progress({"event": EVENT_COMPILED, "paths": check["paths"]})

    def audit(self):
        spec = self.payload.get("audit")
        if not spec:
            return None
        self.phase("audit")
        try:
            # The same sh text as the gather's gate-scan probe, with the python the preamble chose. From
            # a file: the scanner's text is near Linux's 128 KiB limit on one argv word (sh -c TEXT).
            script = os.path.join(self.run_dir, "audit.sh")
            atomic_write(script, spec["sh"].encode("utf-8"), 0o600)
            status, out, err = run_polled(["/bin/sh", script], self.lease, "the gate re-audit", self.run_dir)
        except OSError as exc:
            raise StepFailed("the gate re-audit could not run: %s" % exc)
        out = self.hooks.audit_output(self, out)
        return {"stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")[-2000:],
                "exit_status": status}

    def run_handlers(self):
        handlers = self.payload.get("handlers", [])
        if not handlers:
            return None
        if self.deployment:
            # No node stops before every node has written and passed its checks: a failure up to
            # here leaves every node's server as it was (one node's stop takes them all down).
            self.progress({"event": EVENT_STOP_READY})
            self.released(self.lease.wait_message("stop", "before stopping the server"), "stop")
        self.phase("server_stop")
        # Durable before the server is touched: a recovery must know to bring the old one back.
        self.server_touched = True
        self.event(SERVER_TOUCHED)
        try:
            self.service.stop()
            if self.deployment:
                # No node starts before every node has stopped: a new node must never join an old one.
                self.progress({"event": EVENT_STOPPED})
                self.released(self.lease.wait_message("start", "before starting the server"), "start")
            self.phase("server_start")
            self.service.start(daemon_reload=any(h.get("daemon_reload") for h in handlers))
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed("%s failed: %s" % (handlers[0]["name"], exc))
        self.phase("health")
        info = self.service.wait_healthy(self.lease)
        running, pid = self.service.running()
        self.progress({"event": EVENT_HEALTHY, "pid": pid, "checked": info})
        return pid

    def released(self, answer, key):
        if answer.get(key) is not True:
            raise StepFailed(answer.get("reason") or "gpuops stopped the deployment's run (%s: false)" % key)

    # -- the way back

    def drop_dirs(self, dirs):
        """Remove directories a run created (deepest first), only while empty; say which stay."""
        _, kept = remove_created_dirs(by_depth(set(dirs)))
        for path in kept:
            if path not in self.kept_dirs:
                self.kept_dirs.append(path)
                self.progress({"event": EVENT_DIR_KEPT, "path": path, "why": "not empty (or not a directory) any more"})

    def restore(self, manifest):
        """Put every file back byte for byte (mode and owner too), then the previous server, healthy."""
        restored, problems = self.restore_files(manifest)
        self.hooks.at_phase(self, "rollback_restore")
        return restored, problems, self.restart_previous(manifest, problems)

    def restore_files(self, manifest):
        """Every file back byte for byte (mode and owner too); (restored paths, problems).

        A file the run created goes, and so do the directories it created for it, while empty; a
        directory the run removed with a file it deleted comes back first, mode and owner kept."""
        restored, problems, created = [], [], []
        try:
            # What this run removed comes back first, all of it, shallowest first (each directory is
            # named by one entry only), whether or not the entry had a file to delete there (a forced
            # rollback of a file someone deleted still takes its empty directories).
            recreate_dirs(by_depth(r for e in manifest["files"] for r in e.get("removes_dirs") or []))
        except OSError as exc:
            problems.append("making directories again: %s" % exc)
        for entry in reversed(manifest["files"]):
            path = entry["path"]
            try:
                if entry["existed"]:
                    with open(entry["backup"], "rb") as handle:
                        data = handle.read()
                    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                        raise OSError("backup %s is damaged" % entry["backup"])
                    if sha256_file(path) != entry["sha256"] or (os.stat(path).st_mode & 0o7777) != entry["mode"]:
                        atomic_write(path, data, entry["mode"], entry.get("uid"), entry.get("gid"))
                else:
                    if os.path.lexists(path):
                        os.unlink(path)
                        fsync_dir(os.path.dirname(path) or ".")
                    created += entry.get("created_dirs") or []  # also after a crash between mkdir and write
                restored.append(path)
            except OSError as exc:
                problems.append("%s: %s" % (path, exc))
        self.drop_dirs(created)  # once every file is gone: a parent named by one entry may hold another's
        return restored, problems

    def restart_previous(self, manifest, problems):
        """The server the restored files describe, restarted and healthy (when this run touched
        it); a failure is added to ``problems``. Returns what happened to the server, one line,
        true whatever happened (it is journaled and printed as the state the server was left in)."""
        if not (self.server_touched and manifest.get("service")):
            return "server left as it was"
        service = Service(previous_service(manifest.get("service")), self.pm, self.progress)
        try:
            if not manifest.get("server_running_before", True):
                service.stop()
                return "server stopped, as it was before"
            # Started by this run's undo already and alive: a restart would only begin its start
            # (minutes for a real model) again; it is waited for, within its health deadline. A
            # node of a multi-node server restarts with the others (one node's restart ends them all).
            if not manifest.get("deployment") and self.still_ours(service):
                pid = self.await_previous(service)
                if pid is not None:
                    return ("previous server configuration healthy (pid %s; started by this run's rollback, "
                            "not restarted)" % pid)
            service.stop()
            reload = any(h.get("daemon_reload") for h in manifest.get("handlers", []))
            if manifest.get("deployment"):
                self.hold_restart()
            service.start(daemon_reload=reload)
            if manifest.get("run_id") == self.run_id:  # the files this run's undo put back: its own
                self.journal_previous_started(service)
            self.hooks.at_phase(self, "rollback_health")
            previous_healthy(service, manifest, reload, self.restarted_alone)
            return "previous server configuration restarted and healthy (pid %s)" % service.running()[1]
        except Exception as exc:
            problems.append("%s: %s" % (SERVER_PROBLEM, exc))
            return server_state(service)

    def journal_previous_started(self, service):
        """Durable before its health wait: a recovery of this run (its worker killed during the wait,
        or a later command after a health timeout shorter than the start) finds the server it must
        not restart, and until when it may still be starting."""
        pid = service.running()[1]
        if pid is None:
            return
        self.previous_started = {"pid": pid, "health_deadline": time.time() + service.health_timeout}
        try:
            self.event(PREVIOUS_STARTED, **self.previous_started)
        except OSError:
            pass  # a full state dir: the record only spares a later recovery a restart; the wait goes on

    def still_ours(self, service):
        """Is the running server the one this run's undo started (journaled), still alive?"""
        if not self.previous_started:
            return False
        running, pid = service.running()
        return bool(running) and pid is not None and pid == self.previous_started.get("pid")

    def await_previous(self, service):
        """The previous server this run's undo started, healthy by its health deadline (what is left
        of it: never a new one); its pid, or None when it exited meanwhile (then it is restarted,
        as any server that is not running). Still not healthy by then: StepFailed, left running."""
        pid = self.previous_started["pid"]
        deadline = float(self.previous_started.get("health_deadline") or 0)
        try:
            service.wait_healthy(NoLease(), timeout=max(0.0, deadline - time.time()))
        except StepFailed as exc:
            if not self.still_ours(service):
                return None
            raise StepFailed("the server this run's rollback started (pid %s) passed its health deadline "
                             "(gpuops_health_timeout %gs); not restarted: a restart would only begin its start again"
                             % (pid, service.health_timeout), exc.log_tail)
        return pid

    def hold_restart(self):
        """A node of a multi-node server in a rollback: the previous server starts once every node
        has stopped the new one (gpuops' ``restart``); with nobody to wait for, at once. In
        ``gpuops rollback``, ``{"restart": false}`` (another node's rollback failed) leaves it
        stopped: the rollback is undone on every node, restarted together again."""
        if isinstance(self.lease, NoLease):
            return  # a recovery of a dead run: nobody to wait for (and no hold for gpuops to answer)
        self.progress({"event": EVENT_ROLLBACK_STOPPED})
        try:
            answer = self.lease.wait_message("restart", "before restarting the previous server", abortable=False)
        except LeaseLapsed:
            self.restarted_alone = self.lease.seconds
            return
        if answer.get("restart") is False:
            raise StepFailed(answer.get("reason") or "gpuops stopped the rollback of this deployment node")

    def rollback(self, manifest, why, log_tail=None):
        self.progress({"event": EVENT_ROLLING_BACK, "why": why})
        restored, problems, service_note = self.restore(manifest)
        discard_built_image(self)  # docker: an image this run built, now that the previous container is back
        if problems:
            self.event(ROLLBACK_FAILED, error=why, problems=problems, service=service_note)
            return {"ok": False, "status": STATUS_ROLLBACK_FAILED, "error": why, "restored": restored,
                    "problems": problems, "service": service_note, "run_id": self.run_id, "log_tail": log_tail}
        self.event(ROLLED_BACK, error=why, restored=restored, service=service_note, **self.dirs_note())
        return dict({"ok": False, "status": STATUS_ROLLED_BACK, "error": why, "restored": restored,
                     "service": service_note, "run_id": self.run_id, "log_tail": log_tail}, **self.dirs_note())

    def dirs_note(self):
        """``kept_dirs`` for a journal record or a result, when a created directory had to stay."""
        return {"kept_dirs": list(self.kept_dirs)} if self.kept_dirs else {}


def server_state(service):
    """The server's state once bringing the previous one back failed, as a note: only what is known
    (the problem beside it says what failed; a health wait that ran out: still starting, or stuck)."""
    try:
        running, pid = service.running()
    except Exception as exc:
        return "server in an unknown state (%s)" % exc
    if running:
        return "previous server configuration not confirmed healthy: the server process (pid %s) left running" % pid
    return "no server running"


def previous_healthy(service, manifest, reload, lease_s=0.0):
    """The previous server healthy again. A node of rank > 0 whose rollback nobody orders (gpuops
    gone; ``lease_s``: the lease all nodes lost) may join the leader's new server just before the
    leader's own rollback (its lease lapses up to about a lease later) stops it, and die with it. So
    the worker is started again whenever it exits during the health wait, and once healthy, for one
    lease more, as SGLang's own launchers retry a worker (before, it was left down beside a leader
    waiting for it; a leader slower than that to stop still leaves it down: the next command recovers)."""
    rank = (manifest.get("deployment") or {}).get("rank")
    deadline = time.monotonic() + service.health_timeout
    watch_until = None
    while True:
        try:
            answered = service.wait_healthy(NoLease())
        except StepFailed:
            if not rank or time.monotonic() > deadline or service.running()[0]:
                raise
            service.start(daemon_reload=reload)
            continue
        if not rank or not lease_s:
            return answered
        if watch_until is None:
            watch_until = time.monotonic() + lease_s
        while time.monotonic() < watch_until and service.running()[0]:
            time.sleep(0.2)
        if service.running()[0]:
            return answered
        if time.monotonic() > deadline:
            raise StepFailed("the server exited after it was healthy (its leader restarted) and the health "
                             "wait is over (gpuops_health_timeout %gs)" % service.health_timeout, service.log_tail())
        service.start(daemon_reload=reload)


def by_depth(dirs):
    """Directory paths (or ``dir_records``), shallowest first: the order to make them in; reversed, to remove."""
    return sorted(dirs, key=lambda d: os.path.normpath(d["path"] if isinstance(d, dict) else d).count("/"))


def _named(path, write, *args):
    """``write(*args)``; an OSError it raises carries ``path`` (a failed write() names no file)."""
    try:
        return write(*args)
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), path) from exc


def _os_error(exc):
    """An OSError as its real cause: the errno's name, the message and the path."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "error")
    where = exc.filename or ""
    return "%s %s%s" % (name, exc.strerror or exc, (": " + str(where)) if where else "")


def silent_failure(status, work_dir):
    """Why a command of the run said nothing: its output files could not be written when the
    run's directory is full (ENOSPC), which is then named with the directory."""
    try:
        st = os.statvfs(work_dir)
        full = st.f_bavail * st.f_frsize < 1024 * 1024
    except OSError:
        full = False
    if full:
        return "exit status %d and no message: ENOSPC: no space left on %s" % (status, work_dir)
    return "exit status %d and no message" % status


def guarded(run, manifest, step):
    """Run ``step``; on any failure before the commit, roll the host back."""
    try:
        return step()
    except StepFailed as exc:
        return answered(run, run.rollback(manifest, str(exc), exc.log_tail))
    except Exception as exc:  # a bug or an OS error: still put the host back
        return answered(run, run.rollback(manifest, "%s: %s" % (type(exc).__name__, exc)))


def answered(run, result):
    """Tell gpuops how the run ended once the journal says so (the result line follows; this one
    is short, so it is the part most likely to get through a failing channel)."""
    if result.get("status") == STATUS_ROLLED_BACK:
        run.progress({"event": EVENT_ROLLED_BACK, "run_id": run.run_id, "why": result.get("error")})
    return result


def server_running(run):
    if not run.payload.get("service"):
        return False
    try:
        return run.service.running()[0]
    except Exception:
        return False


def do_apply(payload, progress, lease, hooks, notes):
    run = Run(payload, progress, lease, hooks)
    changes = payload.get("changes", [])
    marks, kept = {}, []
    if payload.get("recompose"):  # the undo of an older run by recomposition (remote/recompose.py)
        changes, marks, kept = recomposition(payload, notes)
    run.check_unchanged_since_plan(changes)
    if not changes and not payload.get("handlers"):
        run.event(UNCHANGED, role=run.meta.get("role"), user=run.meta.get("user"),
                  client=run.meta.get("client"), vars_sha256=run.meta.get("vars_sha256"), changes=[])
        return {"ok": True, "status": STATUS_UNCHANGED, "run_id": run.run_id}
    run.server_running_before = server_running(run)
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    run.phase("before_backup")
    manifest = run.backup(changes)
    run.journal_started(role=run.meta.get("role"), user=run.meta.get("user"), client=run.meta.get("client"),
                        vars_sha256=run.meta.get("vars_sha256"), manifest_sha256=manifest["_sha256"], **marks,
                        managed_roots=manifest["managed_roots"], lease_s=lease.seconds if hasattr(lease, "seconds") else None,
                        changes=[{"path": c["path"], "before_sha256": c.get("before_sha256"),
                                  "after_sha256": c.get("after_sha256")} for c in changes],
                        handlers=[h["name"] for h in payload.get("handlers", [])],
                        **({"deployment": payload["deployment"]} if payload.get("deployment") else {}))

    def forward():
        run.phase("before_write")
        run.write_changes(changes)
        run.phase("after_writes")
        backend_call(build_for_run, run)  # docker: the patched files as a derived image, compiled inside
        run.compile_checks()
        audit_output = run.audit()
        verdict_reason = None
        if payload.get("audit"):
            progress({"event": EVENT_AUDITED, "audit_output": audit_output})
            run.phase("verdict")
            verdict = lease.wait_message("verdict", "while waiting for gpuops' verdict on the re-audit")
            verdict_reason = verdict.get("reason")
            if not verdict.get("verdict"):
                raise StepFailed(verdict_reason or "the gate re-audit did not show the feature open")
        pid = run.run_handlers()
        run.phase("confirm")
        # The server's log since its start, when gpuops judges a feature by it (pcie-allreduce).
        log = {"log": run.service.log_tail(400)} if payload.get("read_log") and pid is not None else {}
        progress(dict({"event": EVENT_VERIFIED, "pid": pid}, **log))
        answer = lease.wait_message("commit", "while waiting for gpuops to confirm")
        if answer.get("commit") is False:  # gpuops' smoke check asked for the change to be undone
            raise StepFailed(answer.get("reason") or "gpuops did not confirm the run")
        if run.deployment and pid is not None and not run.service.running()[0]:
            # A node of a multi-node server goes down with any other node (a peer that rolled back
            # by its lease): a server that died since its health check is not committed.
            raise StepFailed("the server exited after its health check (another node of deployment %s went away?)"
                             % run.deployment.get("name"), run.service.log_tail())
        run.event(FINISHED, pid=pid, **run.dirs_note())
        run.hooks.at_committed(run)
        progress({"event": EVENT_COMMITTED, "run_id": run.run_id})  # the host's answer, journaled first
        prune_runs(run.state_dir, int(payload.get("keep_runs") or DEFAULT_KEEP_RUNS), notes)
        prune_derived_images(run, notes)  # docker: images only the undone or pruned runs named
        return dict({"ok": True, "status": STATUS_FINISHED, "pid": pid, "run_id": run.run_id,
                     "audit_verdict": verdict_reason, "target": marks.get("target"),
                     "restored": [c["path"] for c in changes] if marks else [], "kept": kept}, **run.dirs_note())

    return guarded(run, manifest, forward)


def recomposition(payload, notes):
    from gpuops.remote import recompose

    try:
        return recompose.prepare(payload, read_journal(payload["state_dir"], notes), load_manifest,
                                 payload["state_dir"])
    except recompose.RecomposeRefused as exc:
        raise StepFailed(str(exc))
