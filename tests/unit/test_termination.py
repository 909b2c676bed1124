"""termination.py in this process: SIGTERM and SIGHUP raise Terminated (a KeyboardInterrupt, so every
Ctrl-C path handles them), the exit status is 128 + the signal, and the handlers go back as they were.
(The real client, signalled as a user's shell or CI does: tests/integration/test_client_signals.py.)"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpuops import termination


@pytest.fixture
def installed():
    termination._received.clear()
    termination._interrupts.clear()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    previous = termination.install()
    try:
        yield
    finally:
        termination.restore(previous)
        assert {s: signal.getsignal(s) for s in before} == before
        termination._received.clear()
        termination._interrupts.clear()


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_an_ending_signal_is_a_keyboard_interrupt_naming_it(installed, sig, status) -> None:
    with pytest.raises(KeyboardInterrupt) as raised:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # not reached: the handler raises at once
    assert isinstance(raised.value, termination.Terminated) and raised.value.signum == sig
    assert termination.received() == sig and termination.interrupted() == sig
    assert termination.exit_status() == status
    assert termination.ending_line() == f"gpuops: terminated by {sig.name}"
    with pytest.raises(termination.Terminated):
        termination.raise_if_interrupted()


def test_ctrl_c_stays_ctrl_c(installed) -> None:
    with pytest.raises(KeyboardInterrupt) as raised:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert not isinstance(raised.value, termination.Terminated)
    assert termination.received() is None and termination.interrupted() == signal.SIGINT
    assert termination.exit_status() == 130 and termination.ending_line() == "gpuops: interrupted"
    with pytest.raises(KeyboardInterrupt):
        termination.raise_if_interrupted()
