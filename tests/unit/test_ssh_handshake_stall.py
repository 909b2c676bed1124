"""A host that accepts the TCP connection and then stalls (its sshd stopped mid-handshake, a
half-dead box) is failed within --connect-timeout, at whichever step it stalls: before its banner,
or in authentication. paramiko's own default waits 30 s for authentication (the auth case took
30.1 s without the bound); a whole run saw an apply with `--timeout 20` end 30.1 s after its host's
sshd session was stopped (`test_stalled_session[gather]`, twice). Real loopback TCP, and a real SSH
server (paramiko's) whose authentication never answers."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from gpuops.errors import TransportError
from gpuops.inventory import Host
from gpuops.transport import ConnectOptions, connect, verbose

CONNECT_TIMEOUT = 2.0


class _AuthNeverAnswers(paramiko.ServerInterface):
    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.release.wait(60)  # the server's transport thread: no answer goes out meanwhile
        return paramiko.AUTH_FAILED


@pytest.fixture(autouse=True)
def _verbose_logging_restored():
    """-v's logging is process-wide (verbose.configure): put it back for the tests after these."""
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate)
             for logger in (verbose.LOGGER, verbose.PARAMIKO)]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture(params=["banner", "auth"])
def stalling_host(request: pytest.FixtureRequest, tmp_path: Path):
    server = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()
    held: list[object] = []

    def serve() -> None:
        conn, _ = server.accept()
        held.append(conn)
        if request.param == "banner":
            release.wait(60)  # accepted, never a banner
            return
        transport = paramiko.Transport(conn)
        held.append(transport)
        transport.add_server_key(paramiko.Ed25519Key.from_private_key_file(str(host_key)))
        transport.start_server(server=_AuthNeverAnswers(release))

    host_key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield request.param, server.getsockname()[1]
    release.set()
    for item in held:
        item.close()  # type: ignore[attr-defined]
    server.close()


def test_a_host_that_stalls_mid_handshake_fails_within_the_connect_timeout(stalling_host, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """And under -v, paramiko's own line says why, without the traceback its transport thread logs
    after it (a whole run's `test_stalled_session[gather]` printed one once the banner wait was bounded)."""
    step, port = stalling_host
    verbose.configure(1)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = tmp_path / "client_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = Host(name="stalls", address="127.0.0.1", port=port, user="root", key_file=str(key),
                connection="ssh", groups=(), vars={})
    started = time.monotonic()
    with pytest.raises(TransportError) as failed:
        connect(host, ConnectOptions(connect_timeout=CONNECT_TIMEOUT, accept_new_host_keys=True)).close()
    took = time.monotonic() - started
    assert took < CONNECT_TIMEOUT + 5, f"{step}: failed after {took:.1f} s, not within the {CONNECT_TIMEOUT:.0f} s connect timeout"
    assert "stalls" in str(failed.value) and "\n" not in str(failed.value).strip(), str(failed.value)
    time.sleep(0.2)  # paramiko's transport thread logs as it ends
    err = capfd.readouterr().err
    assert "Traceback" not in err and "File \"" not in err, err
    if step == "banner":
        assert "Error reading SSH protocol banner" in err, err
