"""The second transport: OpenSSH's own ``ssh`` client (``gpuops_connection: openssh`` or ``--connection openssh``).

For what paramiko cannot do, or does slowly: everything in ``~/.ssh/config`` is OpenSSH's to honour
(``Match``, certificates, GSSAPI, ``@cert-authority``/``@revoked``, agents, FIDO keys...), the
inventory's ``ansible_ssh_*_args`` go to it verbatim, and connections are shared through
``ControlMaster``/``ControlPersist``: the first command to a host opens a master, every later one
within the persist window (``gpuops_control_persist``, default 60 s) reuses it and skips the
handshake. The contract is the same as paramiko's: one ``ssh`` per command, the program on stdin.

Host keys stay verified: ``StrictHostKeyChecking=yes`` (``accept-new`` with
``--accept-new-host-keys``) overrides any laxer setting, and ``BatchMode=yes`` keeps ssh from ever
asking on a terminal.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from typing import TYPE_CHECKING

from gpuops.errors import TransportError
from gpuops.transport.base import ConnectOptions, ExecResult, command_limit
from gpuops.transport.limits import OutputOverLimit, run_bounded
from gpuops.transport.connvars import ssh_settings
from gpuops.transport.stream import ProcessStream

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.stream import Stream

DEFAULT_PERSIST = "60s"
CONTROL_DIR_ENV = "GPUOPS_SSH_CONTROL_DIR"
# ssh exits 255 for its own failures; these stderr lines say it was ssh, not the remote command.
_SSH_FAILURE = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|Permission denied|Connection refused|"
    r"Could not resolve hostname|Connection timed out|No route to host|Connection closed by|kex_exchange_identification|"
    r"Bad configuration option|Unsupported option|ssh: connect to host|ProxyCommand|Connection reset|"
    r"Too many authentication failures|REVOKED|certificate", re.IGNORECASE)
_SAFE_WORD = re.compile(r'^[^\s"]+$')


def control_dir() -> str:
    """Where the master sockets live: short (a unix socket path has ~100 bytes), ours alone (0700)."""
    path = os.environ.get(CONTROL_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"gpuops-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise TransportError("openssh", f"{path} must be a directory only you can use (for ssh control sockets)")
    return path


class OpenSSHConnection:
    def __init__(self, host: Host, options: ConnectOptions) -> None:
        self.host = host
        self.options = options
        settings = ssh_settings(host, openssh=True)  # refuses what weakens host keys; OpenSSH reads the rest
        if settings.password is not None:
            raise TransportError(host.name, "ansible_password needs the paramiko connection "
                                            "(the openssh connection authenticates with keys, agents or certificates)")
        ssh = shutil.which("ssh")
        if ssh is None:
            raise TransportError(host.name, "the openssh connection needs OpenSSH's ssh client on PATH")
        self._ssh: str = ssh
        self._argv = self._base_argv(settings.connect_timeout)

    def _base_argv(self, connect_timeout: float | None) -> list[str]:
        host, options = self.host, self.options
        variables = host.vars or {}
        persist = str(variables.get("gpuops_control_persist") or DEFAULT_PERSIST)
        if not re.fullmatch(r"(\d+[smhdw]?|no|yes)", persist):
            raise TransportError(host.name, f"gpuops_control_persist {persist!r} is not an ssh time (e.g. 60s, 10m, no)")
        argv = [
            "-T", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=" + ("accept-new" if options.accept_new_host_keys else "yes"),
            "-o", f"ConnectTimeout={max(1, int(connect_timeout or options.connect_timeout))}",
            "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir()}/%C", "-o", f"ControlPersist={persist}",
        ]
        if host.port:
            argv += ["-p", str(host.port)]
        if host.user:
            argv += ["-l", host.user]
        if host.key_file:
            argv += ["-i", host.key_file]
        for name in ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args"):
            value = variables.get(name)
            if value:
                argv += shlex.split(str(value))
        extra = [str(variables["gpuops_known_hosts"])] if variables.get("gpuops_known_hosts") else []
        extra += list(options.known_hosts_files)
        if extra:
            argv += ["-o", "UserKnownHostsFile=" + " ".join(_quoted(f, host.name) for f in
                                                             [*self._configured_known_hosts(argv), *extra])]
        return argv

    def _configured_known_hosts(self, argv: list[str]) -> list[str]:
        """The files ssh would read for this host by itself (``ssh -G``), so extra files add to them."""
        try:
            done = subprocess.run([self._ssh, "-G", *argv, "--", self._target()], capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TransportError(self.host.name, f"ssh -G failed: {exc}") from exc
        for line in done.stdout.splitlines():
            if line.lower().startswith("userknownhostsfile "):
                return line.split()[1:]
        return [os.path.expanduser("~/.ssh/known_hosts")]

    def _target(self) -> str:
        return self.host.address or self.host.name

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        timeout, ran_out = command_limit(self.options, timeout)
        argv = [self._ssh, *self._argv, "--", self._target(), command]
        try:
            stdout, stderr, returncode = run_bounded(argv, stdin, timeout)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(self.host.name, ran_out) from exc
        except OutputOverLimit as exc:
            raise TransportError(self.host.name, f"{exc} from one command: stopped (gpuops reads no more from a host)") from exc
        except OSError as exc:
            raise TransportError(self.host.name, f"cannot run ssh: {exc.strerror}") from exc
        if returncode == 255:
            # ssh's own status for any failure of its own (a refused connection, an unknown option,
            # a host name it rejects): never the host's answer. gpuops' remote programs do not exit 255.
            lines = [line.strip() for line in stderr.decode("utf-8", errors="replace").splitlines() if line.strip()]
            failure = next((line for line in lines if _SSH_FAILURE.search(line)), None)
            raise TransportError(self.host.name, _explain(failure or (lines[-1] if lines else "ssh exited with status 255"),
                                                          self._target()))
        return ExecResult(stdout, stderr, returncode)

    def open_stream(self, command: str) -> Stream:
        """One ssh whose stdin/stdout stay open while the command runs (over the shared master)."""

        return ProcessStream([self._ssh, *self._argv, "--", self._target(), command], self.host.name)

    def close(self) -> None:
        pass  # the master stays for ControlPersist: the next command within the window skips the handshake

    def stop_master(self) -> None:
        """End this host's shared connection now (``ssh -O exit``)."""
        subprocess.run([self._ssh, *self._argv, "-O", "exit", "--", self._target()], capture_output=True,  # type: ignore[list-item]
                       timeout=30, stdin=subprocess.DEVNULL, check=False)


def _quoted(path: str, host: str) -> str:
    path = os.path.expanduser(path)
    if '"' in path:
        raise TransportError(host, f"known_hosts file {path!r}: a name with a double quote cannot be given to ssh")
    return path if _SAFE_WORD.match(path) else f'"{path}"'


def _explain(line: str, target: str) -> str:
    if "Host key verification failed" in line:
        return (f"host key for {target} is unknown, changed or revoked (OpenSSH: {line}); verify it and add it "
                f"(ssh-keyscan), or pass --accept-new-host-keys to record an unknown one")
    return f"ssh to {target} failed: {line}"
