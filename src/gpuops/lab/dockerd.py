"""A private docker daemon for lab hosts whose SGLang runs in a container.

Started by the lab (or the test suite), never the machine's own: data root, exec root, pid file and
socket all under the caller's directory; no bridge and no iptables changes (``--bridge=none
--iptables=false``), so containers run on the host network only and no traffic leaves loopback.
Nothing can be pulled here: images are made locally (``import_root``: a Debian root as an image).
Stopped by pid (SIGTERM: docker stops its containers and its containerd; SIGKILL after a grace).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from gpuops.errors import GpuopsError
from gpuops.lab.processes import terminate
from gpuops.lab.nspawn import die_with_parent

DOCKERD = "dockerd"
INSTALL_HINT = "apt-get install -y docker.io"
_START_TIMEOUT_S = 60.0
_STOP_GRACE_S = 30.0
# Not worth shipping into an image that only runs python (about half the root's size).
_IMAGE_EXCLUDES = ("./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./usr/share/info",
                   "./var/cache/apt", "./var/lib/apt/lists", "./etc/ssh/sshd_config.d")


@dataclass(frozen=True)
class DockerDaemon:
    dir: Path
    pid: int
    socket: Path
    cli_path: str
    storage_driver: str

    @property
    def host(self) -> str:
        """The ``DOCKER_HOST`` value that reaches this daemon."""
        return f"unix://{self.socket}"

    def cli(self, *args: str) -> list[str]:
        return [self.cli_path, "-H", self.host, *args]

    def run(self, *args: str, timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.cli(*args), input=input, capture_output=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def stop(self) -> None:
        stop_dockerd(self)


def docker_cli() -> str:
    """The docker client that belongs with the daemon binary (an unrelated ``docker`` earlier on
    PATH must not answer for it)."""
    daemon = shutil.which(DOCKERD)
    if daemon is None:
        raise GpuopsError(f"lab: {DOCKERD} not found: install Docker ({INSTALL_HINT})")
    # Packages put the daemon in sbin/ and the client in bin/ of the same prefix.
    for cli in (Path(daemon).with_name("docker"), Path(daemon).parent.parent / "bin" / "docker"):
        if os.access(cli, os.X_OK):
            return str(cli)
    raise GpuopsError(f"lab: no docker client beside {daemon} ({INSTALL_HINT})")


def require_docker() -> None:
    docker_cli()
    if os.geteuid() != 0:
        raise GpuopsError("lab: a private docker daemon needs root")


def start_dockerd(workdir: Path) -> DockerDaemon:
    """Start dockerd in ``workdir``; overlay2 storage, or vfs where overlay is unavailable."""
    require_docker()
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    last = ""
    for driver in ("overlay2", "vfs"):
        try:
            return _start(workdir, driver)
        except GpuopsError as exc:
            last = str(exc)
            if driver == "overlay2" and "overlay" in last.lower():
                continue
            raise
    raise GpuopsError(last)


def _start(workdir: Path, driver: str) -> DockerDaemon:
    socket = workdir / "docker.sock"
    pid_file = workdir / "docker.pid"
    log = workdir / "dockerd.log"
    command = [
        shutil.which(DOCKERD) or DOCKERD,
        "--data-root", str(workdir / "data"), "--exec-root", str(workdir / "exec"),
        "--host", f"unix://{socket}", "--pidfile", str(pid_file),
        "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
        "--storage-driver", driver,
    ]

    with open(log, "ab") as handle:
        child = subprocess.Popen(die_with_parent(command), stdin=subprocess.DEVNULL, stdout=handle,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    daemon = DockerDaemon(dir=workdir, pid=child.pid, socket=socket, cli_path=docker_cli(), storage_driver=driver)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-4:])
            raise GpuopsError(f"lab: dockerd ({driver}) exited at start (status {child.returncode}): {tail}")
        if socket.exists() and daemon.run("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0:
            return daemon
        time.sleep(0.2)
    terminate(child.pid, 5)
    raise GpuopsError(f"lab: dockerd did not answer on {socket} within {_START_TIMEOUT_S:.0f} s")


def import_root(daemon: DockerDaemon, root: Path, tag: str, changes: Sequence[str] = ()) -> str:
    """``tar`` of a root filesystem into ``docker import``; returns the image id."""
    if daemon.run("image", "inspect", tag, timeout=30).returncode == 0:
        return daemon.run("image", "inspect", "-f", "{{.Id}}", tag, timeout=30).stdout.decode().strip()
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", *[f"--exclude={e}" for e in _IMAGE_EXCLUDES], "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    args = ["import"]
    for change in changes:
        args += ["--change", change]
    try:
        done = subprocess.run(daemon.cli(*args, "-", tag), stdin=tar.stdout, capture_output=True, timeout=600)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    if done.returncode != 0:
        raise GpuopsError(f"lab: docker import of {root} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


def stop_dockerd(daemon: DockerDaemon) -> None:
    """Remove every container of this daemon, then stop it by pid."""
    listing = daemon.run("ps", "-aq", timeout=30)
    ids = listing.stdout.decode().split() if listing.returncode == 0 else []
    if ids:
        daemon.run("rm", "-f", *ids, timeout=120)
    terminate(daemon.pid, _STOP_GRACE_S)
    unmount_under(daemon.dir)


def unmount_under(directory: Path) -> None:
    """Unmount what a stopped daemon left mounted below ``directory`` (its netns file, overlays),
    deepest first, so the directory can be removed."""
    prefix = str(Path(directory).absolute()) + "/"
    try:
        with open("/proc/self/mountinfo") as handle:
            points = [line.split()[4] for line in handle]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, stdin=subprocess.DEVNULL)
