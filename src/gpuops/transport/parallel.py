"""Run one function per host, in parallel, so that one host's failure never stops the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from gpuops.errors import GpuopsError
from gpuops.transport.base import ConnectOptions, Connection

if TYPE_CHECKING:
    from gpuops.inventory import Host

T = TypeVar("T")

DEFAULT_FORKS = 16


@dataclass(frozen=True)
class HostOutcome(Generic[T]):
    ok: bool
    value: T | None = None
    error: str | None = None


def connect(host: Host, options: ConnectOptions) -> Connection:
    """The connection for a host: local (no SSH) or SSH through Fabric."""
    if host.connection == "local":
        from gpuops.transport.local import LocalConnection

        return LocalConnection(host)
    if host.connection not in ("ssh", "paramiko", "smart"):
        raise GpuopsError(f"{host.name}: unsupported ansible_connection {host.connection!r} (use ssh or local)")
    from gpuops.transport.ssh import SSHConnection

    return SSHConnection(host, options)


def prepare_ssh(hosts: Sequence[Host]) -> None:
    """Import fabric/paramiko once, in the calling thread, before worker threads connect.

    Concurrent first imports of paramiko from several threads can see a partially initialised
    module ("cannot import name ... from partially initialized module"). Anything that starts its
    own threads to connect (not through ``run_on_hosts``) calls this first. Local-only runs skip it.
    """
    if any(h.connection != "local" for h in hosts):
        import fabric  # noqa: F401


def run_on_hosts(
    hosts: Sequence[Host],
    fn: Callable[[Host], T],
    forks: int = DEFAULT_FORKS,
) -> dict[str, HostOutcome[T]]:
    """Call ``fn(host)`` for every host, at most ``forks`` at a time; results keyed by host name.

    A ``GpuopsError`` (unreachable, host key, bad input for that host) becomes that host's error
    line. Any other exception is a bug, but it still only fails its host, with its type named.
    """
    prepare_ssh(hosts)

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
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts)))) as pool:
        outcomes = list(pool.map(one, hosts))
    return {host.name: outcome for host, outcome in zip(hosts, outcomes)}
