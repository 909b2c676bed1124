"""gpuops apply, the host side: one transaction per run, owned by the host, under a lease.

Stdlib only, Python 3.8+. Shipped on stdin (never installed) through the stream runner
(``gpuops.remote.python_command(stream=True)``): a length line, this source + the JSON payload, then
the channel stays open and gpuops writes one JSON message a line: ``{"hb": 1}`` (a heartbeat: it
renews the lease), ``{"verdict": true|false, "reason": ...}`` (its judgement of the gate re-audit),
``{"commit": true}`` (it has seen the verification). Output: JSON lines on stdout, events and
heartbeats; the last one is ``{"result": {...}}``.

Modes (payload["mode"]):
  apply     lock; finish any unfinished run first (see below); refuse if a file changed since the
            plan; back up every file it will touch; journal `started`; write; compile-check;
            re-audit (sent to gpuops, which answers with a verdict); restart; health (the server
            gpuops started must own the port); send `verified`; wait for gpuops' commit; journal
            `finished`. Anything that fails before the commit restores every file and the previous
            server and journals `rolled_back`.
  rollback  undo a run (named, or the most recent that changed the host), as a transaction of the
            same kind: the files must still hold what that run wrote (sha256) unless --force; only
            paths the run managed, under its managed roots, with its manifest intact, are touched.
  journal   the journal (history); finishes unfinished runs first when no run holds the lock.

The transaction and its lease. The process the SSH session runs (the relay) takes the host lock,
then forks the worker into its own session (stdio on files): the worker holds the lock from the
first write to the end, whatever happens to the SSH session. The relay passes gpuops' messages to
the worker (each one touches ``calls/ID/lease``) and the worker's progress back. The worker checks
the lease between steps and while it waits (compile, audit, health, verdict, commit): when no
message came for ``lease`` seconds, or the channel closed (``calls/ID/client_gone``), or the
client's per-host deadline passed, it rolls the host back by itself. It never commits without
gpuops' confirmation.

A worker that dies (OOM killer, kill -9, reboot) leaves its run `started` without an end in the
journal and the lock free: whoever takes the lock next (the relay of this call at once, else the
next gpuops apply, rollback or history on this host) rolls that run back from its manifest first,
and says so (`recovered`). Restoring is idempotent, so a recovery that dies is simply done again.

Faults for tests come from outside this code path's inputs: signals, and a fault file the lab puts
at ``STATE/lab-fault.json`` (``{"pause_at": PHASE, "seconds": S}``, ``{"fail_at": PHASE}``,
``{"corrupt_patch": true}``, ``{"empty_audit": true}``), read once (renamed to
``lab-fault.used``) and honoured only on a lab host: the session has ``GPUOPS_LAB_HOST`` and the
state dir lies in a lab directory (``../../.gpuops-lab``). Phases: before_write, first_write,
after_writes, compile, audit, verdict, server_stop, server_start, health, confirm,
rollback_restore. A paused worker reports ``{"event": "paused", "phase": P}`` in its progress file.
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
import threading
import time
import types
import urllib.error
import urllib.request

from gpuops.remote.container_image import build_for_run, discard_built_image
from gpuops.remote.digest import sha256_file

TERMINAL_EVENTS = ("finished", "rolled_back", "unchanged", "reverted_by_rollback")
HEALTH_PATHS = ("/health",)
INFO_PATHS = ("/get_model_info", "/get_server_info")
LAB_FAULT_FILE = "lab-fault.json"
LAB_MARKER = ".gpuops-lab"
DEFAULT_LEASE_S = 30.0
DEFAULT_KEEP_RUNS = 20
KEEP_CALLS = 20
POLL_S = 0.1


class StepFailed(Exception):
    """A step of the run failed; the message says which and why (one line); log_tail: the server's."""

    def __init__(self, message, log_tail=None):
        Exception.__init__(self, message)
        self.log_tail = log_tail


class LeaseLapsed(StepFailed):
    """gpuops stopped confirming (gone, cut off, stalled or over its time): the run must not go on."""


# ---------------------------------------------------------------- small file utilities


def read_complete_lines(path, offset):
    """The whole lines appended to ``path`` since ``offset``, and the offset after them: a line still
    being written is left for the next read, so a reader never acts on half a JSON message."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        chunk = b""
    complete = chunk[: chunk.rfind(b"\n") + 1]
    return complete, offset + len(complete)


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
    """One JSON line, fsynced. A torn last line (a writer that died mid-line) is ended first, so
    this record never glues onto it."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_journal(state_dir, warnings=None):
    """The journal's records; torn or non-object lines are skipped (and named in ``warnings``)."""
    records = []
    try:
        with open(os.path.join(state_dir, "journal.jsonl"), "r", encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
                    if warnings is not None:
                        warnings.append("journal line %d of %s is not a run record; skipped"
                                        % (number, os.path.join(state_dir, "journal.jsonl")))
                    continue
                records.append(record)
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
    return [run for run in runs_by_id(records)
            if "started" in run["events"] and not any(e in TERMINAL_EVENTS for e in run["events"])]


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def under(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


# ---------------------------------------------------------------- lab faults (tests only)


def lab_faults(state_dir):
    """The lab's fault file, once; {} anywhere but on a lab host (see the module docstring)."""
    if not os.environ.get("GPUOPS_LAB_HOST"):
        return {}
    if not os.path.isfile(os.path.join(state_dir, os.pardir, os.pardir, LAB_MARKER)):
        return {}
    path = os.path.join(state_dir, LAB_FAULT_FILE)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            faults = json.load(handle)
        os.rename(path, os.path.join(state_dir, "lab-fault.used"))
    except (OSError, ValueError):
        return {}
    return faults if isinstance(faults, dict) else {}


# ---------------------------------------------------------------- the lock


def take_lock(state_dir):
    """flock on STATE/lock, non-blocking: a second run on this host fails at once."""
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
    note_lock_holder(fd)
    return fd


def note_lock_holder(fd):
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d since %s" % (os.getpid(), now())).encode(), 0)


# ---------------------------------------------------------------- the lease


class Lease:
    """The client's lease on this run, kept alive by its messages (the relay touches ``lease``)."""

    def __init__(self, call_dir, seconds, deadline_s=None):
        self.call_dir = call_dir
        self.path = os.path.join(call_dir, "lease")
        self.gone_path = os.path.join(call_dir, "client_gone")
        self.inbox = os.path.join(call_dir, "inbox.jsonl")
        self.seconds = float(seconds)
        self.deadline = time.monotonic() + float(deadline_s) if deadline_s else None
        self._inbox_offset = 0

    def lapsed(self):
        """None while gpuops holds the lease, else why it lapsed (one line)."""
        if os.path.exists(self.gone_path):
            return "the connection to gpuops was lost"
        try:
            age = time.time() - os.stat(self.path).st_mtime
        except OSError:
            age = float("inf")
        if age > self.seconds:
            return "gpuops stopped confirming for %.0f s (lease %.0f s): gone, cut off or stalled" % (
                min(age, 1e6), self.seconds)
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "the run went past gpuops' time limit for this host (--timeout)"
        return None

    def check(self, where):
        why = self.lapsed()
        if why:
            raise LeaseLapsed("%s (%s); the host was rolled back" % (why, where))

    def wait_message(self, key, where):
        """The next message from gpuops that carries ``key``; the lease is checked meanwhile."""
        while True:
            self.check(where)
            complete, self._inbox_offset = read_complete_lines(self.inbox, self._inbox_offset)
            for line in complete.splitlines():
                try:
                    message = json.loads(line.decode("utf-8"))
                except ValueError:
                    continue
                if isinstance(message, dict) and key in message:
                    return message
            time.sleep(POLL_S)


class NoLease:
    """For work that no client waits on (recovery run by the relay after its client left)."""

    def lapsed(self):
        return None

    def check(self, where):
        return None

    def wait_message(self, key, where):
        raise LeaseLapsed("nobody to confirm %s" % where)


# ---------------------------------------------------------------- the server


def load_process_manager(source):
    module = types.ModuleType("gpuops_process_manager")
    module.__dict__["__file__"] = "<gpuops-process-manager>"
    exec(compile(source, "process_manager.py", "exec"), module.__dict__)
    return module


class Service:
    """How the server runs on this host: restart, health (ours owns the port), log tail."""

    def __init__(self, spec, pm, progress):
        self.spec = spec or {}
        self.manager = self.spec.get("manager", "process")
        # systemd (and later docker) are driven by their own host modules (service_systemd.py, ...).
        self.backend = load_backend(self.manager, self.spec)
        self.state_dir = self.spec.get("state_dir")
        self.port = int(self.spec.get("port", 30000))
        self.grace = float(self.spec.get("grace", 30))
        self.health_timeout = float(self.spec.get("health_timeout", 600))
        self.progress = progress
        self.pm = pm

    def running(self):
        if self.backend is not None:
            return backend_call(self.backend.running)
        if self.manager == "process":
            status = self.pm.status(self.state_dir)
            return bool(status.get("running")), status.get("pid")
        raise StepFailed("unknown sglang_manager %r" % self.manager)

    def stop(self):
        if self.backend is not None:
            backend_call(self.backend.stop)
        elif self.manager == "process":
            stopped = self.pm.stop(self.state_dir, self.grace)
            if not stopped.get("ok", True):
                raise StepFailed("stopping the server (pid %s) failed" % stopped.get("pid"))

    def start(self, daemon_reload=False):
        if self.backend is not None:
            backend_call(self.backend.restart, daemon_reload)  # after stop(): a start, with systemd's checks
        elif self.manager == "process":
            started = self.pm.start(self.state_dir)
            if not started.get("ok", True):
                why = started.get("error") or "the server exited at once (exit status unknown)"
                raise StepFailed("starting the server failed: %s%s" % (why, self.port_note()),
                                 "\n".join(started.get("log_tail", [])))
        else:
            raise StepFailed("unknown sglang_manager %r" % self.manager)

    def port_note(self):
        """'; port P is held by pid N (cmd)' when something else listens on the server's port."""
        if self.manager != "process" or not hasattr(self.pm, "port_owners"):
            return ""
        owners = self.pm.port_owners(self.port)
        return ("; port %d is held by %s" % (self.port, self.pm.describe_owners(owners))) if owners else ""

    def wait_healthy(self, lease, timeout=None):
        """/health answers 200, then /get_model_info (or /get_server_info) does too, and the
        answer comes from the server gpuops started: its process (or a child) owns the socket."""
        timeout = self.health_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self.backend is not None:
            # The port the server was really launched with (a rollback may have moved it back).
            self.port = backend_call(self.backend.launch_port) or self.port
        base = "http://127.0.0.1:%d" % self.port
        stage = HEALTH_PATHS
        while True:
            lease.check("during the health wait")
            running, pid = self.running()
            if not running:
                why = "the server exited during start-up%s" % self.port_note()
                if self.backend is not None:
                    why = backend_call(self.backend.why_not_running)
                raise StepFailed(why, self.log_tail())
            answered = None
            for path in stage:
                if http_ok(base + path):
                    answered = path
                    break
            if answered and stage is HEALTH_PATHS:
                stage = INFO_PATHS
                continue
            if answered:
                self.check_owner(pid)
                return answered
            if time.monotonic() > deadline:
                raise StepFailed("the server was not healthy within %ds (gpuops_health_timeout)" % timeout,
                                 self.log_tail())
            time.sleep(0.25)

    def check_owner(self, pid):
        if self.backend is not None:
            if hasattr(self.backend, "check_owns_port"):
                backend_call(self.backend.check_owns_port, self.port)
            return
        if self.manager != "process" or pid is None or not hasattr(self.pm, "owns_port"):
            return
        if self.pm.owns_port(pid, self.port):
            self.check_launch(pid)
            return
        owners = self.pm.port_owners(self.port)
        raise StepFailed("port %d answers, but not from the server gpuops started (pid %d): it is held by %s"
                         % (self.port, pid, self.pm.describe_owners(owners) if owners else "nobody visible"),
                         self.log_tail())

    def check_launch(self, pid):
        """The server runs what its launch script launches: every variable the script sets (from
        the env file) has that value in the server's environment, and its flags are the script's.

        The script itself says what it launches: it is run by sh, as for a start, with its final
        ``exec`` replaced by a python that prints the environment and the argv it would get."""
        script = os.path.join(self.state_dir or "", "sglang-launch.sh")
        launched = launch_view(script)
        if launched is None:
            return
        environ, cmdline = process_view(pid)
        if environ is None:
            return  # not readable (another user): the port ownership is what can be proven
        for name in sorted(launched["env"]):
            if environ.get(name) != launched["env"][name]:
                raise StepFailed("the server (pid %d) does not run with the environment its launch script sets: "
                                 "%s is %s there" % (pid, name, "missing" if name not in environ else "different"),
                                 self.log_tail())
        wanted = launched["argv"]
        if "sglang.launch_server" in wanted and "sglang.launch_server" in cmdline:
            want = wanted[wanted.index("sglang.launch_server") + 1:]
            have = cmdline[cmdline.index("sglang.launch_server") + 1:]
            if want != have:
                raise StepFailed("the server (pid %d) does not run with the flags its launch script gives (%s)"
                                 % (pid, " ".join(have)[:300]), self.log_tail())

    def log_tail(self, lines=25):
        if self.backend is not None:
            try:
                return self.backend.log_tail(lines)
            except Exception as exc:
                return "(no log: %s)" % exc
        try:
            with open(os.path.join(self.state_dir, "sglang.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 16384))
                text = handle.read().decode("utf-8", "replace")
            # Only the last start: earlier runs' lines would hide what went wrong now.
            marker = text.rfind("=== gpuops process_manager: start")
            if marker >= 0:
                text = text[marker:]
        except (OSError, KeyError, TypeError) as exc:
            return "(no log: %s)" % exc
        return "\n".join(text.splitlines()[-lines:])


_VIEW_CODE = "import json,os,sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:]}))"


def launch_view(script):
    """What ``script`` would give the server: the variables it sets and the argv after ``exec``;
    None when it cannot be told (no script, no final exec line)."""
    try:
        with open(script, "r", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    execs = [i for i, line in enumerate(lines) if line.startswith("exec ")]
    if not execs:
        return None
    probe = list(lines)
    # `exec X ARGS` -> `exec PY -c CODE X ARGS`: sh expands X and ARGS exactly as for the start.
    probe[execs[-1]] = "exec %s -c %s %s" % (sh_quote(sys.executable), sh_quote(_VIEW_CODE), lines[execs[-1]][5:])
    base = run_cmd(["env", "-i", "/bin/sh", "-c", "exec %s -c %s" % (sh_quote(sys.executable), sh_quote(_VIEW_CODE))],
                   timeout=60)
    view = run_cmd(["env", "-i", "/bin/sh", "-c", "\n".join(probe)], timeout=60)
    try:
        baseline = json.loads(base.stdout)["env"]
        out = json.loads(view.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError, KeyError):
        return None
    env = {k: v for k, v in out["env"].items() if baseline.get(k) != v and k not in ("PWD", "SHLVL", "_", "OLDPWD")}
    return {"env": env, "argv": list(out["argv"])}


def process_view(pid):
    """(environment, argv) of a running process from /proc; (None, []) when not readable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            raw = handle.read()
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = [w.decode("utf-8", "surrogateescape") for w in handle.read().split(b"\0") if w]
    except OSError:
        return None, []
    environ = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            environ[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return environ, argv


def sh_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


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
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "timed out after %ds" % timeout)


def run_polled(argv, lease, where, work_dir, timeout=600):
    """A subprocess whose output goes to files (no pipe to fill), killed if the lease lapses."""
    out_fd, out_path = tempfile.mkstemp(prefix="out-", dir=work_dir)
    err_fd, err_path = tempfile.mkstemp(prefix="err-", dir=work_dir)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=err_fd, start_new_session=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            why = lease.lapsed()
            if why or time.monotonic() > deadline:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                if why:
                    raise LeaseLapsed("%s (%s); the host was rolled back" % (why, where))
                raise StepFailed("%s took longer than %ds" % (where, timeout))
            time.sleep(POLL_S)
        with open(out_path, "rb") as handle:
            stdout = handle.read()
        with open(err_path, "rb") as handle:
            stderr = handle.read()
        return proc.returncode, stdout, stderr
    finally:
        os.close(out_fd)
        os.close(err_fd)
        for path in (out_path, err_path):
            try:
                os.unlink(path)
            except OSError:
                pass


# ---------------------------------------------------------------- one run


class Run:
    def __init__(self, payload, progress, lease, faults=None):
        self.payload = payload
        self.state_dir = payload["state_dir"]
        self.run_id = payload["run_id"]
        self.run_dir = os.path.join(self.state_dir, "runs", self.run_id)
        self.progress = progress
        self.lease = lease
        self.faults = faults or {}
        self.journal = os.path.join(self.state_dir, "journal.jsonl")
        self.meta = payload.get("meta", {})
        self.pm = load_process_manager(payload.get("process_manager", "") or "")
        self.service = Service(payload.get("service"), self.pm, progress)
        self.server_touched = False  # set once a handler starts: only then does rollback restart
        self.server_running_before = False

    def event(self, event, **fields):
        record = {"run_id": self.run_id, "event": event, "time": now()}
        record.update(fields)
        append_line(self.journal, record)
        self.progress({"event": event, "run_id": self.run_id})

    def phase(self, name):
        """A named point of the run: the lease is checked; the lab may pause or fail here."""
        self.progress({"event": "phase", "phase": name})
        if self.faults.get("pause_at") == name:
            self.progress({"event": "paused", "phase": name})
            until = time.monotonic() + float(self.faults.get("seconds", 5))
            while time.monotonic() < until and not self.lease.lapsed():
                time.sleep(POLL_S)
        if self.faults.get("fail_at") == name:
            raise StepFailed("injected fault at %s (lab fault file)" % name)
        self.lease.check("at " + name)

    # -- backups

    def backup(self, changes, extra=None):
        """Copy every file the run will touch (or note its absence), mode kept; write the manifest."""
        files_dir = os.path.join(self.run_dir, "files")
        os.makedirs(files_dir, mode=0o700, exist_ok=True)
        entries = []
        for index, change in enumerate(changes):
            path = change["path"]
            entry = {"path": path, "existed": os.path.lexists(path),
                     "after_sha256": change.get("after_sha256")}
            if entry["existed"]:
                st = os.stat(path)
                backup = os.path.join(files_dir, "%03d" % index)
                with open(path, "rb") as handle:
                    data = handle.read()
                atomic_write(backup, data, st.st_mode & 0o7777)  # the original's mode (a 0600 env stays 0600)
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
            "managed_roots": managed_roots(self.state_dir, [c["path"] for c in changes]),
        }
        manifest.update(extra or {})
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        atomic_write(os.path.join(self.run_dir, "manifest.json"), text, 0o600)
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
        for number, change in enumerate(changes):
            self.lease.check("before writing %s" % change["path"])
            current = sha256_file(change["path"])
            if current != change.get("before_sha256"):
                raise StepFailed("%s changed on the host while gpuops was applying" % change["path"])
            if change.get("delete"):  # a recomposition removes a file the undone run created
                if os.path.lexists(change["path"]):
                    os.unlink(change["path"])
                    fsync_dir(os.path.dirname(change["path"]) or ".")
                self.progress({"event": "wrote", "path": change["path"]})
                continue
            mode = int(change["mode"], 8) if change.get("mode") else None
            data = base64.b64decode(change["after_b64"])
            if self.faults.get("corrupt_patch") and change["path"].endswith(".py"):
                data += b"\n)(  # gpuops lab fault: does not compile\n"
            parent = os.path.dirname(change["path"])
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o755)
            try:
                atomic_write(change["path"], data, mode)
            except OSError as exc:
                raise StepFailed("writing %s failed: %s" % (change["path"], exc.strerror or exc))
            self.progress({"event": "wrote", "path": change["path"]})
            if number == 0:
                self.phase("first_write")

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
                raise StepFailed("the patched files do not compile with %s: %s"
                                 % (check["python"], (err or out).decode("utf-8", "replace").strip()[-800:]))
            self.progress({"event": "compiled", "paths": check["paths"]})

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
        if self.faults.get("empty_audit"):
            out = b""
        return {"stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")[-2000:],
                "exit_status": status}

    def run_handlers(self):
        handlers = self.payload.get("handlers", [])
        if not handlers:
            return None
        self.phase("server_stop")
        # Durable before the server is touched: a recovery must know to bring the old one back.
        self.server_touched = True
        self.event("server_touched")
        try:
            self.service.stop()
            self.phase("server_start")
            self.service.start(daemon_reload=any(h.get("daemon_reload") for h in handlers))
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed("%s failed: %s" % (handlers[0]["name"], exc))
        self.phase("health")
        info = self.service.wait_healthy(self.lease)
        running, pid = self.service.running()
        self.progress({"event": "healthy", "pid": pid, "checked": info})
        return pid

    # -- the way back

    def restore(self, manifest):
        """Put every file back byte for byte (mode and owner too), then the previous server, healthy."""
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
        if self.faults.get("pause_at") == "rollback_restore":
            self.progress({"event": "paused", "phase": "rollback_restore"})
            time.sleep(float(self.faults.get("seconds", 5)))
        service_note = "server left as it was"
        if self.server_touched and manifest.get("service"):
            service = Service(previous_service(manifest.get("service")), self.pm, self.progress)
            try:
                if manifest.get("server_running_before", True):
                    service.stop()
                    service.start(daemon_reload=any(h.get("daemon_reload") for h in manifest.get("handlers", [])))
                    service.wait_healthy(NoLease())
                    service_note = "previous server configuration restarted and healthy (pid %s)" % service.running()[1]
                else:
                    service.stop()
                    service_note = "server stopped, as it was before"
            except Exception as exc:
                problems.append("restarting the previous server: %s" % exc)
        return restored, problems, service_note

    def rollback(self, manifest, why, log_tail=None):
        self.progress({"event": "rolling_back", "why": why})
        restored, problems, service_note = self.restore(manifest)
        discard_built_image(self)  # docker: an image this run built, now that the previous container is back
        if problems:
            self.event("rollback_failed", error=why, problems=problems)
            return {"ok": False, "status": "rollback_failed", "error": why, "restored": restored,
                    "problems": problems, "run_id": self.run_id, "log_tail": log_tail}
        self.event("rolled_back", error=why, restored=restored, service=service_note)
        return {"ok": False, "status": "rolled_back", "error": why, "restored": restored,
                "service": service_note, "run_id": self.run_id, "log_tail": log_tail}


def managed_roots(state_dir, paths):
    """The directories a run may touch: the state dir and the directory of each file it changes."""
    roots = {os.path.normpath(state_dir)}
    roots.update(os.path.dirname(os.path.normpath(p)) for p in paths)
    return sorted(roots)


def guarded(run, manifest, step):
    """Run ``step``; on any failure before the commit, roll the host back."""
    try:
        return step()
    except StepFailed as exc:
        return run.rollback(manifest, str(exc), exc.log_tail)
    except Exception as exc:  # a bug or an OS error: still put the host back
        return run.rollback(manifest, "%s: %s" % (type(exc).__name__, exc))


def server_running(run):
    if not run.payload.get("service"):
        return False
    try:
        return run.service.running()[0]
    except Exception:
        return False


def do_apply(payload, progress, lease, faults, notes):
    run = Run(payload, progress, lease, faults)
    changes = payload.get("changes", [])
    marks, kept = {}, []
    if payload.get("recompose"):  # the undo of an older run by recomposition (remote/recompose.py)
        changes, marks, kept = recomposition(payload, notes)
    run.check_unchanged_since_plan(changes)
    if not changes and not payload.get("handlers"):
        run.event("unchanged", role=run.meta.get("role"), user=run.meta.get("user"),
                  client=run.meta.get("client"), vars_sha256=run.meta.get("vars_sha256"), changes=[])
        return {"ok": True, "status": "unchanged", "run_id": run.run_id}
    run.server_running_before = server_running(run)
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    run.phase("before_backup")
    manifest = run.backup(changes)
    run.event("started", role=run.meta.get("role"), user=run.meta.get("user"), client=run.meta.get("client"),
              vars_sha256=run.meta.get("vars_sha256"), manifest_sha256=manifest["_sha256"], **marks,
              managed_roots=manifest["managed_roots"], lease_s=lease.seconds if hasattr(lease, "seconds") else None,
              changes=[{"path": c["path"], "before_sha256": c.get("before_sha256"),
                        "after_sha256": c.get("after_sha256")} for c in changes],
              handlers=[h["name"] for h in payload.get("handlers", [])])

    def forward():
        run.phase("before_write")
        run.write_changes(changes)
        run.phase("after_writes")
        backend_call(build_for_run, run)  # docker: the patched files as a derived image, compiled inside
        run.compile_checks()
        audit_output = run.audit()
        verdict_reason = None
        if payload.get("audit"):
            progress({"event": "audited", "audit_output": audit_output})
            run.phase("verdict")
            verdict = lease.wait_message("verdict", "while waiting for gpuops' verdict on the re-audit")
            verdict_reason = verdict.get("reason")
            if not verdict.get("verdict"):
                raise StepFailed(verdict_reason or "the gate re-audit did not show the feature open")
        pid = run.run_handlers()
        run.phase("confirm")
        progress({"event": "verified", "pid": pid})
        answer = lease.wait_message("commit", "while waiting for gpuops to confirm")
        if answer.get("commit") is False:  # gpuops' smoke check asked for the change to be undone
            raise StepFailed(answer.get("reason") or "gpuops did not confirm the run")
        run.event("finished", pid=pid)
        prune_runs(run.state_dir, int(payload.get("keep_runs") or DEFAULT_KEEP_RUNS), notes)
        return {"ok": True, "status": "finished", "pid": pid, "run_id": run.run_id,
                "audit_verdict": verdict_reason, "target": marks.get("target"),
                "restored": [c["path"] for c in changes] if marks else [], "kept": kept}

    return guarded(run, manifest, forward)


def recomposition(payload, notes):
    from gpuops.remote import recompose

    try:
        return recompose.prepare(payload, read_journal(payload["state_dir"], notes), load_manifest,
                                 payload["state_dir"])
    except recompose.Refused as exc:
        raise StepFailed(str(exc))


# ---------------------------------------------------------------- rollback of an earlier run


def pick_rollback_target(records, wanted):
    from gpuops.remote.recompose import undone_runs

    runs = runs_by_id(records)
    undone = undone_runs(runs)
    if wanted:
        for run in runs:
            if run["run_id"] == wanted:
                if run.get("kind") == "rollback" and not run.get("recompose"):
                    raise StepFailed("run %s is itself a rollback; name the run it undid (%s), or apply again"
                                     % (wanted, run.get("target")))
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
        later_conflict(runs, run, undone)  # a later recomposition may have rewritten its files
        return run
    raise StepFailed("nothing to roll back: no run in the journal changed this host")


def later_conflict(runs, target, undone):
    """Refuse to restore the backups of a run whose files a later, still-standing run changed again.

    gpuops undoes such a run by recomposition instead (an apply run planned by the client,
    remote/recompose.py) where only launch files overlap; this refusal is what is left when the
    overlap cannot be recomposed (a later run changed a file the older one patched): the message
    names every later run that must go first, newest first."""
    paths = {c.get("path") for c in target.get("changes") or []}
    seen, blocking, first_overlap = False, [], None
    for run in runs:
        if run["run_id"] == target["run_id"]:
            seen = True
            continue
        if not seen or (run.get("kind") == "rollback" and not run.get("recompose")) or run["run_id"] in undone \
                or "rolled_back" in run["events"]:
            continue
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
    raise StepFailed(
        "run %s changed %s again after %s, and that cannot be recomposed; roll back %s first: run %s; then "
        "gpuops rollback --run %s; then re-apply %s with the same -e values if you want them back"
        % (run["run_id"], path, target["run_id"], order[0]["run_id"], undo, target["run_id"],
           ", ".join(roles) if roles else "what those runs applied"))


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
    return manifest


def check_drift(manifest, target, force, later_dir):
    """Every file must still hold what the run wrote; a later change is refused (or kept, with force)."""
    wrote = {c.get("path"): c.get("after_sha256") for c in target.get("changes") or []}
    kept = []
    for index, entry in enumerate(manifest["files"]):
        path = entry["path"]
        expected = entry.get("after_sha256") or wrote.get(path)
        current = sha256_file(path)
        if expected is None or current == expected:
            continue
        if not force:
            raise StepFailed(
                "%s changed since run %s wrote it (sha256 now %s, the run wrote %s); rollback would destroy that "
                "change: merge it by hand, or run `gpuops rollback --run %s --force` (keeps the current file "
                "beside the backup)" % (path, target["run_id"], (current or "absent")[:12], expected[:12],
                                        target["run_id"]))
        if current is not None:
            os.makedirs(later_dir, mode=0o700, exist_ok=True)
            copy = os.path.join(later_dir, "%03d.later" % index)
            shutil.copy2(path, copy)
            kept.append("%s (kept as %s)" % (path, copy))
    return kept


def do_rollback(payload, progress, lease, faults, notes):
    """Undo a run from its backups, as a run of its own (backed up and journaled too)."""
    state_dir = payload["state_dir"]
    records = read_journal(state_dir, notes)
    target = pick_rollback_target(records, payload.get("target"))
    manifest = load_manifest(state_dir, target)
    run = Run(payload, progress, lease, faults)
    run.service = Service(manifest.get("service"), run.pm, progress)
    kept = check_drift(manifest, target, payload.get("force"),
                       os.path.join(state_dir, "runs", target["run_id"], "files"))
    changes = [{"path": entry["path"]} for entry in manifest["files"]]
    run.server_running_before = server_running(run) if manifest.get("service") else False
    run.payload = dict(payload, service=manifest.get("service"), handlers=manifest.get("handlers", []))
    os.makedirs(run.run_dir, mode=0o700, exist_ok=True)
    own_manifest = run.backup(changes, {"kind": "rollback", "target": target["run_id"]})
    run.event("started", kind="rollback", target=target["run_id"], role=target.get("role"),
              user=run.meta.get("user"), client=run.meta.get("client"), manifest_sha256=own_manifest["_sha256"],
              managed_roots=own_manifest["managed_roots"], changes=[{"path": c["path"]} for c in changes])

    def forward():
        run.phase("before_write")
        run.server_touched = bool(manifest.get("service"))
        if run.server_touched:
            run.event("server_touched")
        restored, problems, service_note = run.restore(manifest)
        if problems:
            raise StepFailed("; ".join(problems))
        run.phase("confirm")
        progress({"event": "verified", "pid": None})
        lease.wait_message("commit", "while waiting for gpuops to confirm the rollback")
        run.event("finished", kind="rollback", target=target["run_id"], restored=restored, service=service_note)
        prune_runs(state_dir, int(payload.get("keep_runs") or DEFAULT_KEEP_RUNS), notes)
        return {"ok": True, "status": "finished", "target": target["run_id"], "restored": restored,
                "service": service_note, "run_id": run.run_id, "kept": kept}

    # A rollback that cannot finish puts back what it found (its own backups): the target stays
    # in effect and can be rolled back again; nothing is left half-undone.
    result = guarded(run, own_manifest, forward)
    result.setdefault("target", target["run_id"])
    return result


# ---------------------------------------------------------------- recovery of dead runs


def recover_unfinished(state_dir, pm_source, progress, notes, restored_out=None):
    """Roll back every run whose worker died (we hold the lock, so none is alive). Idempotent."""
    recovered = []
    for run_record in unfinished_runs(read_journal(state_dir, notes)):
        run_id = run_record["run_id"]
        fake = {"state_dir": state_dir, "run_id": run_id, "meta": {}, "process_manager": pm_source}
        run = Run(fake, progress, NoLease())
        why = "its worker died before the run ended (last step: %s)" % run_record.get("last_event")
        try:
            manifest = load_manifest(state_dir, run_record)
        except StepFailed as exc:
            # No manifest: the worker died before its first write (backups come first), or the
            # backups were pruned/tampered. Nothing can be restored from here; say so and close it.
            run.event("rolled_back", error=why, restored=[], problems=[str(exc)])
            recovered.append("run %s (%s): %s; %s" % (run_id, run_record.get("role"), why, exc))
            continue
        run.payload = dict(fake, service=manifest.get("service"), handlers=manifest.get("handlers", []))
        run.server_touched = "server_touched" in run_record["events"]
        progress({"event": "recovering", "run_id": run_id})
        restored, problems, service_note = run.restore(manifest)
        if problems and any(not p.startswith("restarting the previous server") for p in problems):
            # Files could not all be put back: leave the run open so the next command tries again.
            run.event("rollback_failed", error=why, problems=problems)
            raise StepFailed("run %s did not finish and could not be rolled back: %s" % (run_id, "; ".join(problems)))
        run.event("rolled_back", error="recovered: " + why, restored=restored, service=service_note,
                  problems=problems or None)
        if restored_out is not None:
            restored_out.extend(restored)
        recovered.append("run %s (%s) had not finished (%s); rolled back first: %d file(s) restored, %s%s"
                         % (run_id, run_record.get("role") or run_record.get("kind"), why, len(restored),
                            service_note, ("; " + "; ".join(problems)) if problems else ""))
    return recovered


def prune_runs(state_dir, keep, notes):
    """Keep the backups of the newest ``keep`` runs (never the newest finished one, never an
    unfinished one); older run folders go."""
    runs_dir = os.path.join(state_dir, "runs")
    try:
        present = set(os.listdir(runs_dir))
    except OSError:
        return
    ordered = [r for r in runs_by_id(read_journal(state_dir)) if r["run_id"] in present]
    keep_ids = {r["run_id"] for r in ordered[-max(keep, 1):]}
    finished = [r["run_id"] for r in ordered if "finished" in r["events"] and r.get("kind") != "rollback"]
    if finished:
        keep_ids.add(finished[-1])
    keep_ids.update(r["run_id"] for r in ordered if not any(e in TERMINAL_EVENTS for e in r["events"]))
    known = {r["run_id"] for r in ordered}
    removed = 0
    for name in sorted(present):
        if name in keep_ids or name not in known:
            continue  # a folder the journal does not know is not ours to judge
        shutil.rmtree(os.path.join(runs_dir, name), ignore_errors=True)
        removed += 1
    if removed:
        notes.append("pruned the backups of %d old run(s) (gpuops_keep_runs=%d)" % (removed, keep))


def do_recover(payload, progress, lease, faults, notes):
    """The worker that replaces one that died: worker_main has rolled its run back already."""
    return {"ok": False, "status": "rolled_back" if payload.get("for_mode") in ("apply", "rollback") else "refused",
            "error": payload.get("died"), "restored": [], "run_id": payload.get("run_id")}


def do_journal(payload, progress, lease, faults, notes):
    return {"ok": True, "status": "journal", "records": read_journal(payload["state_dir"], notes),
            "run_id": payload.get("run_id")}


WORK = {"apply": do_apply, "rollback": do_rollback, "journal": do_journal, "recover": do_recover}


# ---------------------------------------------------------------- the worker and the relay


def worker_main(payload, call_dir, faults):
    """In the detached worker: finish dead runs, then the mode's work; the result to a file."""
    progress_path = os.path.join(call_dir, "progress.jsonl")

    def progress(record):
        append_line(progress_path, record)

    lease = Lease(call_dir, float(payload.get("lease_s") or DEFAULT_LEASE_S), payload.get("deadline_s"))
    notes = []
    restored = []
    mode = payload.get("mode", "apply")
    result = None
    try:
        recovered = recover_unfinished(payload["state_dir"], payload.get("process_manager", ""), progress, notes,
                                       restored)
        for line in recovered:
            progress({"event": "recovered", "note": line})
        result = WORK[mode](payload, progress, lease, faults, notes)
        result["recovered"] = recovered
        if mode == "recover":
            result["restored"] = restored
    except StepFailed as exc:
        status = "rollback_failed" if mode == "recover" else "refused"
        result = {"ok": False, "status": status, "error": str(exc), "run_id": payload.get("run_id")}
    except Exception as exc:
        result = {"ok": False, "status": "error", "error": "%s: %s" % (type(exc).__name__, exc),
                  "run_id": payload.get("run_id")}
    result["notes"] = notes + list(result.get("notes") or [])
    atomic_write(os.path.join(call_dir, "result.json"), json.dumps(result).encode(), 0o600)


class Relay:
    """The SSH session's side: client messages in (lease, inbox), worker progress out."""

    def __init__(self, call_dir):
        self.call_dir = call_dir
        self.lease_path = os.path.join(call_dir, "lease")
        self.inbox = os.path.join(call_dir, "inbox.jsonl")
        self.gone_path = os.path.join(call_dir, "client_gone")
        self.out_ok = True
        self._offset = 0
        self._last_beat = 0.0

    def touch_lease(self):
        with open(self.lease_path, "ab"):
            pass
        os.utime(self.lease_path, None)

    def mark_gone(self):
        with open(self.gone_path, "ab"):
            pass

    def read_client(self, stream):
        """Thread: every line from gpuops renews the lease; verdict/commit go to the inbox."""
        try:
            for line in stream:
                self.touch_lease()
                text = line.strip()
                if text and not text.startswith(b'{"hb"'):
                    fd = os.open(self.inbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    try:
                        os.write(fd, text + b"\n")
                    finally:
                        os.close(fd)
        except (OSError, ValueError):
            pass
        self.mark_gone()

    def emit(self, data):
        if not self.out_ok:
            return
        try:
            sys.stdout.write(data)
            sys.stdout.flush()
        except (OSError, ValueError):
            self.out_ok = False
            self.mark_gone()

    def pump(self):
        complete, self._offset = read_complete_lines(os.path.join(self.call_dir, "progress.jsonl"), self._offset)
        if complete:
            self.emit(complete.decode("utf-8", "replace"))
        if time.monotonic() - self._last_beat > 1.0:
            self.emit('{"event": "heartbeat"}\n')
            self._last_beat = time.monotonic()


def start_worker(payload, call_dir, lock_fd, faults):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            devnull = os.open(os.devnull, os.O_RDWR)
            log = os.open(os.path.join(call_dir, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            note_lock_holder(lock_fd)  # the lock is the worker's now (same open file, inherited)
            append_line(os.path.join(call_dir, "progress.jsonl"),
                        {"event": "worker", "pid": os.getpid(), "relay": os.getppid()})
            worker_main(payload, call_dir, faults)
        finally:
            os._exit(0)
    return pid


def relay_call(payload, call_dir, lock_fd, faults, client_stream):
    relay = Relay(call_dir)
    relay.touch_lease()
    pid = start_worker(payload, call_dir, lock_fd, faults)
    os.close(lock_fd)  # the worker keeps the lock until it is done, whatever happens to us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    reader = threading.Thread(target=relay.read_client, args=(client_stream,), daemon=True)
    reader.start()
    result = relay_until_done(relay, pid, call_dir)
    if result is not None:
        return result
    # The worker died without a result: a second worker rolls its run back now, under the lock,
    # while this relay goes on heart-beating to gpuops (a restart can take a while).
    died = "the host-side worker (pid %d) died before the run ended" % pid
    try:
        fd = take_lock(payload["state_dir"])
    except StepFailed as exc:
        return {"ok": False, "status": "unknown", "error": "%s; %s" % (died, exc), "run_id": payload.get("run_id")}
    recovery = dict(payload, mode="recover", for_mode=payload.get("mode"), died=died)
    pid = start_worker(recovery, call_dir, fd, {})
    os.close(fd)
    result = relay_until_done(relay, pid, call_dir)
    if result is not None:
        return result
    return {"ok": False, "status": "rollback_failed", "run_id": payload.get("run_id"),
            "error": "%s, and so did the worker rolling it back; the next gpuops apply, rollback or history on "
                     "this host rolls it back first" % died}


def relay_until_done(relay, pid, call_dir):
    """Relay ``pid``'s progress until it ends; its result, or None when it died without one."""
    result_path = os.path.join(call_dir, "result.json")
    while True:
        relay.pump()
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            reaped = pid
        if reaped:
            break
        time.sleep(POLL_S)
    relay.pump()
    try:
        with open(result_path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def prune_calls(state_dir):
    calls = os.path.join(state_dir, "calls")
    try:
        names = sorted(os.listdir(calls))
    except OSError:
        return
    for name in names[:-KEEP_CALLS]:
        shutil.rmtree(os.path.join(calls, name), ignore_errors=True)


def main(payload, client_stream):
    mode = payload.get("mode", "apply")
    if mode not in WORK:
        raise StepFailed("unknown mode %r" % mode)
    state_dir = payload["state_dir"]
    if mode == "journal" and not os.path.isdir(state_dir):
        return {"ok": True, "status": "journal", "records": [], "run_id": payload.get("run_id")}
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    try:
        lock_fd = take_lock(state_dir)
    except StepFailed:
        if mode != "journal":
            raise
        # A run holds the host: show the journal as it stands, change nothing.
        notes = []
        return {"ok": True, "status": "journal", "records": read_journal(state_dir, notes), "busy": True,
                "notes": notes, "run_id": payload.get("run_id")}
    try:
        faults = lab_faults(state_dir) if mode != "journal" else {}
        if mode == "journal" and not unfinished_runs(read_journal(state_dir)):
            notes = []
            return {"ok": True, "status": "journal", "records": read_journal(state_dir, notes), "notes": notes,
                    "run_id": payload.get("run_id")}
        prune_calls(state_dir)
        call_dir = os.path.join(state_dir, "calls", "%s-%s" % (time.strftime("%Y%m%dT%H%M%S"), payload["run_id"]))
        os.makedirs(call_dir, mode=0o700)  # never an old call's folder: no stale result.json is read
    except BaseException:
        os.close(lock_fd)
        raise
    return relay_call(payload, call_dir, lock_fd, faults, client_stream)


def entry():
    raw = globals().get("GPUOPS_PAYLOAD")
    client_stream = sys.stdin.buffer
    if raw is None:  # run as a file: payload from the file named on the command line
        with open(sys.argv[1], "rb") as handle:
            raw = handle.read()
    payload = json.loads(raw)
    try:
        result = main(payload, client_stream)
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
