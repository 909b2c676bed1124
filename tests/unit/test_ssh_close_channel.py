"""A timed-out command's channel is closed from a thread of its own (transport/ssh.py). When the
connection is gone by then (the client closed it, or the host dropped it), paramiko's close raises
EOFError or OSError; that close has nothing left to do, and no thread traceback reaches stderr.
(Seen in a whole run: `test_refused_and_slow_hosts_fail_alone` closed its connection while the
slow host's close-channel thread still ran, and pytest reported the thread's EOFError.)"""

from __future__ import annotations

import threading

import pytest

from gpuops.transport.ssh import _close_without_waiting


class _ConnectionGone:
    """A channel whose connection is gone: its close raises as paramiko's does then."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.close_called = False

    def close(self) -> None:
        self.close_called = True
        raise self.error


@pytest.mark.parametrize("error", [EOFError(), OSError(9, "Bad file descriptor")], ids=["eof", "oserror"])
def test_a_close_that_finds_the_connection_gone_prints_no_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                    error: BaseException) -> None:
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    channel = _ConnectionGone(error)
    _close_without_waiting(channel).join(10)
    assert channel.close_called and uncaught == []
