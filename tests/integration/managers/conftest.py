"""Fixtures for tests against real service managers: systemd (a booted Debian root) and docker.

``debian_root`` (session)
    The cached debootstrap root (``gpuops.lab.debian_root``): built once per machine (about two
    minutes), then shared by every session. Skips with the reason when this machine cannot build
    or boot one: not root (an allowed skip), or debootstrap / systemd-nspawn missing (not allowed:
    `.ci/run` installs them, so the run fails and says which).

``systemd_host_factory`` (session)
    ``systemd_host_factory(**kwargs) -> SystemdLabHost``: boots the root (an overlay on the cache,
    under a fresh temp dir) with sshd on a loopback port and an SGLang unit running the stand-in
    (``gpuops.lab.systemd_host.start_systemd_host``). Every host started is shut down by its
    nspawn pid at the end of the session (a module fixture that is done with its host should stop
    it itself: ``host.stop()`` is idempotent).

``docker_usable`` (session)
    Skips where a private dockerd cannot run (not root, dockerd missing).

``docker_daemon`` (session)
    A private dockerd (``gpuops.lab.dockerd.kept_dockerd``): no bridge, no iptables, socket under a
    temp dir; its data root kept in the user's cache across runs (one run at a time per slot; a
    fresh one when the slots are held), so the Debian root is imported and each lab image built
    once per machine (images are tagged by what went into them), not once per run. Nothing but
    those images outlives a run: the daemon starts by removing containers, networks, volumes and
    untagged-by-content images a killed run left. Shared by the modules and stopped with its
    containers at the session's end. A module that starts a container removes it when it is done,
    so the next module finds the daemon as it was, but for its images.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


def _why_no_containers(tools: tuple[str, ...]) -> str | None:
    if os.geteuid() != 0:
        return "needs root to boot containers (systemd-nspawn, overlay mounts, dockerd)"
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install -y debootstrap systemd-container docker.io)"
    return None


@pytest.fixture(scope="session")
def debian_root() -> Path:
    from gpuops.lab.debian_root import cache_root, debian_root as build

    why = _why_no_containers(("systemd-nspawn", "nsenter"))
    if why is None and shutil.which("debootstrap") is None and not any(cache_root().glob("*/root/.gpuops-root-complete")):
        why = "debootstrap not installed and no cached Debian root"
    if why:
        pytest.skip(why)
    return build(progress=lambda msg: print(f"\n{msg}", flush=True))


@pytest.fixture(scope="session")
def systemd_host_factory(debian_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    from gpuops.lab.systemd_host import SystemdLabHost, start_systemd_host

    started: list[SystemdLabHost] = []

    def make(**kwargs: Any) -> SystemdLabHost:
        host = start_systemd_host(debian_root, tmp_path_factory.mktemp("systemd-host"), **kwargs)
        started.append(host)
        return host

    try:
        yield make
    finally:
        for host in started:
            host.stop()


@pytest.fixture(scope="session")
def docker_usable() -> None:
    """Skips, with the reason, where this machine cannot run a private dockerd."""
    why = _why_no_containers(("dockerd",))
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def docker_daemon(docker_usable: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gpuops.lab.dockerd import kept_dockerd

    # A short path: the daemon's unix sockets must fit in 108 bytes.
    with kept_dockerd(tmp_path_factory.mktemp("dockerd")) as daemon:
        yield daemon
