"""SSH through Fabric (on paramiko), with host keys verified and never silently accepted.

Fabric resolves the host through ~/.ssh/config (HostName, Port, User, IdentityFile, ProxyJump) and
handles agent and key-file authentication. Fabric itself auto-accepts unknown host keys, so this
module replaces that policy: keys are checked against ~/.ssh/known_hosts, the config's
UserKnownHostsFile, and any extra file given (`gpuops_known_hosts`, `--known-hosts`). A changed key
always fails the host; an unknown key fails it unless `accept_new_host_keys` asks to record it.

Commands run on one paramiko channel each: the program goes in on stdin from a thread while stdout
and stderr are drained, so large scripts and large outputs never deadlock on the SSH window.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuops import timings
from gpuops.errors import TransportError
from gpuops.transport.algorithms import AlgorithmError
from gpuops.transport.base import ConnectOptions, ExecResult, command_limit
from gpuops.transport.connvars import SSHSettings, ssh_settings
from gpuops.transport.known_hosts import HostKeyRefused
from gpuops.transport.limits import BoundedBuffer, OutputOverLimit
from gpuops.transport.verbose import quiet_paramiko
from gpuops.transport.known_hosts import KnownHosts, load, transport_factory
from gpuops.transport.known_hosts_config import user_known_hosts_files
from gpuops.transport.stream import ChannelStream

quiet_paramiko()  # paramiko's own log lines only with -v (transport/verbose.py)

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.stream import Stream

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


def known_hosts_files(host: Host, options: ConnectOptions, ssh_config: dict[str, Any]) -> list[Path]:
    """Every known_hosts file that vouches for this host, in the order keys are looked up."""
    names: list[str] = [USER_KNOWN_HOSTS]
    configured = ssh_config.get("userknownhostsfile")
    if configured:
        names.extend(user_known_hosts_files(str(configured), ssh_config, host.name))
    extra = host.vars.get("gpuops_known_hosts") if host.vars else None
    if extra:
        names.append(str(extra))
    names.extend(options.known_hosts_files)
    seen: list[Path] = []
    for name in names:
        path = Path(os.path.expanduser(name))
        if path not in seen:
            seen.append(path)
    return seen


def _known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9._:@\[\]-]+$")


def proxy_socket(command: str, hostname: str, port: int, user: str | None, name: str) -> Any:
    """Run a ProxyCommand the way OpenSSH does (``sh -c "exec CMD"``, %h %p %r %% expanded).

    The expanded values come from the inventory; a host or user name holding anything a shell
    would read is refused rather than pasted into the command.
    """
    import paramiko

    values = {"h": hostname, "p": str(port), "r": user or "", "n": hostname, "%": "%"}
    for key in ("h", "r"):
        if values[key] and not _SAFE_TOKEN.match(values[key]):
            raise TransportError(name, f"ProxyCommand: %{key} would expand to {values[key]!r}, which is not a plain name")

    def expand(match: re.Match) -> str:
        token = match.group(1)
        if token not in values:
            raise TransportError(name, f"ProxyCommand: %{token} is not supported (%h %p %r %n %%)")
        return values[token]

    expanded = re.sub(r"%(.)", expand, command)
    return paramiko.ProxyCommand("/bin/sh -c " + shlex.quote("exec " + expanded))


class SSHConnection:
    def __init__(self, host: Host, options: ConnectOptions, settings: SSHSettings | None = None) -> None:
        self.host = host
        self.options = options
        self.settings = settings if settings is not None else ssh_settings(host)
        self._conn = self._open()

    # -- connecting -------------------------------------------------------------------------

    def _open(self) -> Any:
        import paramiko
        from fabric import Config
        from fabric import Connection as FabricConnection

        host, settings = self.host, self.settings
        connect_kwargs: dict[str, Any] = {"allow_agent": True}
        keys = [k for k in (host.key_file, *(os.path.expanduser(f) for f in settings.identity_files)) if k]
        if keys:
            connect_kwargs["key_filename"] = keys
        if settings.password is not None:
            connect_kwargs["password"] = settings.password
        timeout = settings.connect_timeout or self.options.connect_timeout
        # The whole handshake within the connect timeout, not only the TCP connect: paramiko's own
        # defaults wait up to 15 s for a banner and 30 s for authentication, so a host that stalled in
        # authentication (its sshd stopped, a half-dead box) held the client 30 s, past --connect-timeout
        # and --timeout (tests/unit/test_ssh_handshake_stall.py).
        connect_kwargs["banner_timeout"] = timeout
        connect_kwargs["auth_timeout"] = timeout
        try:
            conn = FabricConnection(
                host.address or settings.hostname or host.name,
                user=host.user or settings.user,
                port=host.port or settings.port,
                config=Config(),
                connect_timeout=max(1, int(timeout)),
                connect_kwargs=connect_kwargs,
                # An inventory's ProxyCommand/ProxyJump wins over ~/.ssh/config's (as -o does for ssh).
                gateway=False if settings.proxy_command else None,
            )
        except Exception as exc:  # fabric parses ~/.ssh/config here
            raise TransportError(host.name, f"cannot read ssh configuration: {exc}") from exc
        if settings.proxy_jump:
            conn.gateway = self._jump_chain(settings.proxy_jump, FabricConnection, Config)
        files = known_hosts_files(host, self.options, dict(conn.ssh_config))
        for extra in settings.known_hosts_files:
            path = Path(os.path.expanduser(extra))
            if path not in files:
                files.append(path)
        kex_done: list[float] = []
        self._verify_keys(conn, files, self.options.accept_new_host_keys or settings.accept_new_host_key,
                          on_kex_done=lambda: kex_done.append(time.monotonic()))
        # Fabric gives the jump hosts of ~/.ssh/config's ProxyJump an auto-accept policy of their
        # own: their keys are checked against the same files as the target's.
        gateway = conn.gateway
        while isinstance(gateway, FabricConnection):
            self._verify_keys(gateway, files, self.options.accept_new_host_keys)
            # A jump host that stalls mid-handshake is bounded as the target is.
            gateway.connect_kwargs.setdefault("banner_timeout", timeout)
            gateway.connect_kwargs.setdefault("auth_timeout", timeout)
            gateway = gateway.gateway
        via = ""
        if settings.proxy_command:
            via = f" (through ProxyCommand {settings.proxy_command!r})"
            conn.connect_kwargs["sock"] = proxy_socket(settings.proxy_command, conn.host, conn.port, conn.user, host.name)
        elif isinstance(conn.gateway, FabricConnection):
            via = f" (through jump host {conn.gateway.host}:{conn.gateway.port})"
        started = time.monotonic()
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            where = _known_hosts_name(conn.host, conn.port)
            raise TransportError(
                host.name,
                f"host key for {where} has CHANGED (got {exc.key.get_name()} "
                f"{exc.key.fingerprint}); refusing to connect. If the change is expected, remove the "
                f"old key (ssh-keygen -R '{where}') and connect again.",
            ) from exc
        except _UnknownHostKey as exc:
            raise TransportError(host.name, str(exc)) from exc
        except HostKeyRefused as exc:  # @revoked, or a host certificate that does not hold
            raise TransportError(host.name, str(exc)) from exc
        except AlgorithmError as exc:  # ~/.ssh/config's Ciphers etc. leave nothing paramiko speaks
            raise TransportError(host.name, str(exc)) from exc
        except paramiko.AuthenticationException as exc:
            raise TransportError(
                host.name, f"authentication failed for {conn.user}@{conn.host}:{conn.port}{via}: {exc}"
            ) from exc
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            raise TransportError(host.name, f"connection refused by {conn.host}:{conn.port}{via}") from exc
        except socket.gaierror as exc:
            raise TransportError(host.name, f"cannot resolve host name {conn.host!r}: {exc.strerror}") from exc
        except (socket.timeout, TimeoutError) as exc:
            raise TransportError(
                host.name,
                f"timed out connecting to {conn.host}:{conn.port}{via} after {timeout:.0f} s",
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # EOFError says nothing by itself: the host closed the connection
            why = str(exc) or ("the host closed the connection" if isinstance(exc, EOFError) else type(exc).__name__)
            raise TransportError(host.name, f"ssh to {conn.host}:{conn.port}{via} failed: {why}") from exc
        if kex_done:  # the target's own key exchange ends last (jump hosts connect before it)
            timings.record("connect", started, kex_done[-1], host.name)
            timings.record("auth", kex_done[-1], time.monotonic(), host.name)
        if settings.keepalive:
            conn.transport.set_keepalive(settings.keepalive)
        return conn

    def _verify_keys(self, conn: Any, files: list[Path], accept_new: bool, on_kex_done: Any = None) -> None:
        """Load the known_hosts files for `conn` (markers included) and refuse unknown keys.

        The same Transport class sets the algorithm order (fast first, ~/.ssh/config's own wins).
        """

        client = conn.client
        known = KnownHosts()
        for path in files:
            if path.is_file():
                try:
                    load(path, client.get_host_keys(), known)
                except OSError as exc:
                    raise TransportError(self.host.name, f"cannot read known_hosts file {path}: {exc.strerror}") from exc
        lookup = _known_hosts_name(conn.host, conn.port)
        conn.connect_kwargs["transport_factory"] = transport_factory(conn.host, lookup, known, dict(conn.ssh_config),
                                                                     on_kex_done)
        record_to = files[-1] if len(files) > 1 else files[0]
        client.set_missing_host_key_policy(_RecordNewKey(record_to) if accept_new else _RejectUnknownKey(files))

    def _jump_chain(self, spec: str, connection_class: Any, config_class: Any) -> Any:
        """ProxyJump ``[user@]host[:port][,next...]``: each hop through the one before it."""
        gateway = None
        for hop in (part.strip() for part in spec.split(",")):
            if not hop or any(c.isspace() for c in hop):
                raise TransportError(self.host.name, f"ProxyJump {spec!r}: {hop!r} is not [user@]host[:port]")
            kwargs: dict[str, Any] = {"config": config_class(), "connect_timeout": max(1, int(self.options.connect_timeout))}
            if gateway is not None:
                kwargs["gateway"] = gateway
            gateway = connection_class(hop, **kwargs)
        return gateway

    # -- running ----------------------------------------------------------------------------

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> ExecResult:
        timeout, ran_out = command_limit(self.options, timeout)
        # ``timeout`` bounds the whole command, not each read: a host that trickles output, or whose
        # session stalls after its output ended (sshd stopped before it sent the exit status), is
        # still cut off at it. Every wait below takes what is left.
        end = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if end is None else max(0.01, end - time.monotonic())

        transport = self._conn.transport
        try:
            channel = transport.open_session(timeout=min(self.options.connect_timeout, left() or self.options.connect_timeout))
            channel.settimeout(timeout)
            channel.exec_command(command)
        except Exception as exc:
            raise TransportError(self.host.name, f"cannot start remote command: {exc}") from exc

        def feed() -> None:
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except (OSError, EOFError):
                pass  # the remote side closed its stdin early; its exit status says why

        stderr_chunks = BoundedBuffer()

        def drain_stderr() -> None:
            try:
                while True:
                    chunk = channel.recv_stderr(65536)
                    if not chunk:
                        return
                    if not stderr_chunks.add(chunk):
                        channel.close()  # over the limit: stop the command (the stdout loop ends too)
                        return
            except (OSError, EOFError):
                return

        feeder = threading.Thread(target=feed, daemon=True)
        errs = threading.Thread(target=drain_stderr, daemon=True)
        feeder.start()
        errs.start()
        stdout_chunks = BoundedBuffer()
        try:
            while True:
                channel.settimeout(left())
                chunk = channel.recv(65536)
                if not chunk or not stdout_chunks.add(chunk):
                    break
            if stdout_chunks.over:
                channel.close()  # stop the command: gpuops reads no more from this host
            errs.join(left())
            if stdout_chunks.over or stderr_chunks.over:
                raise OutputOverLimit(stdout_chunks.limit)
            if not channel.status_event.wait(left()):
                raise socket.timeout("no exit status")
            status = channel.exit_status
        except (socket.timeout, TimeoutError) as exc:
            _close_without_waiting(channel)
            raise TransportError(self.host.name, ran_out) from exc
        except OutputOverLimit as exc:
            raise TransportError(self.host.name, f"{exc} from one command: stopped (gpuops reads no more from a host)") from exc
        except (OSError, EOFError) as exc:
            raise TransportError(self.host.name, f"connection lost: {exc}") from exc
        finally:
            feeder.join(min(1.0, left() or 1.0))
        if status == -1:
            raise TransportError(self.host.name, "connection lost before the remote command finished")
        return ExecResult(stdout_chunks.value(), stderr_chunks.value(), status)

    def open_stream(self, command: str) -> Stream:
        """A new channel on the connection the gather already opened (no second handshake)."""

        return ChannelStream(self._conn.transport, command, self.options.connect_timeout, self.host.name)

    def close(self) -> None:
        try:
            self._conn.close()
        except Exception:
            pass


def _close_without_waiting(channel: Any) -> threading.Thread:
    """Close a timed-out command's channel from a thread of its own: a close waits on paramiko's
    write lock, which a send to a stalled session (sshd stopped) holds for good."""
    thread = threading.Thread(target=_close_quietly, args=(channel,), name="close-channel", daemon=True)
    thread.start()
    return thread


def _close_quietly(channel: Any) -> None:
    """A close that finds the connection already gone (paramiko raises EOFError, or OSError from the
    socket) has nothing left to close; uncaught, the thread's traceback went to stderr."""
    import paramiko  # already loaded: the channel is paramiko's

    try:
        channel.close()
    except (EOFError, OSError, paramiko.SSHException):
        pass


class _UnknownHostKey(Exception):
    pass


class _RejectUnknownKey:
    """Like paramiko's RejectPolicy, with a message that tells the user what to do."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if getattr(client.get_transport(), "certificate_verified", False):
            return  # vouched for by a @cert-authority line (checked during the key exchange)
        where = ", ".join(str(f) for f in self.files)
        raise _UnknownHostKey(
            f"host key for {hostname} is unknown ({key.get_name()} {key.fingerprint}; not in {where}). "
            f"Verify it and add it (ssh-keyscan), or pass --accept-new-host-keys to record it."
        )


class _RecordNewKey:
    """Record an unknown key (like OpenSSH's StrictHostKeyChecking=accept-new); changed keys still fail."""

    def __init__(self, record_to: Path) -> None:
        self.record_to = record_to

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if getattr(client.get_transport(), "certificate_verified", False):
            return  # a CA vouches for the host: nothing to record
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.record_to.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.record_to, "a", encoding="ascii") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
