"""gpuops' side of a host transaction: keep the lease alive, answer the helper, confirm, time out.

One exec carries the whole run (``remote/apply_helper.py``, stream mode): gpuops heartbeats on the
channel's stdin (every fifth of the lease), judges the gate re-audit when the helper sends it, and
confirms once it has seen the verification (``verified``). The helper commits only on that
confirmation; if gpuops goes quiet for a lease, or the channel closes, it rolls the host back.
So when this side cannot learn the outcome (timeout, connection lost) the outcome is "unknown",
never "changed=0": before the confirmation the host rolls itself back; after it, it has committed.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping
from gpuops.remote.host_protocol import EVENT_AUDITED, EVENT_COMMITTED, EVENT_HEARTBEAT, EVENT_PHASE, EVENT_RECOVERED, EVENT_ROLLED_BACK, EVENT_VERIFIED, FINISHED, MODE_APPLY, ROLLED_BACK, STATUS_ERROR, STATUS_FINISHED, STATUS_ROLLED_BACK, STATUS_UNKNOWN, HostEvent
from gpuops.apply import inflight
from gpuops.errors import GpuopsError
from gpuops.shipping import missing_python
from gpuops.remote.host_protocol import HOLDS
from gpuops.transport.verbose import COMMANDS, LOGGER
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.transport import Connection
    from gpuops.transport.stream import Stream

DEFAULT_LEASE_S = 30.0
STALL_S = 2.0  # a wait for the host's next line that overran by this much: this side was not running
# Past --timeout, with its confirmation sent: how long gpuops still reads the host's journal (over a
# fresh connection if need be) to learn whether it committed, before it says unknown.
DEADLINE_GRACE_S = 5.0


def number_var(variables: Mapping[str, Any], name: str, default: float, cast: Callable[[Any], float],
               kind: str, minimum: float, unit: str = "") -> float:
    """A numeric run variable, checked: one clear error naming it for a non-number or a too-small one."""

    raw = variables.get(name, default)
    try:
        value = cast(raw)
    except (TypeError, ValueError):
        raise GpuopsError(f"{name} must be {kind}, not {raw!r}") from None
    if value < minimum:
        raise GpuopsError(f"{name} must be at least {minimum:g}{unit}, not {raw!r}")
    return value


def lease_seconds(variables: Mapping[str, Any]) -> float:
    """``gpuops_lease`` (seconds, >= 1): how long a host waits for gpuops before it rolls back."""
    return number_var(variables, "gpuops_lease", DEFAULT_LEASE_S, float, "a number of seconds", 1, " second")


def _within(read: Callable[[], Mapping[str, Any] | None], seconds: float) -> tuple[Mapping[str, Any] | None, str]:
    """``read()``'s answer, or None and why not: it failed (a transport error), or it gave no answer
    within ``seconds`` (a connection to a stalled host; its thread is left to end by itself)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((read(), ""))
        except Exception as exc:
            box.append((None, f"{type(exc).__name__}: {exc}"))

    reader = threading.Thread(target=run, name="read-journal", daemon=True)
    reader.start()
    reader.join(max(0.1, seconds))
    return box[0] if box else (None, f"no answer within {max(0.1, seconds):.0f} s")


def not_started(stream: "Stream", run_id: str | None) -> dict[str, Any] | None:
    """The helper never ran: no python on the host to run it (``remote.NO_PYTHON``'s line, waited
    for up to 5 s: stdout's end can come before it). Then nothing changed, and the error says why,
    naming the interpreter; else None."""
    why = missing_python(stream.stderr_text(wait=5.0))
    if why is None:
        return None
    return {"ok": False, "status": STATUS_ERROR, "run_id": run_id, "error": f"{why} (nothing was changed)"}


def unknown(why: str, lease_s: float, confirmed: bool, run_id: str | None) -> dict[str, Any]:
    """No answer from the host and its journal could not be read: say what is known, never guess."""
    if confirmed:
        then = ("gpuops had sent its confirmation, but the host's answer never came and its journal "
                "could not be read")
    else:
        then = f"the host rolls itself back within its lease ({lease_s:.0f} s)"
    return {"ok": False, "status": STATUS_UNKNOWN, "run_id": run_id, "confirmed": confirmed,
            "error": f"{why}; {then}; `gpuops history` shows what it did"}


def from_journal(run: Mapping[str, Any] | None, why: str, lease_s: float, confirmed: bool,
                 run_id: str | None) -> dict[str, Any]:
    """The outcome the host journaled for ``run_id`` (``runs_by_id`` entry), read after the answer
    was lost: exactly what the host did, or ``unknown`` when it has not ended the run."""
    if run is None or run.get("last_event") not in (FINISHED, ROLLED_BACK):
        return unknown(why + "; the host's journal has no outcome for it yet", lease_s, confirmed, run_id)
    note = f"{why}; the host's journal, read again, says {run['last_event']} {run_id}"
    if run["last_event"] == FINISHED:
        return {"ok": True, "status": STATUS_FINISHED, "run_id": run_id, "pid": run.get("pid"), "notes": [note]}
    return {"ok": False, "status": STATUS_ROLLED_BACK, "run_id": run_id,
            "error": f"{run.get('error') or 'rolled back'} ({note})"}


def run_transaction(conn: "Connection", command: str, body: bytes, lease_s: float, deadline: float | None,
                    run_id: str | None, on_audit: Callable[[Any], tuple[bool, str]] | None = None,
                    on_event: Callable[[HostEvent], None] | None = None,
                    on_verified: Callable[[], tuple[bool, str | None]] | None = None,
                    read_outcome: Callable[[], Mapping[str, Any] | None] | None = None,
                    on_open: Callable[[Callable[[dict[str, Any]], bool]], None] | None = None,
                    on_hold: Callable[[str], tuple[bool, str | None]] | None = None,
                    mode: str = MODE_APPLY) -> dict[str, Any]:
    """Run the helper; return its ``result`` (or the journal's outcome, or ``unknown``).

    ``deadline``: monotonic. ``on_verified`` (the correctness smoke check) runs once the new server
    is healthy, before the confirmation; when it answers False the helper is told not to commit,
    and rolls the run back. The heartbeat goes on from its own thread while this side runs its own
    steps (the audit's judgement, the smoke check, a slow first answer), and the host's silence is
    judged only when nothing it sent is waiting to be read (a client that was busy or frozen has
    not heard a silent host). The commit is confirmed only by the host's answer (``committed`` /
    ``rolled_back``, journaled before it is sent); when the answer does not come, ``read_outcome``
    (the host's journal, read again) says what the host did.

    A node of a multi-node server (``apply/deployment.py``) holds at ``host_protocol.HOLDS``: its
    event calls ``on_hold(event)`` (which waits for the other nodes) and the answer lets it go on
    or not; ``on_open`` gets, once the channel is open, how to send the host a message (an abort)."""

    host_name = conn.host.name
    stream = conn.open_stream(command)
    inflight.opened(host_name, run_id, lease_s, mode)
    channel = _Channel(stream, host_name, lease_s, deadline, run_id, read_outcome,
                       _Answers(on_audit, on_event, on_verified, on_hold))
    interrupted = False
    stop = threading.Event()
    heart = threading.Thread(target=channel.beat, args=(stop,), daemon=True)
    watchdog = _watchdog(stream, deadline)
    try:
        if on_open is not None:
            on_open(channel.send)
        if not stream.send(body):
            return channel.body_refused()
        heart.start()
        return channel.read_to_the_end()
    except KeyboardInterrupt:
        interrupted = True  # the run stays listed: cli.py says what the host does now
        raise
    finally:
        stop.set()
        if watchdog is not None:
            watchdog.cancel()
        stream.close()
        if not interrupted:
            inflight.closed(host_name)


def _watchdog(stream: "Stream", deadline: float | None) -> threading.Timer | None:
    """At the deadline the stream is cut off, whatever this side is blocked on: a send to a host
    whose session stalled (sshd stopped) never returns by itself, and neither does a polite close
    behind it (apply --timeout 20 ran past 60 s so, 2 runs in 5)."""
    if deadline is None:
        return None
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()) + 1.0, stream.abort)
    watchdog.daemon = True
    watchdog.start()
    return watchdog


@frozen
class _Answers:
    """This side's part in the exchange, as the caller gave it: who judges the re-audit, sees the
    progress events, checks before the commit, and waits at a deployment's holds."""

    on_audit: Callable[[Any], tuple[bool, str]] | None
    on_event: Callable[[HostEvent], None] | None
    on_verified: Callable[[], tuple[bool, str | None]] | None
    on_hold: Callable[[str], tuple[bool, str | None]] | None


class _Channel:
    """One transaction's channel as this side reads it: what the host said so far (its answer,
    what it recovered, when it was last heard), what this side sent (the commit), and one handler
    per kind of message; the outcome when the channel ends, whichever way it ends."""

    def __init__(self, stream: "Stream", host_name: str, lease_s: float, deadline: float | None,
                 run_id: str | None, read_outcome: Callable[[], Mapping[str, Any] | None] | None,
                 answers: _Answers) -> None:
        self.stream, self.host_name, self.lease_s, self.deadline, self.run_id = stream, host_name, lease_s, deadline, run_id
        self.read_outcome, self.answers = read_outcome, answers
        self.sent_commit = False
        self.answer: dict[str, Any] | None = None   # the host's committed / rolled_back for this run
        self.recovered: list[str] = []
        self.verdict_reason: str | None = None
        self.heard = False  # any line from the host yet: before one, its python may not even have started
        self.last_heard = 0.0
        self.handlers: dict[str, Callable[[HostEvent], None]] = {
            EVENT_RECOVERED: self._recovered, EVENT_COMMITTED: self._committed, EVENT_ROLLED_BACK: self._rolled_back,
            EVENT_AUDITED: self._audited, EVENT_VERIFIED: self._verified,
            **{hold: self._held for hold in HOLDS}}

    def send(self, message: dict[str, Any]) -> bool:
        return self.stream.send((json.dumps(message) + "\n").encode())

    def beat(self, stop: threading.Event) -> None:
        """The heartbeat, every fifth of the lease, from its own thread until ``stop``."""
        interval = max(0.2, self.lease_s / 5)
        while not stop.wait(interval):
            if not self.stream.send(b'{"hb": 1}\n'):
                return

    # ------------------------------------------------------------ how the channel ends

    def body_refused(self) -> dict[str, Any]:
        """The helper and its payload could not be sent: the host never started the run."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            return unknown("the host did not finish within --timeout", self.lease_s, False, self.run_id)
        return not_started(self.stream, self.run_id) or unknown(
            "the host closed the channel before the helper started", self.lease_s, False, self.run_id)

    def read_to_the_end(self) -> dict[str, Any]:
        """Every line the host sends, each handled, until its result, the channel's end, the host's
        silence for a lease, or the deadline."""
        self.last_heard = time.monotonic()
        while True:
            now = time.monotonic()
            if self.deadline is not None and now > self.deadline:
                if self.sent_commit:
                    return self._lost("the host did not finish within --timeout", past_deadline=True)
                return unknown("the host did not finish within --timeout", self.lease_s, False, self.run_id)
            wait = 0.5 if self.deadline is None else max(0.01, min(0.5, self.deadline - now))
            line = self.stream.readline(wait)
            if time.monotonic() - now > wait + STALL_S:
                # This process did not run (frozen, suspended, starved): what the host sent meanwhile
                # may not even have been read off the socket yet. Its silence is judged afresh.
                self.last_heard = time.monotonic()
            if line is None:
                if time.monotonic() - self.last_heard > max(self.lease_s, 5.0):
                    return self._lost(f"the host went silent for {time.monotonic() - self.last_heard:.0f} s")
                continue
            if line == b"":
                return self._closed()
            result = self._line(line)
            if result is not None:
                return result

    def _closed(self) -> dict[str, Any]:
        """The channel ended before the result: the helper never ran, or the connection was lost."""
        if not self.heard:
            started = not_started(self.stream, self.run_id)
            if started is not None:
                return started
        tail = (self.stream.stderr_text().strip().splitlines() or ["the channel closed"])[-1]
        return self._lost(f"the connection to the host was lost before the result ({tail})")

    def _lost(self, why: str, past_deadline: bool = False) -> dict[str, Any]:
        """The result line never came: the host's answer if it gave one, else its journal read
        again once the commit was sent (what it did), else ``unknown``."""
        if self.answer is not None:  # the host answered; only its result line was lost
            return self.answer
        if not self.sent_commit or self.read_outcome is None:
            return unknown(why, self.lease_s, self.sent_commit, self.run_id)
        # The host decides within its lease (the commit in its inbox, or the lease lapsing); past
        # --timeout, gpuops looks only DEADLINE_GRACE_S more, whatever the connection does.
        waited_until = time.monotonic() + (DEADLINE_GRACE_S if past_deadline else self.lease_s + 15)
        while True:
            run, why_not = _within(self.read_outcome, waited_until - time.monotonic())
            if run is not None and run.get("last_event") in (FINISHED, ROLLED_BACK):
                return from_journal(run, why, self.lease_s, self.sent_commit, self.run_id)
            if time.monotonic() + 2.0 > waited_until:
                return from_journal(None, why + (f" (reading the journal: {why_not})" if why_not else ""),
                                    self.lease_s, self.sent_commit, self.run_id)
            time.sleep(2.0)

    # ------------------------------------------------------------ one handler per message kind

    def _line(self, line: bytes) -> dict[str, Any] | None:
        """One line from the host: its result (returned: the end), or an event, handled."""
        self.heard = True
        self.last_heard = time.monotonic()
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        if "result" in message and isinstance(message["result"], dict):
            return self._result(message["result"])
        event = HostEvent.from_json(message)  # None: no progress event this version knows
        if event is not None:
            self._event(event)
        return None

    def _result(self, result: dict[str, Any]) -> dict[str, Any]:
        result["recovered"] = list(result.get("recovered") or self.recovered)
        if self.verdict_reason and not result.get("audit_verdict"):
            result["audit_verdict"] = self.verdict_reason
        return result

    def _event(self, event: HostEvent) -> None:
        if self.answers.on_event is not None and event.name != EVENT_HEARTBEAT:
            self.answers.on_event(event)
        if event.name == EVENT_PHASE and event.phase:
            inflight.at_phase(self.host_name, event.phase)
            # -v: where the run is, logged once this side knows it (what a Ctrl-C now reports)
            LOGGER.log(COMMANDS, "%s: run %s at %s", self.host_name, self.run_id, event.phase)
        handler = self.handlers.get(event.name)
        if handler is not None:
            handler(event)

    def _recovered(self, event: HostEvent) -> None:
        if event.note:
            self.recovered.append(event.note)

    def _committed(self, event: HostEvent) -> None:
        if event.run_id == self.run_id:
            self.answer = {"ok": True, "status": STATUS_FINISHED, "run_id": self.run_id, "recovered": self.recovered}

    def _rolled_back(self, event: HostEvent) -> None:
        if event.run_id == self.run_id:
            self.answer = {"ok": False, "status": STATUS_ROLLED_BACK, "run_id": self.run_id,
                           "recovered": self.recovered, "error": event.why or "rolled back"}

    def _audited(self, event: HostEvent) -> None:
        on_audit = self.answers.on_audit
        ok, self.verdict_reason = on_audit(event.audit_output) if on_audit else (False, "no judge")
        self.send({"verdict": ok, "reason": self.verdict_reason})
        self.last_heard = time.monotonic()  # this side was busy, not the host silent

    def _held(self, event: HostEvent) -> None:
        on_hold = self.answers.on_hold
        go, why = on_hold(event.name) if on_hold is not None else (False, "not a node of a deployment")
        self.last_heard = time.monotonic()  # this side waited for the other nodes, not the host
        self.send({HOLDS[event.name]: go, "reason": why})

    def _verified(self, event: HostEvent) -> None:
        # Seen: health (the server we started owns the port) and the re-audit's verdict.
        inflight.at_phase(self.host_name, EVENT_VERIFIED)
        LOGGER.log(COMMANDS, "%s: run %s verified on the host; gpuops checks it before the commit",
                   self.host_name, self.run_id)
        on_verified = self.answers.on_verified
        keep, why = on_verified() if on_verified is not None else (True, None)
        self.last_heard = time.monotonic()  # the smoke check may wait long on a first answer
        if not keep:
            self.send({"commit": False, "reason": why})
            return
        self.sent_commit = self.stream.send(b'{"commit": true}\n')
        if self.sent_commit:
            inflight.commit_sent(self.host_name)
            LOGGER.log(COMMANDS, "%s: run %s: commit sent", self.host_name, self.run_id)
