"""Run one function per host, in parallel, so that one host's failure never stops the others."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from gpuops.errors import GpuopsError
from gpuops.transport.base import ConnectOptions, Connection
from gpuops.transport.rollout import Rollout
from gpuops import process_gc, timings
from gpuops.transport import verbose
from gpuops.transport.become import BecomeConnection
from gpuops.transport.connvars import become_settings, check_variables, ssh_settings, transport_name
from gpuops.transport.local import LocalConnection
from gpuops.transport.openssh import OpenSSHConnection
from gpuops.transport.ssh import SSHConnection
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host
    from gpuops.transport.connvars import Become

T = TypeVar("T")

DEFAULT_FORKS = 16


@frozen
class HostOutcome(Generic[T]):
    """What the function run for one host gave (``run_on_hosts``): its value, or the one-line error it failed
    with, or why the rollout skipped it."""

    ok: bool
    value: T | None = None
    error: str | None = None
    skipped: bool = False  # never attempted: an earlier batch of a rollout failed too much


def connect(host: Host, options: ConnectOptions) -> Connection:
    """The connection for a host: local (no SSH) or SSH through Fabric.

    The host's ``ansible_*`` connection variables are checked first: one gpuops cannot honour
    fails this host (TransportError) before anything is contacted. A host with ``ansible_become``
    (``-b`` makes it every host's default) gets a connection whose every command runs through sudo
    (``transport/become.py``): one way to become, whatever the command.
    """

    if options.connector is not None:
        return options.connector(host)
    check_variables(host)
    become = become_settings(host.vars or {}, host.name)
    if not (verbose.enabled() or timings.enabled()):
        return _with_become(_connect(host, options), become)
    started = time.monotonic()
    conn = _with_become(_connect(host, options), become)
    return verbose.LoggedConnection(conn, time.monotonic() - started)  # type: ignore[return-value]


class Opening:
    """A host's connection being made in a thread of its own (``connect``), so that the caller's
    work meanwhile overlaps the handshake's waits on the network and on the host (its sshd's key
    exchange and fork): an apply builds its gather's script then (~16 ms of a no-op apply's CPU on
    the lab; the handshake is ~20 ms, most of it waiting). ``connection()`` returns it, or raises
    what ``connect`` raised; ``discard()`` closes it unused."""

    def __init__(self, host: Host, options: ConnectOptions) -> None:
        self._made: Connection | None = None
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._open, args=(host, options), name=f"connect-{host.name}",
                                        daemon=True)
        self._thread.start()

    def _open(self, host: Host, options: ConnectOptions) -> None:
        try:
            self._made = connect(host, options)
        except BaseException as exc:  # handed to the caller's thread, which raises it
            self._failed = exc

    def connection(self) -> Connection:
        self._thread.join()
        if self._failed is not None:
            raise self._failed
        assert self._made is not None
        return self._made

    def discard(self) -> None:
        self._thread.join()
        if self._made is not None:
            self._made.close()


def _with_become(conn: Connection, become: Become) -> Connection:
    if not become.enabled:
        return conn

    return BecomeConnection(conn, become.password, become.user)


def _connect(host: Host, options: ConnectOptions) -> Connection:
    if host.connection == "local":
        return LocalConnection(host)
    if host.connection not in ("ssh", "paramiko", "smart"):
        raise GpuopsError(f"{host.name}: unsupported ansible_connection {host.connection!r} (use ssh or local)")
    if transport_name(host) == "openssh":
        return OpenSSHConnection(host, options)

    return SSHConnection(host, options, ssh_settings(host))


def prepare_ssh(hosts: Sequence[Host]) -> None:
    """Import fabric/paramiko once, in the calling thread, before worker threads connect.

    Concurrent first imports of paramiko from several threads can see a partially initialised
    module ("cannot import name ... from partially initialized module"). Anything that starts its
    own threads to connect (not through ``run_on_hosts``) calls this first. Local-only runs skip it.
    """
    # Hosts on the openssh connection never touch paramiko: only the others pay for the import.
    if any(h.connection != "local" and not _on_openssh(h) for h in hosts):
        with timings.span("ssh-import"), process_gc.loading_modules("fabric"):
            import fabric  # noqa: F401  (once, in this thread)


def _on_openssh(host: Host) -> bool:
    try:
        return transport_name(host) == "openssh"
    except GpuopsError:
        return False  # a bad gpuops_connection fails that host when it connects, not here


def run_on_hosts(
    hosts: Sequence[Host],
    fn: Callable[[Host], T],
    forks: int = DEFAULT_FORKS,
    rollout: Rollout | None = None,
    failed: Callable[[T], bool] | None = None,
    together: Callable[[Host], str | None] | None = None,
) -> dict[str, HostOutcome[T]]:
    """Call ``fn(host)`` for every host, at most ``forks`` at a time; results keyed by host name.

    A ``GpuopsError`` (unreachable, host key, bad input for that host) becomes that host's error
    line. Any other exception is a bug, but it still only fails its host, with its type named.

    With a ``rollout``, hosts go in batches, each finished before the next starts; once a batch
    fails past its threshold the rest are not attempted (``skipped``). ``failed(value)`` says
    whether a host that returned a value still failed (an apply that rolled back, for instance);
    ``together(host)`` names hosts no batch may split (``Rollout.batches``).
    """
    prepare_ssh(hosts)
    if rollout is not None:
        return _run_in_batches(hosts, fn, forks, rollout, failed or (lambda _: False), together)
    return _run_batch(hosts, fn, forks)


def _run_in_batches(hosts: Sequence[Host], fn: Callable[[Host], T], forks: int, rollout: Rollout,
                    failed: Callable[[T], bool],
                    together: Callable[[Host], str | None] | None = None) -> dict[str, HostOutcome[T]]:
    results: dict[str, HostOutcome[T]] = {}
    batches = rollout.batches(list(hosts), together)
    for number, batch in enumerate(batches, start=1):
        outcomes = _run_batch(batch, fn, forks)
        results.update(outcomes)
        bad = sum(1 for o in outcomes.values() if not o.ok or (o.value is not None and failed(o.value)))
        if rollout.stops_after(bad, len(batch)) and number < len(batches):
            reason = rollout.describe_stop(bad, len(batch), number)
            for later in batches[number:]:
                for host in later:
                    results[host.name] = HostOutcome(ok=False, error=reason, skipped=True)
            break
    return {host.name: results[host.name] for host in hosts}


def _run_batch(hosts: Sequence[Host], fn: Callable[[Host], T], forks: int) -> dict[str, HostOutcome[T]]:

    def one(host: Host) -> HostOutcome[T]:
        try:
            return HostOutcome(ok=True, value=fn(host))
        except GpuopsError as exc:
            message = str(exc)
            prefix = f"{host.name}: "
            return HostOutcome(ok=False, error=message[len(prefix):] if message.startswith(prefix) else message)
        except Exception as exc:  # a bug: keep the other hosts going, name the failure
            return HostOutcome(ok=False, error=f"internal error: {type(exc).__name__}: {exc}")

    if len(hosts) == 1:
        return {hosts[0].name: one(hosts[0])}
    # Daemon workers, waited for by polling an event: Ctrl-C, SIGTERM or SIGHUP lands in this
    # (main) thread and the process exits at once, which closes every host's channel, so each host
    # ends its run by itself (cli.py says what each does). A ThreadPoolExecutor's workers are joined
    # at exit: gpuops went on holding every transaction and committed them, 40 s after a Ctrl-C.
    todo: queue.SimpleQueue[Host] = queue.SimpleQueue()
    for host in hosts:
        todo.put(host)
    outcomes: dict[str, HostOutcome[T]] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def work() -> None:
        while True:
            try:
                host = todo.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = one(host)
            except BaseException as exc:  # SystemExit in a worker: its host fails, the wait still ends
                outcome = HostOutcome(ok=False, error=f"internal error: {type(exc).__name__}: {exc}")
            with lock:
                outcomes[host.name] = outcome
                if len(outcomes) == len(hosts):
                    all_done.set()

    for number in range(max(1, min(forks, len(hosts)))):
        threading.Thread(target=work, name=f"host-worker-{number}", daemon=True).start()
    while not all_done.wait(0.5):
        pass
    return {host.name: outcomes[host.name] for host in hosts}
