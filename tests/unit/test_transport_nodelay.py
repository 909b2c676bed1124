"""The paramiko Transport gpuops builds turns Nagle off on TCP (the ~40 ms delayed-ACK stall in auth)."""

from __future__ import annotations

import socket

from gpuops.transport.known_hosts import KnownHosts, transport_factory


def test_tcp_socket_gets_nodelay() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        transport = transport_factory("127.0.0.1", "127.0.0.1", KnownHosts())(client)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        transport.close()
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_non_tcp_socket_is_left_alone() -> None:
    left, right = socket.socketpair()  # what a ProxyCommand-like pipe looks like: not TCP
    try:
        transport = transport_factory("h", "h", KnownHosts())(left)
        transport.close()
    finally:
        left.close()
        right.close()
