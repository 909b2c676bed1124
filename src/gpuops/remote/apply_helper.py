"""gpuops apply, the host side: one transaction per run, owned by the host, under a lease.

Stdlib only, Python 3.8+. Shipped on stdin (never installed) through the stream runner
(``gpuops.shipping.python_command(stream=True)``): a length line, this source + the JSON payload, then
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
the worker (each one stamps ``calls/ID/lease`` with the host's monotonic time) and the worker's
progress back. The worker checks the lease between steps and while it waits (compile, audit,
health, verdict, commit): when no message came for ``lease`` seconds on its monotonic clock, or the
channel closed (``calls/ID/client_gone``), or the client's per-host deadline passed, it rolls the
host back by itself. It never commits without
gpuops' confirmation.

A worker that dies (OOM killer, kill -9, reboot) leaves its run `started` without an end in the
journal and the lock free: whoever takes the lock next (the relay of this call at once, else the
next gpuops apply, rollback or history on this host) rolls that run back from its manifest first,
and says so (`recovered`). Restoring is idempotent, so a recovery that dies is simply done again.

Faults for tests come from outside this code: signals, killed processes, and the host's hooks
(``host_hooks.py``: a ``gpuops_host_hooks`` module on the host's python path, which the lab
installs on its hosts, ``gpuops/lab/host_faults.py``). Phases a hook sees: before_write,
first_write, after_writes, compile, audit, verdict, server_stop, server_start, health, confirm,
image_build, rollback_restore, rollback_health.

This module is the entry (modes, the worker, the relay, detaching); the rest is bundled with it
(``bundle.py``), one concern a module: ``apply_run`` (the transaction and the apply mode),
``apply_rollback`` (the rollback mode), ``apply_recovery`` (dead runs), ``apply_manifest``,
``apply_service`` (the server: restart, health, ownership), ``apply_commands``, ``apply_lease``,
``apply_lock``, ``apply_journal`` (the journal schema, also read by the client), ``apply_prune``,
``apply_fileops`` and ``apply_common`` (StepFailed, LeaseLapsed).
"""

import json
import os
import signal
import sys
import threading
import time

from gpuops.remote.apply_common import POLL_S, StepFailed
from gpuops.remote.apply_fileops import append_line, atomic_write, read_complete_lines
from gpuops.remote.apply_journal import read_journal, unfinished_runs
from gpuops.remote.apply_lease import DEFAULT_LEASE_S, Lease, note_beat
from gpuops.remote.apply_lock import note_lock_holder, take_lock
from gpuops.remote.apply_prune import prune_calls
from gpuops.remote.apply_recovery import recover_unfinished
from gpuops.remote.apply_rollback import do_rollback
from gpuops.remote.apply_run import do_apply
from gpuops.remote.host_hooks import HostHooks, load_hooks
from gpuops.remote.secret_mask import mask_reported
from gpuops.remote.host_protocol import FINISHED, ROLLBACK_FAILED, ROLLED_BACK, STATUS_FINISHED, EVENT_RECOVERED, EVENT_WORKER, MODE_APPLY, MODE_JOURNAL, MODE_RECOVER, MODE_ROLLBACK, STATUS_ERROR, STATUS_JOURNAL, STATUS_REFUSED, STATUS_ROLLBACK_FAILED, STATUS_ROLLED_BACK, STATUS_UNKNOWN

def do_recover(payload, progress, lease, hooks, notes):
    """The worker that replaces one that died: worker_main has rolled its run back already."""
    return {"ok": False, "status": STATUS_ROLLED_BACK if payload.get("for_mode") in (MODE_APPLY, MODE_ROLLBACK) else STATUS_REFUSED,
            "error": payload.get("died"), "restored": [], "run_id": payload.get("run_id")}


def do_journal(payload, progress, lease, hooks, notes):
    return {"ok": True, "status": STATUS_JOURNAL, "records": read_journal(payload["state_dir"], notes),
            "run_id": payload.get("run_id")}


WORK = {MODE_APPLY: do_apply, MODE_ROLLBACK: do_rollback, MODE_JOURNAL: do_journal, MODE_RECOVER: do_recover}


# What the worker writes into its call directory as it was read: the gate re-audit's output (the
# scan of the patched tree, its sources and file:line excerpts), which gpuops judges and must see as
# the files say it; SGLang's own source names api_key and its flags, which masking would rewrite.
KEPT_AS_READ = ("audit_output",)


def masked(record):
    """``record`` as the worker keeps it in its call directory (progress.jsonl, result.json, which
    the relay passes on to gpuops) through the one secrets policy: the server's log tail as the server
    wrote it (``server_args=ServerArgs(..., api_key='...')``), what the server said of itself, an
    error quoting its command line. gpuops makes no other copy of a secret the host holds."""
    out = mask_reported({k: v for k, v in record.items() if k not in KEPT_AS_READ})
    out.update((k, record[k]) for k in KEPT_AS_READ if k in record)
    return out


def masked_message(line):
    """One line of gpuops' messages as the relay keeps it in the call's inbox: ``masked``."""
    try:
        message = json.loads(line)
    except ValueError:
        return line
    return json.dumps(masked(message)).encode("utf-8") if isinstance(message, dict) else line


def worker_main(payload, call_dir, hooks):
    """In the detached worker: finish dead runs, then the mode's work; the result to a file."""
    progress_path = os.path.join(call_dir, "progress.jsonl")

    def progress(record):
        append_line(progress_path, masked(record))

    lease = Lease(call_dir, float(payload.get("lease_s") or DEFAULT_LEASE_S), payload.get("deadline_s"))
    notes = []
    restored = []
    mode = payload.get("mode", "apply")
    result = None
    try:
        recovered = recover_unfinished(payload["state_dir"], progress, notes, restored,
                                       held=(payload.get("run_id"), lease) if mode == MODE_RECOVER else None)
        for line in recovered:
            progress({"event": EVENT_RECOVERED, "note": line})
        result = WORK[mode](payload, progress, lease, hooks, notes)
        result["recovered"] = recovered
        if mode == MODE_RECOVER:
            result["restored"] = restored
    except StepFailed as exc:
        status = STATUS_ROLLBACK_FAILED if mode == MODE_RECOVER else STATUS_REFUSED
        result = {"ok": False, "status": status, "error": str(exc), "run_id": payload.get("run_id")}
    except Exception as exc:
        result = {"ok": False, "status": STATUS_ERROR, "error": "%s: %s" % (type(exc).__name__, exc),
                  "run_id": payload.get("run_id")}
    result["notes"] = notes + list(result.get("notes") or [])
    atomic_write(os.path.join(call_dir, "result.json"), json.dumps(masked(result)).encode(), 0o600)


class Relay:
    """The SSH session's side: client messages in (lease, inbox), worker progress out."""

    def __init__(self, call_dir):
        self.call_dir = call_dir
        self.lease_path = os.path.join(call_dir, "lease")
        self.inbox = os.path.join(call_dir, "inbox.jsonl")
        self.gone_path = os.path.join(call_dir, "client_gone")
        self.out_ok = True
        self.inbox_failure = None  # why gpuops' messages could not be passed on (the worker saw gpuops go)
        self._offset = 0
        self._last_beat = 0.0

    def touch_lease(self):
        note_beat(self.lease_path)

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
                    text = masked_message(text)  # a reason may quote the server (a smoke answer, a log line)
                    try:
                        fd = os.open(self.inbox, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                        try:
                            os.write(fd, text + b"\n")
                        finally:
                            os.close(fd)
                    except OSError as exc:  # a full state dir (ENOSPC): named in the result
                        self.inbox_failure = "gpuops' message could not be passed on to the worker: %s" % (
                            os_error(exc, self.inbox))
                        raise
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


def start_worker(payload, call_dir, lock_fd, hooks):
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
                        {"event": EVENT_WORKER, "pid": os.getpid(), "relay": os.getppid()})
            worker_main(payload, call_dir, hooks)
        finally:
            os._exit(0)
    return pid


def os_error(exc, path):
    """An OSError as its real cause: the errno's name, the message and the path."""
    import errno

    return "%s %s: %s" % (errno.errorcode.get(exc.errno or 0, "error"), exc.strerror or exc, exc.filename or path)


def state_dir_full(state_dir):
    """"ENOSPC: no space left on STATE_DIR" when the state dir is (nearly) full, else None."""
    try:
        st = os.statvfs(state_dir)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < 1024 * 1024:
        return "ENOSPC: no space left on %s" % state_dir
    return None


def journaled_end(payload):
    """This run's last terminal journal record (finished, rolled_back, rollback_failed), or None."""
    try:
        records = read_journal(payload["state_dir"])
    except OSError:
        return None
    ends = [r for r in records if r.get("run_id") == payload.get("run_id") and r.get("event") in (FINISHED, ROLLED_BACK, ROLLBACK_FAILED)]
    return ends[-1] if ends else None


def from_journal_end(payload, record, cause):
    note = "its result could not be written (%s); the host's journal says %s" % (cause, record["event"])
    if record["event"] == FINISHED:
        return {"ok": True, "status": STATUS_FINISHED, "run_id": payload.get("run_id"), "notes": [note]}
    status = STATUS_ROLLED_BACK if record["event"] == ROLLED_BACK else STATUS_ROLLBACK_FAILED
    return {"ok": False, "status": status, "run_id": payload.get("run_id"),
            "error": "%s (%s)" % (record.get("error") or record["event"], note)}


def with_relay_failure(result, failure):
    """A result whose run ended because gpuops' messages could not reach the worker names that."""
    if failure and not result.get("ok"):
        result = dict(result, error="%s (%s)" % (result.get("error") or result.get("status"), failure))
    return result


def relay_call(payload, call_dir, lock_fd, hooks, client_stream):
    relay = Relay(call_dir)
    relay.touch_lease()
    pid = start_worker(payload, call_dir, lock_fd, hooks)
    os.close(lock_fd)  # the worker keeps the lock until it is done, whatever happens to us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    reader = threading.Thread(target=relay.read_client, args=(client_stream,), daemon=True)
    reader.start()
    result = relay_until_done(relay, pid, call_dir)
    if result is not None:
        return with_relay_failure(result, relay.inbox_failure)
    cause = relay.inbox_failure or state_dir_full(payload["state_dir"])
    ended = journaled_end(payload)
    if ended is not None:
        # The worker ended the run (its journal says how) but could not write its result: that
        # outcome, not a guess, with the reason its result is missing.
        return from_journal_end(payload, ended, cause or "the worker (pid %d) left no result" % pid)
    # The worker died without a result: a second worker rolls its run back now, under the lock,
    # while this relay goes on heart-beating to gpuops (a restart can take a while).
    died = "the host-side worker (pid %d) died before the run ended%s" % (pid, " (%s)" % cause if cause else "")
    try:
        fd = take_lock(payload["state_dir"])
    except StepFailed as exc:
        return {"ok": False, "status": STATUS_UNKNOWN, "error": "%s; %s" % (died, exc), "run_id": payload.get("run_id")}
    recovery = dict(payload, mode=MODE_RECOVER, for_mode=payload.get("mode"), died=died)
    pid = start_worker(recovery, call_dir, fd, HostHooks())  # a recovery runs without the host's hooks
    os.close(fd)
    result = relay_until_done(relay, pid, call_dir)
    if result is not None:
        return result
    return {"ok": False, "status": STATUS_ROLLBACK_FAILED, "run_id": payload.get("run_id"),
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


def main(payload, client_stream):
    mode = payload.get("mode", "apply")
    if mode not in WORK:
        raise StepFailed("unknown mode %r" % mode)
    state_dir = payload["state_dir"]
    if mode == MODE_JOURNAL and not os.path.isdir(state_dir):
        return {"ok": True, "status": STATUS_JOURNAL, "records": [], "run_id": payload.get("run_id")}
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    try:
        lock_fd = take_lock(state_dir)
    except StepFailed:
        if mode != MODE_JOURNAL:
            raise
        # A run holds the host: show the journal as it stands, change nothing.
        notes = []
        return {"ok": True, "status": STATUS_JOURNAL, "records": read_journal(state_dir, notes), "busy": True,
                "notes": notes, "run_id": payload.get("run_id")}
    try:
        hooks = load_hooks() if mode != MODE_JOURNAL else HostHooks()
        if mode == MODE_JOURNAL and not unfinished_runs(read_journal(state_dir)):
            notes = []
            return {"ok": True, "status": STATUS_JOURNAL, "records": read_journal(state_dir, notes), "notes": notes,
                    "run_id": payload.get("run_id")}
        prune_calls(state_dir)
        # the mode too: a rollback that finds later runs standing is followed, under the same run id and
        # often in the same second, by the recomposition's apply call
        call_dir = os.path.join(state_dir, "calls", "%s-%s-%s" % (time.strftime("%Y%m%dT%H%M%S"), payload["run_id"],
                                                                   mode))
        os.makedirs(call_dir, mode=0o700)  # never an old call's folder: no stale result.json is read
    except BaseException:
        os.close(lock_fd)
        raise
    return relay_call(payload, call_dir, lock_fd, hooks, client_stream)


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
        result = {"ok": False, "status": STATUS_REFUSED, "error": str(exc), "run_id": payload.get("run_id")}
    except OSError as exc:  # before any change: e.g. a state dir this user may not create
        result = {"ok": False, "status": STATUS_REFUSED, "run_id": payload.get("run_id"),
                  "error": "cannot use the state dir %s: %s (set gpuops_state_dir, or --become)"
                           % (payload.get("state_dir"), exc.strerror or exc)}
    try:
        sys.stdout.write(json.dumps({"result": result}) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    status = entry()
    # The relay's reader thread may still be blocked reading gpuops' stdin (the client closes it
    # only after reading the result), holding that stream's lock: CPython's shutdown then aborts on
    # it ("could not acquire lock for <stdin> at interpreter shutdown", SIGABRT) after a good result.
    # The result is written and flushed, the worker is its own process: leave without the shutdown.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
