"""The paramiko Transport gpuops builds turns Nagle's algorithm off and acknowledges every read at once
(each a ~40 ms stall otherwise: in authentication, and at the first channel's open), through public
setsockopts and the socket-like object paramiko's Transport takes; the live socket keeps its class."""

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


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_every_read_of_the_transports_socket_acknowledges_at_once(setsockopt_calls: list) -> None:
    """sshd's first channel-open confirmation waits on our ACK of its host-key packet (Nagle on its
    side): a read that leaves the ACK to the kernel's delay costs ~40 ms on every new connection."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        transport = transport_factory("127.0.0.1", "127.0.0.1", KnownHosts())(client)
        for payload in (b"SSH-2.0-test\r\n", b"hostkeys"):  # what paramiko's packetizer reads goes through transport.sock
            peer.sendall(payload)
            before = len(setsockopt_calls)
            assert transport.sock.recv(64) == payload
            assert (client, socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1) in setsockopt_calls[before:]
        assert type(client) is socket.socket
        transport.close()
    finally:
        for s in (client, peer, server):
            s.close()


def test_a_non_tcp_socket_is_left_alone(setsockopt_calls: list) -> None:
    left, right = socket.socketpair()  # what a ProxyCommand-like pipe looks like: not TCP
    try:
        transport = transport_factory("h", "h", KnownHosts())(left)
        assert type(left) is socket.socket
        right.sendall(b"x")
        assert transport.sock.recv(1) == b"x"
        assert not [c for c in setsockopt_calls if c[0] is left]  # not even a TCP_NODELAY or TCP_QUICKACK try
        transport.close()
    finally:
        left.close()
        right.close()
