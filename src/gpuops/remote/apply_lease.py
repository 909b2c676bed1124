"""The client's lease on a run: the worker goes on only while gpuops keeps confirming.

For every message from gpuops the relay writes, into ``calls/ID/lease``, the moment it got it on the
host's monotonic clock (``note_beat``), and appends verdict and commit messages to
``calls/ID/inbox.jsonl``; the worker reads both here. The lease's age is that moment against the
worker's own ``time.monotonic()`` (the relay is its parent: one host, one clock), never the wall
clock against a file's mtime: a state dir on NFS or a clock step put the two apart by an hour, which
lapsed every lease at once (+1 h) or turned it off (-1 h). Stdlib only, Python 3.8+.
"""

import json
import os
import time

from gpuops.remote.apply_common import POLL_S, LeaseLapsed, StepFailed
from gpuops.remote.apply_fileops import read_complete_lines
from gpuops.remote.host_protocol import MESSAGE_ABORT as ABORT

DEFAULT_LEASE_S = 30.0
_BEAT_WIDTH = 24  # the stamp is written in place at a fixed width: a reader never sees a shorter tail


def note_beat(path):
    """The relay's side: gpuops was heard now (``time.monotonic()``), written over ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, (b"%.6f" % time.monotonic()).rjust(_BEAT_WIDTH - 1) + b"\n", 0)
    finally:
        os.close(fd)


def last_beat(path):
    """When the relay last heard gpuops (its ``time.monotonic()``), or None: no file, or a stamp
    caught half-written (the caller keeps the one it had)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(_BEAT_WIDTH)
        return float(text)
    except (OSError, ValueError):
        return None


class Lease:
    """The client's lease on this run, kept alive by its messages (the relay stamps ``lease``)."""

    def __init__(self, call_dir, seconds, deadline_s=None):
        self.call_dir = call_dir
        self.path = os.path.join(call_dir, "lease")
        self.gone_path = os.path.join(call_dir, "client_gone")
        self.inbox = os.path.join(call_dir, "inbox.jsonl")
        self.seconds = float(seconds)
        self.deadline = time.monotonic() + float(deadline_s) if deadline_s else None
        self._inbox_offset = 0
        self._abort_offset = 0
        self._abort = None
        self._heard = None  # the relay's last stamp this worker read (monotonic)

    def lapsed(self):
        """None while gpuops holds the lease, else why it lapsed (one line)."""
        if os.path.exists(self.gone_path):
            return "the connection to gpuops was lost"
        stamp = last_beat(self.path)
        if stamp is not None:
            self._heard = stamp
        age = float("inf") if self._heard is None else max(0.0, time.monotonic() - self._heard)
        if age > self.seconds:
            return "gpuops stopped confirming for %.0f s (lease %.0f s): gone, cut off or stalled" % (
                min(age, 1e6), self.seconds)
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "the run went past gpuops' time limit for this host (--timeout)"
        return None

    def aborted(self):
        """Why gpuops aborted this run (``{"abort": why}``: another node of its deployment
        failed), or None. Read from the inbox on its own, so no wait misses it."""
        if self._abort is None:
            complete, self._abort_offset = read_complete_lines(self.inbox, self._abort_offset)
            for line in complete.splitlines():
                message = _message(line)
                if message is not None and ABORT in message:
                    self._abort = str(message[ABORT] or "aborted")
        return self._abort

    def check(self, where):
        why = self.lapsed()
        if why:
            raise LeaseLapsed("%s (%s); the host was rolled back" % (why, where))
        why = self.aborted()
        if why:
            raise StepFailed("gpuops aborted the run %s: %s" % (where, why))

    def wait_message(self, key, where, abortable=True):
        """The next message from gpuops that carries ``key``; the lease (and, when ``abortable``,
        an abort) is checked meanwhile.

        The inbox is read before the lease is judged: a commit gpuops sent is its confirmation even
        when the channel closed right after it (or gpuops then went quiet), so it is never thrown away."""
        while True:
            complete, self._inbox_offset = read_complete_lines(self.inbox, self._inbox_offset)
            for line in complete.splitlines():
                message = _message(line)
                if message is not None and key in message:
                    return message
            why = self.lapsed()
            if why:
                raise LeaseLapsed("%s (%s); the host was rolled back" % (why, where))
            if abortable and self.aborted():
                raise StepFailed("gpuops aborted the run %s: %s" % (where, self.aborted()))
            time.sleep(POLL_S)


def _message(line):
    try:
        message = json.loads(line.decode("utf-8"))
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


class NoLease:
    """For work that no client waits on (recovery run by the relay after its client left)."""

    def lapsed(self):
        return None

    def check(self, where):
        return None

    def aborted(self):
        return None

    def wait_message(self, key, where, abortable=True):
        raise LeaseLapsed("nobody to confirm %s" % where)
