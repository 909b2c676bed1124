"""TCP tuning for the SSH connections gpuops makes through paramiko.

Socket options, not host keys: called where the paramiko Transport is built
(``known_hosts.transport_factory``), kept apart from the known_hosts reader.
"""

from __future__ import annotations

from typing import Any


def no_delay(sock: Any) -> None:
    """Turn Nagle's algorithm off on a connection's TCP socket (a ProxyCommand's pipe is left alone).

    SSH trades small packets that wait on each other: with Nagle on (paramiko leaves it on), our
    small write that follows an unacknowledged one waits for the server's delayed ACK (~40 ms, in
    user authentication). One public setsockopt. (An immediate ACK after every read, TCP_QUICKACK,
    would need a hook into every recv of paramiko's; gpuops once swapped the live socket's class
    for it, and dropped that: benchmarks/README.md records what it bought.)
    """
    import socket

    if type(sock) is not socket.socket or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return  # only a speed-up: a socket that refuses it still works
