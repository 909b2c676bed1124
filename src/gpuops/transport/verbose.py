"""-v/-vv/-vvv: what gpuops does on each host, on stderr, as Ansible's verbosity shows it.

    -v     each remote command (the command line; programs travel on stdin and are not shown);
           in apply/rollback each step of a host's run once gpuops knows it (``apply/txn.py``)
    -vv    + timings: connect, and each command's duration, exit status and bytes moved
    -vvv   + the raw output of each command (stdout and stderr, secrets of the host's vars masked)

Records go through the ``gpuops.transport`` logger; ``configure(verbosity)`` attaches the stderr
handler once per command line. paramiko's own logger goes the same way: shown from -v on (its
warnings and errors; everything at -vvv), never otherwise. Without that, Python's last-resort
handler printed paramiko's traceback for a host that resets the connection during the banner, above
gpuops' one line about that host.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any
from gpuops import timings
from gpuops.secret_policy import mask_text, secret_values

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.base import Connection, ExecResult
    from gpuops.transport.stream import Stream

LOGGER = logging.getLogger("gpuops.transport")
PARAMIKO = logging.getLogger("paramiko")
COMMANDS, TIMINGS, RAW = logging.INFO, 15, logging.DEBUG
_RAW_LIMIT = 100_000  # characters of each stream shown at -vvv
_COMMAND_LIMIT = 400


class NoTracebacks(logging.Filter):
    """paramiko's transport thread logs an exception it ends on in two records and then its traceback
    line by line (``Transport._log(ERROR, util.tb_strings())``): the line before it already says what
    failed ("Exception (client): Error reading SSH protocol banner"), so -v shows that and drops the
    traceback (a stalled host's handshake printed one). Per thread: the lines are logged in a row."""

    _CHAINED = ("During handling of the above exception", "The above exception was the direct cause")

    def __init__(self) -> None:
        super().__init__()
        self._state: dict[int | None, str] = {}  # thread -> "body" (frames) or "tail" (after its last line)

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        state = self._state.get(record.thread)
        if text.startswith("Traceback (most recent call last)"):
            self._state[record.thread] = "body"
            return False
        if state == "body":
            if not (text == "" or text.startswith(" ") or text.startswith(self._CHAINED)):
                self._state[record.thread] = "tail"  # the exception's own line: the traceback's last
            return False
        if state == "tail":
            if text == "" or text.startswith(self._CHAINED):
                return False
            del self._state[record.thread]
        return True


def quiet_paramiko() -> None:
    """paramiko's records go nowhere unless -v routed them (a NullHandler keeps Python's last-resort
    handler, which prints a traceback to stderr, from ever taking them)."""
    if not PARAMIKO.handlers:
        PARAMIKO.addHandler(logging.NullHandler())
    PARAMIKO.propagate = False


def configure(verbosity: int) -> None:
    quiet_paramiko()
    if verbosity <= 0:
        return
    level = {1: COMMANDS, 2: TIMINGS}.get(verbosity, RAW)
    LOGGER.setLevel(level)
    PARAMIKO.setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
    for logger, shape in ((LOGGER, "%(message)s"), (PARAMIKO, "%(name)s: %(message)s")):
        if not any(getattr(h, "gpuops_verbose", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(shape))
            if logger is PARAMIKO:
                handler.addFilter(NoTracebacks())
            handler.gpuops_verbose = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
    LOGGER.propagate = False


def enabled() -> bool:
    return LOGGER.isEnabledFor(COMMANDS)


class LoggedConnection:
    """A connection that reports what it runs (only made when -v is given)."""

    def __init__(self, inner: Connection, connect_seconds: float) -> None:
        self._inner = inner
        self.wrapped = inner  # what it logs for (become_connection asks whether that is become)
        self.host: Host = inner.host
        LOGGER.log(TIMINGS, "%s: connected in %.3f s", self.host.name, connect_seconds)

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        shown = command if len(command) <= _COMMAND_LIMIT else command[:_COMMAND_LIMIT] + f"... ({len(command)} chars)"
        LOGGER.log(COMMANDS, "%s: exec %s (%d bytes on stdin)", self.host.name, shown, len(stdin))

        started = time.monotonic()
        try:
            result = self._inner.run(command, stdin=stdin, timeout=timeout)
        except Exception as exc:
            LOGGER.log(TIMINGS, "%s: failed after %.3f s: %s", self.host.name, time.monotonic() - started, exc)
            raise
        finally:
            timings.record("exec", started, time.monotonic(), self.host.name)
        LOGGER.log(TIMINGS, "%s: exit %d in %.3f s (%d bytes out, %d bytes err)", self.host.name, result.exit_status,
                   time.monotonic() - started, len(result.stdout), len(result.stderr))
        if LOGGER.isEnabledFor(RAW):
            secrets = _secrets(self.host)
            for name, data in (("stdout", result.stdout_text()), ("stderr", result.stderr_text())):
                if data:
                    LOGGER.log(RAW, "%s: %s:\n%s", self.host.name, name, _masked(data[:_RAW_LIMIT], secrets)
                               + ("\n... (cut)" if len(data) > _RAW_LIMIT else ""))
        return result

    def open_stream(self, command: str) -> Stream:
        # Logged by its caller when it ends (log_stream): a stream has no single exit to time here.
        return self._inner.open_stream(command)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else a caller reaches for (settings, ...)
        return getattr(self._inner, name)


def log_stream(host_name: str, command: str, stdin_bytes: int, seconds: float, outcome: str) -> None:
    """A command run on a channel of its own (apply's transaction), not through ``run``."""
    shown = command if len(command) <= _COMMAND_LIMIT else command[:_COMMAND_LIMIT] + f"... ({len(command)} chars)"
    LOGGER.log(COMMANDS, "%s: exec %s (%d bytes on stdin, transaction channel)", host_name, shown, stdin_bytes)
    LOGGER.log(TIMINGS, "%s: transaction %s in %.3f s", host_name, outcome, seconds)


def _secrets(host: Host) -> list[str]:
    return secret_values(dict(host.vars or {}))


def _masked(text: str, secrets: list[str]) -> str:
    return mask_text(text, secrets)
