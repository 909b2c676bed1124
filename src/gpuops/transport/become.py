"""Become: every command of a connection run through sudo, as Fabric's ``sudo`` wraps ``run``.

A host is reached with become when its ``ansible_become`` is true (``-b/--become`` makes that the
default of every host, as Ansible's ``-b`` does; a host's own value wins, as in Ansible). Then
``connect()`` hands out a ``BecomeConnection``: the gather, the helpers, the apply transaction's
channel, every command of inspect, bench, tune, apply, rollback and history goes through the same
``become_wrap``, so there is one way to run as root and nothing to remember per command.

The password (``ansible_become_password``, ``-K``, ``$GPUOPS_BECOME_PASS``) travels on stdin ahead of
the command's own input, never in argv, and never where the shell could read it as code.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING
from gpuops.transport.verbose import LoggedConnection

if TYPE_CHECKING:
    from gpuops.transport.base import Connection, ExecResult
    from gpuops.transport.stream import Stream

BECOME_MARK = "gpuops-become-stdin-starts-here"


def become_wrap(command: str, password: str | None, user: str | None = None) -> tuple[str, bytes]:
    """sudo around ``command``, and the bytes that must go on stdin before the command's own.

    sudo reads the password line only when it needs one (NOPASSWD rules skip it), so a marker line
    follows it and the shell skips everything up to the marker: either way the command's stdin
    starts exactly at its own input, and a password can never end up parsed as code.
    """
    skip = f'while IFS= read -r gpuops_l; do [ "$gpuops_l" = {BECOME_MARK} ] && break; done; {command}'
    as_user = f"-u {shlex.quote(user)} " if user else ""
    if password:
        return f"sudo -S -p '' {as_user}-- /bin/sh -c {shlex.quote(skip)}", (password + "\n" + BECOME_MARK + "\n").encode()
    return f"sudo -n {as_user}-- /bin/sh -c {shlex.quote(skip)}", (BECOME_MARK + "\n").encode()


def become_connection(conn: "Connection") -> "BecomeConnection | None":
    """The become wrapper of ``conn`` (under -v/--timings' logging wrapper), if it has one."""

    if isinstance(conn, LoggedConnection):
        conn = conn.wrapped
    return conn if isinstance(conn, BecomeConnection) else None


class BecomeConnection:
    """A connection whose every command runs under sudo (the wrapped one stays ``inner``)."""

    def __init__(self, inner: "Connection", password: str | None, user: str | None = None) -> None:
        self.inner = inner
        self.host = inner.host
        self._password = password
        self._user = user

    def wrap(self, command: str) -> tuple[str, bytes]:
        """The command as sudo runs it, and the stdin that must come first (see ``become_wrap``)."""
        return become_wrap(command, self._password, self._user)

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> "ExecResult":
        wrapped, prefix = self.wrap(command)
        return self.inner.run(wrapped, stdin=prefix + stdin, timeout=timeout)

    def open_stream(self, command: str) -> "Stream":
        # sudo around the stream's command as around any other; its stdin starts after the
        # become prefix (password line, marker), sent before anything the caller sends.
        wrapped, prefix = self.wrap(command)
        stream = self.inner.open_stream(wrapped)
        stream.send(prefix)
        return stream

    def refusal(self, result: "ExecResult") -> str | None:
        """Why sudo refused to run a command whose output shows it never ran, else None.

        Only the caller knows that its command printed nothing at all (the gather: not one probe
        frame), so it asks; then a failed exit is sudo's, and sudo's last stderr line says why
        ("wrong password", "a password is required", "user is not in the sudoers file"...)."""
        if result.exit_status == 0:
            return None
        lines = [line.strip() for line in result.stderr_text().splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {result.exit_status}"
        why = why[len("sudo: "):] if why.startswith("sudo: ") else why
        if self._password:  # sudo never echoes it; a stand-in or a wrapper script might
            why = why.replace(self._password, "***")
        return why

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:  # never the password
        return f"BecomeConnection({self.inner!r}, user={self._user!r})"
