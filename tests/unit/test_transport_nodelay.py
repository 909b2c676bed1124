"""The paramiko Transport gpuops builds turns Nagle's algorithm off (~40 ms stalls), with a public setsockopt."""

from __future__ import annotations

import socket

import pytest

from gpuops.transport.known_hosts import KnownHosts, transport_factory


@pytest.fixture
def setsockopt_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, int, int, int]]:
    """Every setsockopt made on any socket while the test runs, as (socket, level, option, value);
    the real call still happens."""
    calls: list[tuple[object, int, int, int]] = []
    real = socket.socket.setsockopt

    def spy(self, level, option, value, *rest):  # type: ignore[no-untyped-def]
        calls.append((self, level, option, value))
        return real(self, level, option, value, *rest)

    monkeypatch.setattr(socket.socket, "setsockopt", spy)
    return calls


def test_tcp_socket_gets_nodelay() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        transport = transport_factory("127.0.0.1", "127.0.0.1", KnownHosts())(client)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert type(client) is socket.socket  # the live socket keeps its class (nothing swapped under paramiko)
        peer.sendall(b"SSH-2.0-test\r\n")
        assert client.recv(64) == b"SSH-2.0-test\r\n"
        transport.close()
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_non_tcp_socket_is_left_alone(setsockopt_calls: list) -> None:
    left, right = socket.socketpair()  # what a ProxyCommand-like pipe looks like: not TCP
    try:
        transport = transport_factory("h", "h", KnownHosts())(left)
        assert type(left) is socket.socket
        assert not [c for c in setsockopt_calls if c[0] is left]  # not even a TCP_NODELAY try
        right.sendall(b"x")
        assert left.recv(1) == b"x"
        transport.close()
    finally:
        left.close()
        right.close()
