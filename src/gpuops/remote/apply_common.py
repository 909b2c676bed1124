"""What every part of the host-side apply transaction shares: its failures and its clock.

Stdlib only, Python 3.8+; bundled with ``apply_helper`` (see ``bundle.py``).
"""

import time

POLL_S = 0.1  # how often the worker and the relay look at their files while they wait


class StepFailed(Exception):
    """A step of the run failed; the message says which and why (one line); log_tail: the server's."""

    def __init__(self, message, log_tail=None):
        Exception.__init__(self, message)
        self.log_tail = log_tail


class LeaseLapsed(StepFailed):
    """gpuops stopped confirming (gone, cut off, stalled or over its time): the run must not go on."""


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
