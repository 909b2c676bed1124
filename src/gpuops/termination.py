"""SIGTERM and SIGHUP end gpuops the way Ctrl-C does.

A closed terminal (SIGHUP) or a killed CI job (SIGTERM) used to end gpuops silently while the hosts
rolled back on their own: the operator never learnt which run was where. Both now raise
``Terminated`` (a ``KeyboardInterrupt``) in the main thread, so every path that handles Ctrl-C
handles them too: apply and rollback print, per host, the run, its step, what the host does now and
the command to check (``apply/inflight.py``, printed by ``cli.py``), tune puts the hosts back, bench
brings home what was measured. The exit status is 128 + the signal's number (SIGTERM 143, SIGHUP
129; Ctrl-C keeps its 130), also when the command finished its own wrap-up after the signal.
"""

from __future__ import annotations

import signal
from types import FrameType

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
CTRL_C_STATUS = 128 + signal.SIGINT  # 130, as a shell reports a process ended by SIGINT

_received: list[int] = []  # the ending signals this process got, first first
_interrupts: list[int] = []  # every interrupt (Ctrl-C too), first first: a command that took one as its
                             # stop (bench) still lets the command around it (tune) end


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    _interrupts.append(signum)
    raise Terminated(signum)


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _interrupts.append(signum)
    raise KeyboardInterrupt


def install() -> dict[int, object]:
    """SIGTERM and SIGHUP raise ``Terminated`` from now on; the handlers they had (for ``restore``).
    Outside the main thread (gpuops embedded in another program) nothing changes."""
    previous: dict[int, object] = {}
    for sig in ENDING_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:
            return previous
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT stays ignored
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_ctrl_c)
    return previous


def restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned


def received() -> int | None:
    """The first ending signal this process got, or None."""
    return _received[0] if _received else None


def interrupted() -> int | None:
    """The first interrupt this process got (SIGINT, SIGTERM or SIGHUP), or None."""
    return _interrupts[0] if _interrupts else None


def raise_if_interrupted() -> None:
    """Raise again an interrupt that a step took as its own stop (bench keeps what was measured),
    so that the command around it ends too."""
    signum = interrupted()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum is not None:
        raise Terminated(signum)


def ending_line() -> str:
    """What gpuops says last when it is ended: ``interrupted`` (Ctrl-C) or ``terminated by SIGTERM``."""
    signum = received()
    return "gpuops: interrupted" if signum is None else f"gpuops: terminated by {signal.Signals(signum).name}"


def exit_status() -> int:
    """128 + the ending signal's number (Ctrl-C: 130)."""
    signum = received()
    return CTRL_C_STATUS if signum is None else 128 + signum
