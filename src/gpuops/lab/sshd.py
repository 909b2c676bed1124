"""Real OpenSSH servers for lab hosts: host keys, sshd_config, start on a free port, stop.

Each lab host is a ``/usr/sbin/sshd -D`` run as the invoking user on 127.0.0.1 with its own host key
and config; nothing is written outside the lab directory (except ``/run/sshd``, the privilege
separation directory OpenSSH insists on when run as root, created like its own service does).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping

from gpuops.errors import GpuopsError
from gpuops.lab.ports import free_port, free_ports  # noqa: F401  (here too: the lab's callers say sshd.free_port)
from gpuops.frozen import frozen

SSHD = Path("/usr/sbin/sshd")
INSTALL_HINT = "apt-get install -y openssh-server"
PRIVSEP_DIR = Path("/run/sshd")
_START_TIMEOUT_S = 15.0
_PORT_ATTEMPTS = 5


@frozen
class SshdProcess:
    pid: int
    port: int


def require_openssh() -> None:
    """One clear line when the OpenSSH server or client tools are missing."""
    if not os.access(SSHD, os.X_OK):
        raise GpuopsError(f"lab: {SSHD} not found: install OpenSSH's server ({INSTALL_HINT})")
    for tool in ("ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            raise GpuopsError(f"lab: {tool} not found: install OpenSSH ({INSTALL_HINT} openssh-client)")


def ensure_privsep_dir() -> None:
    # sshd run as root refuses to start without it; run as another user it is not needed.
    if os.geteuid() != 0 or PRIVSEP_DIR.is_dir():
        return
    try:
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuopsError(f"lab: sshd needs {PRIVSEP_DIR} and it cannot be created: {exc}") from None


def generate_key(path: Path, comment: str) -> None:
    """An ed25519 key pair at ``path`` / ``path.pub`` made by ssh-keygen (no passphrase)."""
    done = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise GpuopsError(f"lab: ssh-keygen {path} failed: {done.stderr.strip()}")


def _quoted(value: str) -> str:
    # sshd_config takes double-quoted arguments; lab paths are checked to hold no quote or %.
    return f'"{value}"'


def sshd_config_text(
    port: int,
    host_key: Path,
    pid_file: Path,
    authorized_keys: Path,
    session_env: Mapping[str, str],
) -> str:
    setenv = " ".join(_quoted(f"{k}={v}") for k, v in session_env.items())
    return "\n".join(
        [
            "# sshd for one gpuops lab host (generated; see gpuops/lab/sshd.py)",
            "ListenAddress 127.0.0.1",
            f"Port {port}",
            f"HostKey {_quoted(str(host_key))}",
            f"PidFile {_quoted(str(pid_file))}",
            f"AuthorizedKeysFile {_quoted(str(authorized_keys))}",
            # The lab dir belongs to the user and may be group-writable; skip the owner checks.
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            # The session environment makes this a simulated host: its own PATH (nvidia-smi,
            # python-sglang), HOME and the SGLang site on PYTHONPATH.
            f"SetEnv {setenv}",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            # Many hosts x parallel sessions in tests: no throttling of concurrent handshakes.
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel INFO",
            "",
        ]
    )


def start_sshd(config: Path, log: Path, port: int, pid_file: Path, env: Mapping[str, str] | None = None) -> SshdProcess:
    """Start ``sshd -D -f config`` detached and wait until it has bound ``port``.

    sshd writes its pid file only once its listening socket is bound, so a pid file holding our
    child's pid proves the port is ours (a bare connect could reach whoever took the port).
    Raises ``PortTaken`` when sshd exits at start-up because the port was grabbed meanwhile.
    """
    pid_file.unlink(missing_ok=True)
    with open(log, "ab") as log_handle:
        child = subprocess.Popen(
            [str(SSHD), "-D", "-f", str(config), "-E", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=dict(env) if env is not None else None,
        )
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = child.poll()
        if status is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            if "Address already in use" in text or "Cannot bind any address" in text:
                raise PortTaken(port)
            last = (text.strip().splitlines() or [f"exit status {status}"])[-1]
            raise GpuopsError(f"lab: sshd ({config}) did not start: {last}")
        if _pid_in(pid_file) == child.pid and _accepts(port):
            return SshdProcess(pid=child.pid, port=port)
        time.sleep(0.01)
    child.kill()
    raise GpuopsError(f"lab: sshd ({config}) did not listen on 127.0.0.1:{port} within {_START_TIMEOUT_S:.0f} s")


class PortTaken(Exception):
    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} taken")
        self.port = port


def _pid_in(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start_with_free_port(
    write_config,
    config: Path,
    log: Path,
    pid_file: Path,
    env: Mapping[str, str] | None = None,
    first_port: int | None = None,
) -> SshdProcess:
    """Write the config for a port (``write_config(port)``) and start; on a port taken meanwhile
    by someone else, retry with another. ``first_port``: the port to try first."""
    last: PortTaken | None = None
    for attempt in range(_PORT_ATTEMPTS):
        port = first_port if attempt == 0 and first_port else free_port()
        write_config(port)
        try:
            return start_sshd(config, log, port, pid_file, env)
        except PortTaken as exc:
            last = exc
    raise GpuopsError(f"lab: no free port for sshd after {_PORT_ATTEMPTS} tries ({last})")


def host_key_line(port: int, public_key_file: Path) -> str:
    """The known_hosts line for a non-22 port: ``[127.0.0.1]:PORT ssh-ed25519 AAAA...``."""
    key_type, key_data = public_key_file.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {key_type} {key_data}"
