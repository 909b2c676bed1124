"""What every transport gives: run a command with bytes on stdin, get bytes back; or open a
command as a stream that stays open while it runs.

Everything gpuops does on a host is one `run` per phase: the program to run travels on stdin, so no
file is ever copied and no second round trip is needed. apply's transaction is the one exception:
it talks to its helper while it runs (``open_stream``, ``gpuops.transport.stream``).
"""

from __future__ import annotations

import time
from dataclasses import field
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.stream import Stream


@frozen
class ExecResult:
    """The outcome of one remote (or local) command."""

    stdout: bytes
    stderr: bytes
    exit_status: int

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


@frozen
class ConnectOptions:
    """How to reach hosts; the same for every host of one command."""

    accept_new_host_keys: bool = False  # record unknown keys (never replace a changed one)
    connect_timeout: float = 10.0
    command_timeout: float | None = None  # None: no limit (benchmarks, restarts wait themselves)
    # Monotonic: no command on the connection runs past it (apply's per-host --timeout, whatever
    # step the host is at: the gather, the smoke check's prompts, the log read after the restart).
    deadline: float | None = None
    known_hosts_files: tuple[str, ...] = field(default_factory=tuple)  # extra files, besides ~/.ssh/known_hosts
    # Someone else's connection to the host (Ansible's, in the gpuops.gpu collection): when set,
    # connect() returns connector(host) and the host's connection variables are that side's business.
    connector: Callable[[Host], Connection] | None = field(default=None, compare=False)


class Connection(Protocol):
    """The one thing that talks to a host."""

    host: Host

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult: ...

    def open_stream(self, command: str) -> Stream:
        """``command`` started on the host, its stdout read as lines while its stdin stays open."""
        ...

    def close(self) -> None: ...


def command_limit(options: ConnectOptions, timeout: float | None) -> tuple[float | None, str]:
    """The seconds a command may take (its own ``timeout``, or the connection's, cut to what is
    left before ``options.deadline``) and how to say that it ran out."""
    timeout = timeout if timeout is not None else options.command_timeout
    if options.deadline is None:
        return timeout, "" if timeout is None else f"remote command timed out after {timeout:.0f} s"
    left = max(0.01, options.deadline - time.monotonic())
    if timeout is not None and timeout <= left:
        return timeout, f"remote command timed out after {timeout:.0f} s"
    return left, "the host did not finish within --timeout"
