"""Errors a user can cause and read: each carries one line that names the file or host and the problem.

The CLI turns a ``GpuopsError`` into ``gpuops: error: <message>`` and exit status 2, never a traceback.
"""

from __future__ import annotations


class GpuopsError(Exception):
    """A user-facing error: bad input, unreachable host, refused change. One line, no traceback."""

    exit_status = 2


class InventoryError(GpuopsError):
    """The inventory (or a vars file) cannot be read: names the file and the problem."""


class TransportError(GpuopsError):
    """A host cannot be reached or refused us (connection, auth, host key). Fails that host only."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message
