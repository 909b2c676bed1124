"""TCP tuning for the SSH connections gpuops makes through paramiko.

Socket options, not host keys: called where the paramiko Transport is built
(``known_hosts.transport_factory``), kept apart from the known_hosts reader.
"""

from __future__ import annotations

import functools
from typing import Any


def no_delay(sock: Any) -> None:
    """Stop TCP's small-packet delays on a connection's socket (a ProxyCommand's pipe is left alone).

    SSH trades small packets that wait on each other. Two delays meet there, each ~40 ms on every
    connection: with Nagle's algorithm on (paramiko leaves it on), our small write that follows
    an unacknowledged one waits for the server's delayed ACK (user authentication); and the
    server's Nagle holds its channel-open confirmation until we acknowledge its previous packet,
    which Linux delays. So: TCP_NODELAY, and on Linux an immediate ACK after every read
    (TCP_QUICKACK is not sticky, hence per read: one cheap setsockopt).
    """
    import socket

    if type(sock) is not socket.socket or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return  # only a speed-up: a socket that refuses it still works
    if hasattr(socket, "TCP_QUICKACK"):
        sock.__class__ = _quick_ack_socket_class()


@functools.cache  # one class for every connection
def _quick_ack_socket_class() -> type:
    import socket

    class QuickAckSocket(socket.socket):
        __slots__ = ()  # same layout as socket.socket: an open socket can take this class

        def recv(self, bufsize: int, flags: int = 0) -> bytes:
            data = super().recv(bufsize, flags)
            try:
                self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            except OSError:
                pass
            return data

    return QuickAckSocket
