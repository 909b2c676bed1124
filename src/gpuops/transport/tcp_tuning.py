"""TCP tuning for the SSH connections gpuops makes through paramiko.

Socket options, not host keys: applied where the paramiko Transport is built
(``known_hosts.transport_factory``), kept apart from the known_hosts reader.
"""

from __future__ import annotations

import socket
from typing import Any


def tuned(sock: Any) -> Any:
    """The socket paramiko's Transport is given for a connection: a TCP socket with Nagle's algorithm
    off, read through ``QuickAckSocket`` where the system has TCP_QUICKACK (Linux); anything else (a
    ProxyCommand's pipe, a jump host's channel) unchanged and untouched."""
    if type(sock) is not socket.socket or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock
    try:
        # SSH trades small packets that wait on each other: with Nagle on (paramiko leaves it on),
        # our small write that follows an unacknowledged one waits for the server's delayed ACK
        # (~40 ms, in user authentication).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return sock  # only a speed-up: a socket that refuses it still works
    return QuickAckSocket(sock) if hasattr(socket, "TCP_QUICKACK") else sock


class QuickAckSocket:
    """A connection's TCP socket that acknowledges what it reads at once (TCP_QUICKACK after every
    read); every other call goes to the socket itself. paramiko's Transport takes any "socket-like
    object" (its documented ``sock``), so this is what it reads through; the socket keeps its class.

    Why: right after authentication sshd sends its host keys (``hostkeys-00@openssh.com``, a packet
    that wants no answer) and then the confirmation of the first channel the client opened. sshd
    leaves Nagle on for a session without a terminal, so the confirmation waits in the host's kernel
    until the host-key packet is acknowledged, and Linux delays that ACK ~40 ms (the connection is in
    its "interactive" mode by then). Measured on the lab (OpenSSH 9.2, loopback, paramiko 5.1, median
    of 9 new connections): the first ``open_session`` 42.6 ms, 1.0 ms through this; every later one
    0.2 ms either way. That is a tenth of a no-op apply's wall time. A setsockopt is ~1 us a read.
    (gpuops once got this by swapping the live socket's class; this is the public form of it.)
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass  # a closed socket: the next read says so
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)
