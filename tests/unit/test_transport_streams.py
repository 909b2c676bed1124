"""Streams belong to the transport: every connection opens its own, and transport needs nothing of apply."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuops
from gpuops.ansible_bridge import AnsibleConnection
from gpuops.transport.become import BecomeConnection
from gpuops.transport.local import LocalConnection
from gpuops.transport.openssh import OpenSSHConnection
from gpuops.transport.ssh import SSHConnection
from gpuops.transport.verbose import LoggedConnection

TRANSPORT = Path(gpuops.__file__).parent / "transport"


@pytest.mark.parametrize("cls", [LocalConnection, SSHConnection, OpenSSHConnection, BecomeConnection,
                                 LoggedConnection, AnsibleConnection])
def test_every_connection_and_wrapper_opens_its_own_stream(cls: type) -> None:
    # Its own method, not one found by __getattr__ or by a caller poking at its insides.
    assert callable(vars(cls).get("open_stream")), f"{cls.__name__} has no open_stream of its own"


def test_the_transport_package_imports_nothing_of_apply() -> None:
    for path in sorted(TRANSPORT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "gpuops.apply" or n.startswith("gpuops.apply.") for n in names), \
                f"{path.name}:{node.lineno} imports {names}"


def test_a_logged_local_connection_streams_through_its_inner_one(tmp_path: Path) -> None:
    from gpuops.inventory import load_inventory

    (tmp_path / "h.yml").write_text("all:\n  hosts: {h: {ansible_connection: local}}\n")
    host = load_inventory(str(tmp_path / "h.yml")).select(None)[0]
    stream = LoggedConnection(LocalConnection(host), 0.0).open_stream("read line; echo got $line; echo done")
    try:
        assert stream.send(b"hello\n")
        assert stream.readline(timeout=30) == b"got hello\n"
        assert stream.readline(timeout=30) == b"done\n"
        assert stream.readline(timeout=30) == b""  # the end, and it stays the end
        assert stream.readline(timeout=1) == b""
    finally:
        stream.close()


def test_ansibles_connection_says_it_cannot_stream(tmp_path: Path) -> None:
    from gpuops.errors import TransportError

    conn = AnsibleConnection(type("H", (), {"name": "a1"})(), lambda command, stdin: (0, b"", b""))
    with pytest.raises(TransportError, match="a1: .*cannot keep a command's stdin open"):
        conn.open_stream("true")
