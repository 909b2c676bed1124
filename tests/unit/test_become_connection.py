"""Become as a wrapper of the connection (transport/become.py): who gets it, and that a command run
through it sees exactly its own stdin, with a real /bin/sh and a stand-in sudo on PATH (the lab's
sshd tests are tests/integration/test_become.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from labtools import fake_sudo_bin

from gpuops.inventory import load_inventory
from gpuops.inventory.loader import InventorySpec
from gpuops.transport import ConnectOptions, connect
from gpuops.transport.become import BecomeConnection
from gpuops.transport.local import LocalConnection

SECRET = "s3cr3t 'pw' $(touch pwned) `touch pwned2`"


@pytest.fixture
def sudo(tmp_path: Path, monkeypatch) -> Path:
    bin_dir = fake_sudo_bin(tmp_path)
    log = tmp_path / "sudo.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SUDO_PASSWORD", SECRET)
    monkeypatch.setenv("FAKE_SUDO_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    return log


def local_hosts(tmp_path: Path, text: str, **defaults) -> list:
    path = tmp_path / "inv.yml"
    path.write_text(text)
    return list(load_inventory(InventorySpec((str(path),), defaults=defaults)).hosts)


def test_connect_wraps_exactly_the_hosts_that_become(tmp_path: Path) -> None:
    plain, becomes, refuses = local_hosts(tmp_path, "all:\n  vars: {ansible_connection: local}\n  hosts:\n"
                                                    "    plain:\n    becomes: {ansible_become: true}\n"
                                                    "    refuses: {ansible_become: false}\n",
                                          ansible_become=False)
    assert isinstance(connect(plain, ConnectOptions()), LocalConnection)
    assert isinstance(connect(becomes, ConnectOptions()), BecomeConnection)
    # -b is every host's default; a host's own ansible_become: false wins, as in Ansible
    on = local_hosts(tmp_path, "all:\n  vars: {ansible_connection: local}\n  hosts:\n"
                               "    plain:\n    refuses: {ansible_become: false}\n", ansible_become=True)
    assert [type(connect(h, ConnectOptions())).__name__ for h in on] == ["BecomeConnection", "LocalConnection"]
    assert "pw" not in repr(connect(on[0], ConnectOptions()))


def test_the_default_local_host_takes_b_too() -> None:
    (host,) = load_inventory(InventorySpec((), defaults={"ansible_become": True, "ansible_user": "x"})).hosts
    assert host.vars["ansible_become"] is True and "ansible_user" not in host.vars
    assert isinstance(connect(host, ConnectOptions()), BecomeConnection)


@pytest.mark.parametrize("asks", ["1", "0"])  # sudo that wants the password, and a NOPASSWD rule
def test_a_command_through_become_sees_exactly_its_own_stdin(sudo: Path, tmp_path: Path, monkeypatch, asks) -> None:
    monkeypatch.setenv("FAKE_SUDO_ASKS", asks)
    (host,) = local_hosts(tmp_path, "all:\n  hosts:\n    h: {ansible_connection: local, ansible_become: true}\n",
                          ansible_become_password=SECRET)
    conn = connect(host, ConnectOptions())
    data = b"first line\n" + bytes(range(256)) + b"\nno newline at the end"
    done = conn.run("cat", stdin=data)
    assert done.exit_status == 0, done.stderr_text()
    assert done.stdout == data
    assert sudo.read_text() == "call\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_a_wrong_password_fails_the_command_and_runs_nothing(sudo: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SUDO_ASKS", "1")
    conn = BecomeConnection(LocalConnection(local_hosts(tmp_path, "all:\n  hosts: {h: {ansible_connection: local}}\n")[0]),
                            "not it")
    done = conn.run("touch ran")
    assert done.exit_status == 1 and "sudo: wrong password" in done.stderr_text()
    assert not (tmp_path / "ran").exists() and not sudo.exists()


def test_the_transaction_channel_goes_through_become_too(sudo: Path, tmp_path: Path, monkeypatch) -> None:
    """apply's transaction is a stream (conn.open_stream), not conn.run: it must be wrapped the same way."""
    from gpuops.transport.verbose import LoggedConnection

    monkeypatch.setenv("FAKE_SUDO_ASKS", "1")
    host = local_hosts(tmp_path, "all:\n  hosts: {h: {ansible_connection: local}}\n")[0]
    conn = LoggedConnection(BecomeConnection(LocalConnection(host), SECRET), 0.0)  # as -v wraps it
    stream = conn.open_stream("cat")
    try:
        assert stream.send(b"hello\n")
        assert stream.readline(timeout=30) == b"hello\n"
    finally:
        stream.close()
    assert sudo.read_text() == "call\n"


def _probe(name: str, script: str):
    from gpuops.gather import Probe

    return Probe(name, script, lambda out: out.stdout.strip())


def test_a_gather_that_sudo_refused_fails_the_host_in_one_line(sudo: Path, tmp_path: Path, monkeypatch) -> None:
    """Not one probe ran: the host fails with sudo's reason (never every fact "unknown"), also under
    -v's logging wrapper, and the password is never in the message."""
    from gpuops.errors import TransportError
    from gpuops.gather import gather
    from gpuops.transport.verbose import LoggedConnection

    monkeypatch.setenv("FAKE_SUDO_ASKS", "1")
    host = local_hosts(tmp_path, "all:\n  hosts: {h: {ansible_connection: local}}\n")[0]
    for conn in (BecomeConnection(LocalConnection(host), "not it"),
                 LoggedConnection(BecomeConnection(LocalConnection(host), "not it"), 0.0)):
        with pytest.raises(TransportError) as refused:
            gather(conn, [_probe("a", "echo A"), _probe("b", "echo B")])
        assert str(refused.value) == "h: sudo refused: wrong password"
    assert not sudo.exists()
    # the right password: the same gather answers
    values = gather(BecomeConnection(LocalConnection(host), SECRET), [_probe("a", "echo A"), _probe("b", "echo B")])
    assert values == {"a": "A", "b": "B"}


def test_a_partial_gather_through_sudo_stays_partial(sudo: Path, tmp_path: Path, monkeypatch) -> None:
    """The script ran, then died: what came back is kept, the rest is unknown with why, as without sudo."""
    from gpuops.gather import ProbeFailure, gather

    monkeypatch.setenv("FAKE_SUDO_ASKS", "1")
    host = local_hosts(tmp_path, "all:\n  hosts: {h: {ansible_connection: local}}\n")[0]
    values = gather(BecomeConnection(LocalConnection(host), SECRET),
                    [_probe("a", "echo A"), _probe("b", "echo dying >&2; kill -9 $$ ; kill -9 $PPID")])
    assert values["a"] == "A"
    assert isinstance(values["b"], ProbeFailure)
