"""The client's lease on a run: the worker goes on only while gpuops keeps confirming.

The relay touches ``calls/ID/lease`` for every message from gpuops and appends verdict and commit
messages to ``calls/ID/inbox.jsonl``; the worker reads both here. Stdlib only, Python 3.8+.
"""

import json
import os
import time

from gpuops.remote.apply_common import POLL_S, LeaseLapsed, StepFailed
from gpuops.remote.apply_fileops import read_complete_lines
from gpuops.remote.host_protocol import MESSAGE_ABORT as ABORT

DEFAULT_LEASE_S = 30.0


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
        self._abort_offset = 0
        self._abort = None

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
