"""The apply host protocol, in one place: what gpuops and the apply helper say to each other over
the transaction channel, what the helper's result is, and what the journal records.
Stdlib only, Python 3.8+: bundled with the helper for the host and imported by the client.

One exec carries a run (``remote/apply_helper.py``, stream mode; ``apply/txn.py`` on the client):

    gpuops (apply/txn.py)                       host (remote/apply_helper.py: relay -> worker)
      | --- payload (length-prefixed JSON) ------->|  lock, recover dead runs   journal: started
      | <-- {"event": "recovered", "note"} --------|  (a dead run rolled back first)
      | --- {"hb": 1} every lease/5 -------------->|  (the lease: no message for a lease -> roll back)
      | <-- {"event": "phase"|"wrote"|...} --------|  backups, writes               server_touched
      | <-- {"event": "audited", "audit_output"} --|  the gate re-audit ran on the patched tree
      | --- {"verdict": bool, "reason"} ---------->|  gpuops judged it (False -> roll back)
      | <-- {"event": "verified", "pid"} ----------|  server restarted, healthy, owns its port
      | --- {"commit": true} | {"commit": false} ->|  after gpuops' smoke check
      | <-- {"event": "committed"|"rolled_back", -|  journal: finished | rolled_back (written first):
      |      "run_id"}                             |  the answer that confirms the outcome
      | <-- {"result": {"status": ...}} -----------|  (or unchanged; rollback_failed: the run stays open)
      no answer: gpuops reads the host's journal again (txn.read_outcome) before it says unknown

A rollback is the same exchange with ``mode: rollback`` (no audit; ``verified`` once the previous
server runs again). Recovery: whoever takes the host's lock next (an apply, rollback or history)
rolls back any run that is ``started`` without a terminal event, and says so (``recovered``).
The client never learns an outcome it did not read: then its status is ``unknown``.
"""

from __future__ import annotations


# Journal events (STATE/journal.jsonl, remote/apply_journal.py): a run's records in order.
STARTED = "started"
SERVER_TOUCHED = "server_touched"
FINISHED = "finished"
ROLLED_BACK = "rolled_back"
UNCHANGED = "unchanged"
ROLLBACK_FAILED = "rollback_failed"  # the run stays open: the next command tries again
# The previous server that a run's undo started (``pid``; ``health_deadline``, epoch seconds): a later
# recovery of the run finds it alive and waits for it or leaves it, never restarting it.
PREVIOUS_STARTED = "previous_started"
REVERTED_BY_ROLLBACK = "reverted_by_rollback"  # not written by this version; still read as closed
TERMINAL_EVENTS = (FINISHED, ROLLED_BACK, UNCHANGED, REVERTED_BY_ROLLBACK)
JOURNAL_EVENTS = (STARTED, SERVER_TOUCHED, PREVIOUS_STARTED, ROLLBACK_FAILED) + TERMINAL_EVENTS

# The helper's result ``status`` (host side), and the client's own for what it could not learn.
STATUS_FINISHED = FINISHED
STATUS_UNCHANGED = UNCHANGED
STATUS_ROLLED_BACK = ROLLED_BACK
STATUS_ROLLBACK_FAILED = ROLLBACK_FAILED
STATUS_REFUSED = "refused"            # nothing changed: the host refused the run (drift, a lock, ...)
STATUS_LATER_RUNS_STAND = "later_runs_stand"  # a rollback whose target later runs stand on
STATUS_JOURNAL = "journal"            # a history call: the journal, nothing changed
STATUS_ERROR = "error"
# Nobody knows yet: the client's when the channel ended before the result; the relay's when its
# worker died and the lock could not be taken to roll the run back (the next command will).
STATUS_UNKNOWN = "unknown"
RESULT_STATUSES = (STATUS_FINISHED, STATUS_UNCHANGED, STATUS_ROLLED_BACK, STATUS_ROLLBACK_FAILED, STATUS_REFUSED,
                   STATUS_LATER_RUNS_STAND, STATUS_JOURNAL, STATUS_ERROR, STATUS_UNKNOWN)

# Host -> client, one JSON object a line: {"event": NAME, ...}; the last line is {"result": {...}}.
EVENT_HEARTBEAT = "heartbeat"
EVENT_RECOVERED = "recovered"
EVENT_AUDITED = "audited"
EVENT_VERIFIED = "verified"
EVENT_COMMITTED = "committed"      # the host's answer to the commit, journaled before it is sent
EVENT_ROLLED_BACK = ROLLED_BACK    # ... or that it rolled the run back instead
EVENT_RECOVERING = "recovering"    # a dead run found: rolling it back before this one
EVENT_WORKER = "worker"            # the relay started its worker (pid)
EVENT_PHASE = "phase"              # a step of the run began (backups, writes, restart, ...)
EVENT_PAUSED = "paused"            # a host hook held the run (the lab's pause_at)
EVENT_WROTE = "wrote"              # a managed file written
EVENT_DIR_KEPT = "dir_kept"        # a created directory left in place (not empty)
EVENT_COMPILED = "compiled"        # a patched module byte-compiled
EVENT_HEALTHY = "healthy"          # the restarted server answered its health check
EVENT_ROLLING_BACK = "rolling_back"
EVENT_IMAGE_BUILT = "image_built"
EVENT_IMAGE_KEPT = "image_kept"
EVENT_IMAGE_REMOVED = "image_removed"
# A node of a multi-node server (payload "deployment", apply/deployment.py) holds at three points
# until gpuops lets it go: before it stops its server, after it stopped it, and in a rollback after
# it stopped the new server (before the previous one starts). Without a client, a hold is a lapsed lease.
EVENT_STOP_READY = "stop_ready"
EVENT_STOPPED = "stopped"
EVENT_ROLLBACK_STOPPED = "rollback_stopped"
PROGRESS_EVENTS = (EVENT_HEARTBEAT, EVENT_RECOVERED, EVENT_AUDITED, EVENT_VERIFIED, EVENT_COMMITTED, EVENT_ROLLED_BACK,
                   EVENT_RECOVERING, EVENT_WORKER, EVENT_PHASE, EVENT_PAUSED, EVENT_WROTE, EVENT_DIR_KEPT,
                   EVENT_COMPILED, EVENT_HEALTHY, EVENT_ROLLING_BACK, EVENT_IMAGE_BUILT, EVENT_IMAGE_KEPT,
                   EVENT_IMAGE_REMOVED, EVENT_STOP_READY, EVENT_STOPPED, EVENT_ROLLBACK_STOPPED)

# The payload's ``mode``: what the helper is asked to do.
MODE_APPLY = "apply"
MODE_ROLLBACK = "rollback"
MODE_JOURNAL = "journal"   # read the journal (gpuops history, a reconcile), recovering a dead run first
MODE_RECOVER = "recover"   # roll back a dead run only
MODES = (MODE_APPLY, MODE_ROLLBACK, MODE_JOURNAL, MODE_RECOVER)

# A run's kind: the journal's ``kind`` (its ``started`` record, its manifest, its ``finished``), and
# the home journal's ``role`` of a run that is no role's. An apply run has no kind; a rollback (a
# recomposition too, with ``recompose: true``) is a run of its own that undid ``target``.
KIND_ROLLBACK = "rollback"
RUN_KINDS = (KIND_ROLLBACK,)

# Client -> host, one JSON object a line, after the payload: the key says which.
MESSAGE_HEARTBEAT = "hb"      # {"hb": 1}: renews the lease
MESSAGE_VERDICT = "verdict"   # {"verdict": bool, "reason": str}: gpuops' judgement of the re-audit
MESSAGE_COMMIT = "commit"     # {"commit": true} or {"commit": false, "reason": str}
MESSAGE_STOP = "stop"         # {"stop": true} or {"stop": false, "reason": str}: a node may stop its server
MESSAGE_START = "start"       # ... start the new one (every node stopped)
MESSAGE_RESTART = "restart"   # ... start the previous one in a rollback (every node stopped)
MESSAGE_ABORT = "abort"       # {"abort": why}: another node failed, roll back now (honoured at any wait)
HOLDS = {EVENT_STOP_READY: MESSAGE_STOP, EVENT_STOPPED: MESSAGE_START, EVENT_ROLLBACK_STOPPED: MESSAGE_RESTART}
CLIENT_MESSAGES = (MESSAGE_HEARTBEAT, MESSAGE_VERDICT, MESSAGE_COMMIT, MESSAGE_STOP, MESSAGE_START, MESSAGE_RESTART,
                   MESSAGE_ABORT)


# The client's own statuses for a host it could not run (not from the helper).
STATUS_FAILED = "failed"     # the helper's answer was not a known status, or the host failed before it
STATUS_SKIPPED = "skipped"   # a rollout stopped before this host
STATUS_STAGED = "staged"     # sglang-release -e sglang_release_stage=true: the release made ready, nothing switched


def _texts(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class HelperResult:
    """The helper's last line, ``{"result": {...}}``, as the client reads it (``from_json``): each
    field checked for its type, since what a host sends is untrusted data (a wrong type reads as
    absent), and a status outside ``RESULT_STATUSES`` read as ``failed`` with the status named.
    A plain class (no dataclasses, no typing at run time): this module is bundled into every apply
    helper, and those imports would cost each exec ~10 ms on the host."""

    __slots__ = ("status", "ok", "run_id", "error", "pid", "restored", "recovered", "notes", "problems", "kept",
                 "log_tail", "audit_verdict", "service", "target", "records", "busy")
    status: str
    ok: bool
    run_id: str | None
    error: str | None
    pid: int | None
    restored: tuple[str, ...]    # files put back from backups
    recovered: tuple[str, ...]   # what the helper rolled back first (dead runs)
    notes: tuple[str, ...]
    problems: tuple[str, ...]    # why a rollback failed
    kept: tuple[str, ...]        # --force: later versions kept beside the backups
    log_tail: str | None
    audit_verdict: str | None
    service: str | None          # what was done to the server
    target: str | None           # the run a rollback undid
    records: tuple[dict[str, object], ...]  # the journal (journal mode; later_runs_stand)
    busy: bool                   # journal mode: another run holds the lock

    def __init__(self, status: str, ok: bool = False, run_id: str | None = None, error: str | None = None,
                 pid: int | None = None, restored: tuple[str, ...] = (), recovered: tuple[str, ...] = (),
                 notes: tuple[str, ...] = (), problems: tuple[str, ...] = (), kept: tuple[str, ...] = (),
                 log_tail: str | None = None, audit_verdict: str | None = None, service: str | None = None,
                 target: str | None = None, records: tuple[dict[str, object], ...] = (), busy: bool = False) -> None:
        self.status, self.ok, self.run_id, self.error, self.pid = status, ok, run_id, error, pid
        self.restored, self.recovered, self.notes, self.problems, self.kept = restored, recovered, notes, problems, kept
        self.log_tail, self.audit_verdict, self.service, self.target = log_tail, audit_verdict, service, target
        self.records, self.busy = records, busy

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HelperResult) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return "HelperResult(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__)

    @classmethod
    def from_json(cls, data: object) -> HelperResult:
        if not isinstance(data, dict):
            return cls(STATUS_FAILED, error="the helper's result is not a JSON object")
        status = data.get("status")
        error = _text(data.get("error"))
        if not isinstance(status, str) or status not in RESULT_STATUSES:
            error = error or "the helper ended with status %r" % (status,)
            status = STATUS_FAILED
        pid = data.get("pid")
        records = data.get("records")
        return cls(status=status, ok=data.get("ok") is True, run_id=_text(data.get("run_id")), error=error,
                   pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                   restored=_texts(data.get("restored")), recovered=_texts(data.get("recovered")),
                   notes=_texts(data.get("notes")), problems=_texts(data.get("problems")),
                   kept=_texts(data.get("kept")), log_tail=_text(data.get("log_tail")),
                   audit_verdict=_text(data.get("audit_verdict")), service=_text(data.get("service")),
                   target=_text(data.get("target")),
                   records=tuple(r for r in records if isinstance(r, dict)) if isinstance(records, list) else (),
                   busy=data.get("busy") is True)


# Bounds on what one progress event's text fields may hold as the client keeps them (the channel's
# line is bounded by transport/limits.STREAM_LINE_LIMIT): a name or an id, a sentence, a log.
_EVENT_WORD = 200
_EVENT_SENTENCE = 4096


def _cut(value: object, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) else None


class HostEvent:
    """One progress line of the helper, ``{"event": NAME, ...}``, as the client reads it
    (``from_json``): NAME one of ``PROGRESS_EVENTS`` (any other line is no event: None), each field
    the client acts on checked for its type (a wrong type reads as absent) and cut to a bound, since
    what a host sends is untrusted data. A plain class, as ``HelperResult`` is, for the same reason."""

    __slots__ = ("name", "run_id", "phase", "note", "why", "pid", "log", "audit_output", "deployment", "manifest")
    name: str
    run_id: str | None         # committed, rolled_back, recovering: the run it is about
    phase: str | None          # phase: the step that began
    note: str | None           # recovered: what was rolled back first
    why: str | None            # rolling_back, rolled_back: the reason
    pid: int | None            # verified, healthy: the server's
    log: str | None            # verified, when asked (read_log): the server's log since its start
    audit_output: object       # audited: the gate re-audit's output, judged by apply/verdict.py
    deployment: dict[str, object] | None  # stop_ready of a rollback: the target run's deployment record
    manifest: str | None       # stop_ready of a rollback: the file that record was read from

    def __init__(self, name: str, run_id: str | None = None, phase: str | None = None, note: str | None = None,
                 why: str | None = None, pid: int | None = None, log: str | None = None,
                 audit_output: object = None, deployment: dict[str, object] | None = None,
                 manifest: str | None = None) -> None:
        self.name, self.run_id, self.phase, self.note, self.why = name, run_id, phase, note, why
        self.pid, self.log, self.audit_output, self.deployment = pid, log, audit_output, deployment
        self.manifest = manifest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostEvent) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return "HostEvent(%s)" % ", ".join("%s=%r" % (n, getattr(self, n)) for n in self.__slots__)

    @classmethod
    def from_json(cls, data: object) -> HostEvent | None:
        if not isinstance(data, dict):
            return None
        name = data.get("event")
        if not isinstance(name, str) or name not in PROGRESS_EVENTS:
            return None
        pid, deployment = data.get("pid"), data.get("deployment")
        return cls(name, run_id=_cut(data.get("run_id"), _EVENT_WORD), phase=_cut(data.get(EVENT_PHASE), _EVENT_WORD),
                   note=_cut(data.get("note"), _EVENT_SENTENCE), why=_cut(data.get("why"), _EVENT_SENTENCE),
                   pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                   log=_text(data.get("log")), audit_output=data.get("audit_output"),
                   deployment=deployment if isinstance(deployment, dict) else None,
                   manifest=_cut(data.get("manifest"), _EVENT_SENTENCE))
