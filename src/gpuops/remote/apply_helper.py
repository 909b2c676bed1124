"""gpuops apply, the host side: lock, back up, write atomically, verify, restart, roll back, journal.

Stdlib only, Python 3.8+. Shipped on stdin with a JSON payload (never installed); run by the host's
python. Modes (payload["mode"]):
  apply    run a plan: lock, refuse if a previous run is unfinished, back up every file it will
           touch, journal `started`, write, compile-check, re-audit, restart, wait for health,
           journal `finished`; any failure after the first change restores every file and the
           previous server, and journals `rolled_back`.
  resume   second half of a run that stopped at `audited` for a verdict from gpuops: restart,
           health, `finished` (or roll back when the verdict says so).
  rollback undo a run (named, or the most recent that changed the host) from its backups.
  journal  print the journal (history).

The work after the lock runs in a detached child (new session, stdio on files) so that a dropped
SSH connection cannot kill it mid-write; the parent relays its progress to stdout. If gpuops goes
away before the run is finished, the child rolls the host back (unless told to carry on).

Output: JSON lines on stdout; the last one is {"result": {...}}.
"""

import base64
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request

TERMINAL_EVENTS = ("finished", "rolled_back", "unchanged", "reverted_by_rollback")
HEALTH_PATHS = ("/health",)
INFO_PATHS = ("/get_model_info", "/get_server_info")


class StepFailed(Exception):
    """A step of the run failed; the message says which and why (one line); log_tail: the server's."""

    def __init__(self, message, log_tail=None):
        Exception.__init__(self, message)
        self.log_tail = log_tail


# ---------------------------------------------------------------- small file utilities


def sha256_file(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data, mode=None, uid=None, gid=None):
    """Temp file in the same directory + fsync + rename: readers see the old or the new file.

    Mode and owner are those given, else the current file's, so a rewrite never loosens them.
    """
    directory = os.path.dirname(path) or "."
    try:
        current = os.stat(path)
    except FileNotFoundError:
        current = None
    if mode is None:
        mode = (current.st_mode & 0o7777) if current else 0o644
    if uid is None and current is not None:
        uid, gid = current.st_uid, current.st_gid
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".gpuops-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if uid is not None and hasattr(os, "fchown"):
                try:
                    os.fchown(handle.fileno(), uid, gid if gid is not None else -1)
                except PermissionError:
                    pass  # not root: the file stays ours, as it was when we could write it
            os.fsync(handle.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def append_line(path, record):
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_journal(state_dir):
    records = []
    try:
        with open(os.path.join(state_dir, "journal.jsonl"), "r", encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if line:
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        continue
    except FileNotFoundError:
        pass
    return records


def runs_by_id(records):
    """Fold journal events into one dict per run, in order of first appearance."""
    runs = {}
    for record in records:
        run = runs.setdefault(record.get("run_id"), {"run_id": record.get("run_id"), "events": []})
        run["events"].append(record.get("event"))
        for key, value in record.items():
            if key not in ("event", "time"):
                run.setdefault(key, value)
        run["last_event"] = record.get("event")
        run["last_time"] = record.get("time")
        if record.get("event") == "started":
            run["started"] = record.get("time")
        if record.get("error"):
            run["error"] = record.get("error")
    return list(runs.values())


def unfinished_runs(records):
    return [run for run in runs_by_id(records) if not any(e in TERMINAL_EVENTS for e in run["events"])]


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- the lock


def take_lock(state_dir):
    """flock on STATE/lock, non-blocking: a second apply on this host fails at once."""
    path = os.path.join(state_dir, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        holder = ""
        try:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        except OSError:
            pass
        os.close(fd)
        raise StepFailed(
            "another gpuops run holds the host lock %s%s; try again when it has finished"
            % (path, " (" + holder + ")" if holder else "")
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d since %s" % (os.getpid(), now())).encode(), 0)
    return fd


# ---------------------------------------------------------------- the server


class Service:
    """How the server runs on this host: restart, health, log tail. Spec comes from the plan."""

    def __init__(self, spec, process_manager_source, progress, connection_alive):
        self.spec = spec or {}
        self.manager = self.spec.get("manager", "process")
        # systemd and docker are driven by their own host modules (service_systemd.py, ...).
        self.backend = load_backend(self.manager, self.spec)
        self.state_dir = self.spec.get("state_dir")
        self.port = int(self.spec.get("port", 30000))
        self.grace = float(self.spec.get("grace", 30))
        self.health_timeout = float(self.spec.get("health_timeout", 600))
        self.progress = progress
        self.connection_alive = connection_alive
        self._pm = None
        self._pm_source = process_manager_source

    def process_manager(self):
        if self._pm is None:
            module = types.ModuleType("gpuops_process_manager")
            module.__dict__["__file__"] = "<gpuops-process-manager>"
            exec(compile(self._pm_source, "process_manager.py", "exec"), module.__dict__)
            self._pm = module
        return self._pm

    def running(self):
        if self.manager == "process":
            status = self.process_manager().status(self.state_dir, self.port)
            return bool(status.get("running")), status.get("pid")
        if self.backend is not None:
            return backend_call(self.backend.running)
        if self.manager == "systemd":
            proc = run_cmd(["systemctl", "is-active", "--quiet", self.spec["name"]])
            return proc.returncode == 0, None
        if self.manager == "docker":
            proc = run_cmd(["docker", "inspect", "-f", "{{.State.Running}}", self.spec["name"]])
            return proc.stdout.strip() == "true", None
        raise StepFailed("unknown sglang_manager %r" % self.manager)

    def stop(self):
        if self.backend is not None:
            backend_call(self.backend.stop)
        elif self.manager == "process":
            self.process_manager().stop(self.state_dir, self.grace)
        elif self.manager == "systemd":
            run_checked(["systemctl", "stop", self.spec["name"]], "systemctl stop")
        elif self.manager == "docker":
            run_cmd(["docker", "rm", "-f", self.spec["name"]])

    def restart(self, daemon_reload=False):
        if self.backend is not None:
            backend_call(self.backend.restart, daemon_reload)
        elif self.manager == "process":
            pm = self.process_manager()
            stopped = pm.stop(self.state_dir, self.grace)
            if not stopped.get("ok", True):
                raise StepFailed("stopping the server (pid %s) failed" % stopped.get("pid"))
            started = pm.start(self.state_dir)
            if not started.get("ok", True):
                raise StepFailed("starting the server failed: %s" % started.get("error"),
                                 "\n".join(started.get("log_tail", [])))
        elif self.manager == "systemd":
            if daemon_reload:
                run_checked(["systemctl", "daemon-reload"], "systemctl daemon-reload")
            run_checked(["systemctl", "restart", self.spec["name"]], "systemctl restart")
        elif self.manager == "docker":
            run_cmd(["docker", "rm", "-f", self.spec["name"]])
            run_checked(["/bin/sh", self.spec["docker_run_script"]], "docker run")
        else:
            raise StepFailed("unknown sglang_manager %r" % self.manager)

    def wait_healthy(self, timeout=None):
        """/health answers 200, then /get_model_info (or /get_server_info) does too."""
        timeout = self.health_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        base = "http://127.0.0.1:%d" % self.port
        stage = HEALTH_PATHS
        while True:
            if not self.connection_alive():
                raise StepFailed("the connection to gpuops was lost during the health wait")
            for path in stage:
                if http_ok(base + path):
                    if stage is INFO_PATHS:
                        if self.backend is not None and hasattr(self.backend, "check_owns_port"):
                            backend_call(self.backend.check_owns_port, self.port)
                        return path
                    stage = INFO_PATHS
                    break
            else:
                running, _ = self.running()
                if not running:
                    why = "the server exited during start-up"
                    if self.backend is not None:
                        why = backend_call(self.backend.why_not_running)
                    raise StepFailed(why, self.log_tail())
                if time.monotonic() > deadline:
                    raise StepFailed("the server was not healthy within %ds (gpuops_health_timeout)" % timeout,
                                     self.log_tail())
                time.sleep(0.25)

    def log_tail(self, lines=25):
        if self.backend is not None:
            try:
                return self.backend.log_tail(lines)
            except Exception as exc:
                return "(no log: %s)" % exc
        try:
            if self.manager == "process":
                with open(os.path.join(self.state_dir, "sglang.log"), "rb") as handle:
                    handle.seek(0, os.SEEK_END)
                    size = handle.tell()
                    handle.seek(max(0, size - 16384))
                    text = handle.read().decode("utf-8", "replace")
                # Only the last start: earlier runs' lines would hide what went wrong now.
                marker = text.rfind("=== gpuops process_manager: start")
                if marker >= 0:
                    text = text[marker:]
            elif self.manager == "systemd":
                text = run_cmd(["journalctl", "-u", self.spec["name"], "-n", str(lines), "--no-pager"]).stdout
            else:
                proc = run_cmd(["docker", "logs", "--tail", str(lines), self.spec["name"]])
                text = proc.stdout + proc.stderr
        except (OSError, KeyError) as exc:
            return "(no log: %s)" % exc
        return "\n".join(text.splitlines()[-lines:])


def load_backend(manager, spec):
    """The module that drives ``manager`` on the host (bundled with this helper at send time), or
    None when this helper drives that manager itself (the process manager)."""
    if manager == "systemd":
        from gpuops.remote import service_systemd

        return service_systemd.make_service(spec)
    if manager == "docker":
        from gpuops.remote import service_docker

        return service_docker.make_service(spec)
    return None


def backend_call(function, *args):
    """A backend's failure (its ServiceFailed, with the unit's or container's log) as a StepFailed."""
    try:
        return function(*args)
    except StepFailed:
        raise
    except Exception as exc:
        if hasattr(exc, "log_tail"):
            raise StepFailed(str(exc), exc.log_tail)
        raise


def previous_service(spec):
    """The service as the restored files describe it: a run may have moved the port, and the
    previous server must be waited for where it listens (the launch script's --port)."""
    spec = dict(spec or {})
    if spec.get("manager") == "process" and spec.get("state_dir"):
        try:
            with open(os.path.join(spec["state_dir"], "sglang-launch.sh"), "r", encoding="utf-8") as handle:
                found = re.search(r"--port(?:=|'?\s+'?)(\d+)", handle.read())
            if found:
                spec["port"] = int(found.group(1))
        except OSError:
            pass
    return spec


def http_ok(url):
    # No proxies: an http_proxy in the SSH session must not swallow a loopback health check.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_cmd(argv, timeout=600):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))


def run_checked(argv, what):
    proc = run_cmd(argv)
    if proc.returncode != 0:
        raise StepFailed("%s failed (exit %d): %s" % (what, proc.returncode, (proc.stderr or proc.stdout).strip()[-500:]))
    return proc


# ---------------------------------------------------------------- one run


class Run:
    def __init__(self, payload, progress, connection_alive):
        self.payload = payload
        self.state_dir = payload["state_dir"]
        self.run_id = payload["run_id"]
        self.run_dir = os.path.join(self.state_dir, "runs", self.run_id)
        self.progress = progress
        self.connection_alive = connection_alive
        self.journal = os.path.join(self.state_dir, "journal.jsonl")
        self.meta = payload.get("meta", {})
        self.service = Service(payload.get("service"), payload.get("process_manager", ""), progress, connection_alive)
        self.server_touched = False  # set once a handler starts: only then does rollback restart
        self.server_running_before = False

    def event(self, event, **fields):
        record = {"run_id": self.run_id, "event": event, "time": now()}
        record.update(fields)
        append_line(self.journal, record)
        self.progress({"event": event, "run_id": self.run_id})

    # -- backups

    def backup(self, changes):
        """Copy every file the run will touch (or note its absence) and write the manifest."""
        files_dir = os.path.join(self.run_dir, "files")
        os.makedirs(files_dir, mode=0o700, exist_ok=True)
        entries = []
        for index, change in enumerate(changes):
            path = change["path"]
            entry = {"path": path, "existed": os.path.lexists(path)}
            if entry["existed"]:
                st = os.stat(path)
                backup = os.path.join(files_dir, "%03d" % index)
                shutil.copyfile(path, backup)
                with open(backup, "rb") as handle:
                    os.fsync(handle.fileno())
                entry.update(backup=backup, mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid,
                             sha256=sha256_file(backup))
            entries.append(entry)
        manifest = {
            "run_id": self.run_id,
            "role": self.meta.get("role"),
            "created": now(),
            "files": entries,
            "service": self.payload.get("service"),
            "handlers": self.payload.get("handlers", []),
            "server_running_before": self.server_running_before,
        }
        atomic_write(os.path.join(self.run_dir, "manifest.json"),
                     json.dumps(manifest, indent=1, sort_keys=True).encode(), 0o600)
        fsync_dir(files_dir)
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
        for change in changes:
            if not self.connection_alive():
                raise StepFailed("the connection to gpuops was lost before writing %s" % change["path"])
            current = sha256_file(change["path"])
            if current != change.get("before_sha256"):
                raise StepFailed("%s changed on the host while gpuops was applying" % change["path"])
            mode = int(change["mode"], 8) if change.get("mode") else None
            data = base64.b64decode(change["after_b64"])
            parent = os.path.dirname(change["path"])
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o755)
            try:
                atomic_write(change["path"], data, mode)
            except OSError as exc:
                raise StepFailed("writing %s failed: %s" % (change["path"], exc.strerror or exc))
            self.progress({"event": "wrote", "path": change["path"]})

    def compile_checks(self):
        for check in self.payload.get("compile", []):
            cache = tempfile.mkdtemp(prefix="pyc-", dir=self.run_dir)
            # cfile outside the sglang tree: the check must not leave a __pycache__ behind.
            code = (
                "import py_compile,sys,os\n"
                "bad=0\n"
                "for i,p in enumerate(sys.argv[2:]):\n"
                "    try: py_compile.compile(p, cfile=os.path.join(sys.argv[1], '%d.pyc' % i), doraise=True)\n"
                "    except py_compile.PyCompileError as e: bad=1; sys.stderr.write(str(e.msg).strip()+'\\n')\n"
                "sys.exit(bad)\n"
            )
            proc = run_cmd([check["python"], "-c", code, cache] + list(check["paths"]))
            shutil.rmtree(cache, ignore_errors=True)
            if proc.returncode != 0:
                raise StepFailed("the patched files do not compile with %s: %s"
                                 % (check["python"], (proc.stderr or proc.stdout).strip()[-800:]))
            self.progress({"event": "compiled", "paths": check["paths"]})

    def audit(self):
        spec = self.payload.get("audit")
        if not spec:
            return None
        try:
            # The same sh text as the gather's gate-scan probe, with the python the preamble chose.
            proc = subprocess.run(["/bin/sh", "-c", spec["sh"]], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed("the gate re-audit could not run: %s" % exc)
        self.progress({"event": "audit_ran"})
        return {"stdout": proc.stdout.decode("utf-8", "replace"),
                "stderr": proc.stderr.decode("utf-8", "replace")[-2000:], "exit_status": proc.returncode}

    def run_handlers(self):
        handlers = self.payload.get("handlers", [])
        for handler in handlers:
            if not self.connection_alive():
                raise StepFailed("the connection to gpuops was lost before %s" % handler["name"])
            self.progress({"event": "handler", "name": handler["name"]})
            self.server_touched = True
            try:
                self.service.restart(daemon_reload=handler.get("daemon_reload", False))
            except StepFailed:
                raise
            except Exception as exc:
                raise StepFailed("%s failed: %s" % (handler["name"], exc))
        if handlers:
            info = self.service.wait_healthy()
            running, pid = self.service.running()
            self.progress({"event": "healthy", "pid": pid, "checked": info})
            return pid
        return None

    # -- the way back

    def restore(self, manifest, why):
        """Put every file back byte for byte, then the previous server, healthy."""
        restored, problems = [], []
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
                elif os.path.lexists(path):
                    os.unlink(path)
                    fsync_dir(os.path.dirname(path) or ".")
                restored.append(path)
            except OSError as exc:
                problems.append("%s: %s" % (path, exc))
        service_note = "server left as it was"
        if self.server_touched:
            service = Service(previous_service(manifest.get("service")), self.payload.get("process_manager", ""),
                              self.progress, lambda: True)
            try:
                if manifest.get("server_running_before", True):
                    service.restart(daemon_reload=any(h.get("daemon_reload") for h in manifest.get("handlers", [])))
                    service.wait_healthy()
                    service_note = "previous server configuration restarted and healthy"
                else:
                    service.stop()
                    service_note = "server stopped, as it was before"
            except Exception as exc:
                problems.append("restarting the previous server: %s" % exc)
        return restored, problems, service_note

    def rollback(self, manifest, why, log_tail=None):
        self.progress({"event": "rolling_back", "why": why})
        restored, problems, service_note = self.restore(manifest, why)
        if problems:
            self.event("rollback_failed", error=why, problems=problems)
            return {"ok": False, "status": "rollback_failed", "error": why, "restored": restored,
                    "problems": problems, "run_id": self.run_id, "log_tail": log_tail}
        self.event("rolled_back", error=why, restored=restored, service=service_note)
        return {"ok": False, "status": "rolled_back", "error": why, "restored": restored,
                "service": service_note, "run_id": self.run_id, "log_tail": log_tail}


def do_apply(payload, progress, connection_alive):
    run = Run(payload, progress, connection_alive)
    changes = payload.get("changes", [])
    try:
        run.server_running_before = run.service.running()[0] if payload.get("service") else False
    except Exception:
        run.server_running_before = False
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    manifest = run.backup(changes)
    run.event("started", role=run.meta.get("role"), user=run.meta.get("user"), client=run.meta.get("client"),
              vars_sha256=run.meta.get("vars_sha256"),
              changes=[{"path": c["path"], "before_sha256": c.get("before_sha256"),
                        "after_sha256": c.get("after_sha256")} for c in changes],
              handlers=[h["name"] for h in payload.get("handlers", [])])
    try:
        maybe_inject_fault(payload, "before_write")
        run.write_changes(changes)
        run.compile_checks()
        audit_output = run.audit()
        if payload.get("audit") and payload.get("audit_verdict_by_client"):
            run.event("audited")
            return {"ok": True, "status": "audited", "audit_output": audit_output, "run_id": run.run_id}
        return finish(run, payload, audit_output)
    except StepFailed as exc:
        return run.rollback(manifest, str(exc), exc.log_tail)
    except Exception as exc:  # a bug or an OS error: still put the host back
        return run.rollback(manifest, "%s: %s" % (type(exc).__name__, exc))


def finish(run, payload, audit_output=None):
    if not run.connection_alive():
        raise StepFailed("the connection to gpuops was lost before the restart")
    pid = run.run_handlers()
    if not run.connection_alive() and payload.get("on_disconnect", "rollback") == "rollback":
        raise StepFailed("the connection to gpuops was lost before the run was finished")
    run.event("finished", pid=pid)
    return {"ok": True, "status": "finished", "pid": pid, "audit_output": audit_output, "run_id": run.run_id}


def load_manifest(state_dir, run_id):
    path = os.path.join(state_dir, "runs", run_id, "manifest.json")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise StepFailed("run %s has no backups on this host (%s is missing)" % (run_id, path))


def do_resume(payload, progress, connection_alive):
    run = Run(payload, progress, connection_alive)
    manifest = load_manifest(run.state_dir, run.run_id)
    run.server_running_before = manifest.get("server_running_before", True)
    try:
        if payload.get("verdict") != "ok":
            raise StepFailed(payload.get("verdict_reason") or "the gate re-audit did not show the feature open")
        return finish(run, payload)
    except StepFailed as exc:
        return run.rollback(manifest, str(exc), exc.log_tail)
    except Exception as exc:
        return run.rollback(manifest, "%s: %s" % (type(exc).__name__, exc))


def pick_rollback_target(records, wanted):
    runs = runs_by_id(records)
    undone = {r.get("target") for r in runs if r.get("kind") == "rollback" and "finished" in r["events"]}
    if wanted:
        for run in runs:
            if run["run_id"] == wanted:
                if run.get("kind") == "rollback":
                    raise StepFailed("run %s is itself a rollback; name the run it undid or apply again" % wanted)
                if "rolled_back" in run["events"] or wanted in undone:
                    raise StepFailed("run %s was already rolled back" % wanted)
                if not run.get("changes"):
                    raise StepFailed("run %s changed nothing on this host" % wanted)
                later_conflict(runs, run, undone)
                return run
        raise StepFailed("no run %s in the journal of this host" % wanted)
    for run in reversed(runs):
        if run.get("kind") == "rollback" or run["run_id"] in undone:
            continue
        if "rolled_back" in run["events"] or not run.get("changes"):
            continue
        return run
    raise StepFailed("nothing to roll back: no run in the journal changed this host")


def later_conflict(runs, target, undone):
    """Refuse to undo a run whose files a later, still-standing run changed again."""
    paths = {c.get("path") for c in target.get("changes") or []}
    seen = False
    for run in runs:
        if run["run_id"] == target["run_id"]:
            seen = True
            continue
        if not seen or run.get("kind") == "rollback" or run["run_id"] in undone or "rolled_back" in run["events"]:
            continue
        overlap = sorted(paths & {c.get("path") for c in run.get("changes") or []})
        if overlap:
            raise StepFailed("run %s changed %s again after %s; roll back %s first"
                             % (run["run_id"], overlap[0], target["run_id"], run["run_id"]))


def do_rollback(payload, progress, connection_alive):
    """Undo a run from its backups, as a run of its own (backed up and journaled too)."""
    records = read_journal(payload["state_dir"])
    target = pick_rollback_target(records, payload.get("target"))
    manifest = load_manifest(payload["state_dir"], target["run_id"])
    run = Run(payload, progress, lambda: True)
    run.service = Service(manifest.get("service"), payload.get("process_manager", ""), progress, lambda: True)
    unfinished = not any(e in TERMINAL_EVENTS for e in target["events"])
    changes = [{"path": entry["path"]} for entry in manifest["files"]]
    try:
        run.server_running_before = run.service.running()[0] if manifest.get("service") else False
    except Exception:
        run.server_running_before = False
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    own_manifest = run.backup(changes)
    run.event("started", kind="rollback", target=target["run_id"], role=target.get("role"),
              user=run.meta.get("user"), client=run.meta.get("client"),
              changes=[{"path": c["path"]} for c in changes])
    run.server_touched = bool(manifest.get("service"))
    restored, problems, service_note = run.restore(manifest, "rollback of %s" % target["run_id"])
    if problems:
        run.event("rollback_failed", error="; ".join(problems))
        return {"ok": False, "status": "rollback_failed", "error": "; ".join(problems), "restored": restored,
                "target": target["run_id"], "run_id": run.run_id}
    if unfinished:
        append_line(run.journal, {"run_id": target["run_id"], "event": "rolled_back", "time": now(),
                                  "error": "rolled back by gpuops rollback (%s)" % run.run_id})
    run.event("finished", kind="rollback", target=target["run_id"], restored=restored, service=service_note)
    del own_manifest
    return {"ok": True, "status": "finished", "target": target["run_id"], "restored": restored,
            "service": service_note, "run_id": run.run_id}


def maybe_inject_fault(payload, point):
    # Test hook: lets the test-suite break a run at a named point without touching host files.
    if payload.get("fault") == point:
        raise StepFailed("injected fault at %s (test hook)" % point)


# ---------------------------------------------------------------- detaching from the connection


def run_detached(work, payload):
    """Run ``work`` in a child in its own session; relay its progress until it is done.

    The parent writes a heartbeat so a dropped connection shows up as EPIPE here; the child
    notices its parent is gone (re-parented) and treats that as "gpuops went away".
    """
    run_dir = os.path.join(payload["state_dir"], "runs", payload["run_id"])
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    progress_path = os.path.join(run_dir, "progress.jsonl")
    result_path = os.path.join(run_dir, "result.json")
    parent = os.getpid()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            os.setsid()
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            devnull = os.open(os.devnull, os.O_RDWR)
            log = os.open(os.path.join(run_dir, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)

            def progress(record):
                append_line(progress_path, record)

            progress({"event": "worker", "pid": os.getpid()})

            def connection_alive():
                return payload.get("on_disconnect", "rollback") != "rollback" or os.getppid() == parent

            try:
                result = work(payload, progress, connection_alive)
            except StepFailed as exc:
                result = {"ok": False, "status": "refused", "error": str(exc), "run_id": payload["run_id"]}
            except Exception as exc:
                result = {"ok": False, "status": "error", "error": "%s: %s" % (type(exc).__name__, exc),
                          "run_id": payload["run_id"]}
            atomic_write(result_path, json.dumps(result).encode(), 0o600)
        finally:
            os._exit(0)
    # the relay
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    offset, last_beat = 0, 0.0
    while True:
        done = os.path.exists(result_path)
        try:
            with open(progress_path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            offset += len(complete)
            if complete:
                sys.stdout.write(complete.decode("utf-8", "replace"))
                sys.stdout.flush()
            if time.monotonic() - last_beat > 1.0:
                sys.stdout.write('{"event": "heartbeat"}\n')
                sys.stdout.flush()
                last_beat = time.monotonic()
        except FileNotFoundError:
            pass
        except (BrokenPipeError, OSError):
            os._exit(3)  # gpuops is gone; the worker notices and finishes or rolls back
        if done:
            break
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            reaped = pid
        if reaped and not os.path.exists(result_path):
            return {"ok": False, "status": "error", "run_id": payload["run_id"],
                    "error": "the apply worker died; see %s" % os.path.join(run_dir, "worker.log")}
        time.sleep(0.1)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    with open(result_path, "r", encoding="utf-8") as handle:
        return json.load(handle)


def main(payload):
    mode = payload.get("mode", "apply")
    if mode == "journal":
        return {"ok": True, "records": read_journal(payload["state_dir"])}
    state_dir = payload["state_dir"]
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    lock_fd = take_lock(state_dir)
    try:
        records = read_journal(state_dir)
        pending = unfinished_runs(records)
        if mode == "apply":
            if pending:
                run = pending[-1]
                raise StepFailed(
                    "run %s (%s, started %s) did not finish (last step: %s); undo it with "
                    "`gpuops rollback --run %s` first" % (run["run_id"], run.get("role"), run.get("started"),
                                                          run.get("last_event"), run["run_id"]))
            changes = payload.get("changes", [])
            Run(payload, lambda r: None, lambda: True).check_unchanged_since_plan(changes)
            if not changes and not payload.get("handlers"):
                append_line(os.path.join(state_dir, "journal.jsonl"), {
                    "run_id": payload["run_id"], "event": "unchanged", "time": now(),
                    "role": payload.get("meta", {}).get("role"), "user": payload.get("meta", {}).get("user"),
                    "client": payload.get("meta", {}).get("client"),
                    "vars_sha256": payload.get("meta", {}).get("vars_sha256"), "changes": []})
                return {"ok": True, "status": "unchanged", "run_id": payload["run_id"]}
            work = do_apply
        elif mode == "resume":
            mine = [r for r in pending if r["run_id"] == payload["run_id"]]
            if not mine or mine[0].get("last_event") != "audited":
                raise StepFailed("run %s is not waiting for a verdict" % payload["run_id"])
            work = do_resume
        elif mode == "rollback":
            others = [r for r in pending if r["run_id"] != payload.get("target")]
            if payload.get("target") is None and pending:
                payload = dict(payload, target=pending[-1]["run_id"])
            elif others:
                raise StepFailed("run %s did not finish; roll it back first (--run %s)"
                                 % (others[-1]["run_id"], others[-1]["run_id"]))
            work = do_rollback
        else:
            raise StepFailed("unknown mode %r" % mode)
        result = run_detached(work, payload)
    finally:
        os.close(lock_fd)  # the worker keeps its own copy of the lock until it is done
    return result


def entry():
    raw = globals().get("GPUOPS_PAYLOAD")
    if raw is None:  # run as a file (tests): payload from the file named on the command line
        with open(sys.argv[1], "rb") as handle:
            raw = handle.read()
    payload = json.loads(raw)
    try:
        result = main(payload)
    except StepFailed as exc:
        result = {"ok": False, "status": "refused", "error": str(exc), "run_id": payload.get("run_id")}
    except OSError as exc:  # before any change: e.g. a state dir this user may not create
        result = {"ok": False, "status": "refused", "run_id": payload.get("run_id"),
                  "error": "cannot use the state dir %s: %s (set gpuops_state_dir, or --become)"
                           % (payload.get("state_dir"), exc.strerror or exc)}
    try:
        sys.stdout.write(json.dumps({"result": result}) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(entry())
