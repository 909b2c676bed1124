"""A private docker daemon for lab hosts whose SGLang runs in a container.

Started by the lab (or the test suite), never the machine's own: data root, exec root, pid file and
socket all under the caller's directory; no bridge and no iptables changes (``--bridge=none
--iptables=false``), so containers run on the host network only and no traffic leaves loopback.
Nothing can be pulled here: images are made locally (``import_root``: a Debian root as an image).
Stopped by pid (SIGTERM: docker stops its containers and its containerd; SIGKILL after a grace).

``kept_dockerd`` keeps the daemon's data root (its images) across runs, in the user's cache
(``$GPUOPS_CACHE/docker/slot-N``): importing the root and building the lab's first images took
24 s on the 2-core machine at load 5, and 90-145 s of a whole-suite run's first docker test;
starting on a kept root takes under a second. One run holds
a slot at a time (a file lock); a run that finds every slot held gets a fresh data root, as before.
Only images are kept, and only those the lab tags by what went into them (``keep_image``: a mark
written after the image is complete, refreshed on each use); at start the daemon on a kept root
removes every container, network and volume a killed run left, every image without a mark or
unused for ``KEEP_DAYS``, and a data root it cannot start on is discarded and made afresh.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, Iterator, Sequence
from urllib.parse import quote, unquote

from gpuops.errors import GpuopsError
from gpuops.lab.processes import alive, cmdline, read_pid, terminate
from gpuops.lab.nspawn import die_with_parent
from gpuops.lab.sglang_cache import cache_root as sglang_cache_root
from gpuops.frozen import frozen

DOCKERD = "dockerd"
INSTALL_HINT = "apt-get install -y docker.io"
_START_TIMEOUT_S = 60.0
_STOP_GRACE_S = 30.0
# Not worth shipping into an image that only runs python (about half the root's size).
IMAGE_EXCLUDES = ("./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./usr/share/info",
                  "./var/cache/apt", "./var/lib/apt/lists", "./etc/ssh/sshd_config.d")
# Kept data roots: how many runs at once may keep their images (each slot holds a few hundred MB),
# and how long an image nobody used stays.
KEPT_SLOTS = 2
KEEP_DAYS = 14


@frozen
class DockerDaemon:
    dir: Path
    pid: int
    socket: Path
    cli_path: str
    storage_driver: str
    data_root: Path
    # Where keep marks go when the data root is kept across runs (``kept_dockerd``); None when the
    # daemon's images go away with it.
    kept: Path | None = None

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


def start_dockerd(workdir: Path, data_root: Path | None = None) -> DockerDaemon:
    """Start dockerd in ``workdir`` (its data root ``workdir/data`` unless given); overlay2
    storage, or vfs where overlay is unavailable."""
    require_docker()
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    data = Path(data_root).absolute() if data_root is not None else workdir / "data"
    last = ""
    for driver in ("overlay2", "vfs"):
        try:
            return _start(workdir, data, driver)
        except GpuopsError as exc:
            last = str(exc)
            if driver == "overlay2" and "overlay" in last.lower():
                continue
            raise
    raise GpuopsError(last)


def _start(workdir: Path, data_root: Path, driver: str) -> DockerDaemon:
    socket = workdir / "docker.sock"
    pid_file = workdir / "docker.pid"
    log = workdir / "dockerd.log"
    command = [
        shutil.which(DOCKERD) or DOCKERD,
        "--data-root", str(data_root), "--exec-root", str(workdir / "exec"),
        "--host", f"unix://{socket}", "--pidfile", str(pid_file),
        "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
        "--storage-driver", driver,
    ]

    with open(log, "ab") as handle:
        child = subprocess.Popen(die_with_parent(command), stdin=subprocess.DEVNULL, stdout=handle,
                                 stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    daemon = DockerDaemon(dir=workdir, pid=child.pid, socket=socket, cli_path=docker_cli(), storage_driver=driver,
                          data_root=data_root)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-4:])
            raise GpuopsError(f"lab: dockerd ({driver}) exited at start (status {child.returncode}): {tail}")
        if socket.exists() and _answers(daemon):
            return daemon
        time.sleep(0.2)
    terminate(child.pid, 5)
    raise GpuopsError(f"lab: dockerd did not answer on {socket} within {_START_TIMEOUT_S:.0f} s")


def _answers(daemon: DockerDaemon, timeout: float = 10) -> bool:
    """The daemon answers its API. dockerd makes its socket before it serves it (11.5 s later at the
    start of a whole run, its data root kept), and a client that connects in between waits: a
    question that times out is "not yet", asked again until the start's own deadline."""
    try:
        return daemon.run("version", "--format", "{{.Server.Version}}", timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def import_root(daemon: DockerDaemon, root: Path, tag: str, changes: Sequence[str] = ()) -> str:
    """``tar`` of a root filesystem into ``docker import``; returns the image id."""
    if daemon.run("image", "inspect", tag, timeout=30).returncode == 0:
        return daemon.run("image", "inspect", "-f", "{{.Id}}", tag, timeout=30).stdout.decode().strip()
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", *[f"--exclude={e}" for e in IMAGE_EXCLUDES], "."],
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
    unmount_under(daemon.data_root, itself=True)  # dockerd bind-mounts its data root onto itself


def kept_images_root() -> Path:
    """``$GPUOPS_CACHE/docker`` when set, else ``~/.cache/gpuops/docker``: the kept data roots."""
    return sglang_cache_root().parent / "docker"


@contextmanager
def kept_dockerd(workdir: Path, cache: Path | None = None, slots: int = KEPT_SLOTS,
                 keep_days: float = KEEP_DAYS) -> Iterator[DockerDaemon]:
    """A private dockerd whose data root is kept in ``cache`` (default ``kept_images_root()``)
    across runs, held by this process under a file lock until the block ends; a fresh data root
    under ``workdir`` when every slot is held by another run. Socket, exec root and log are in
    ``workdir`` either way. Stopped with its containers at the end."""
    cache = Path(cache) if cache is not None else kept_images_root()
    cache.mkdir(parents=True, exist_ok=True)
    held = _take_a_slot(cache, slots)
    try:
        daemon = start_dockerd(workdir) if held is None else _start_on_kept_root(workdir, held[0], keep_days)
        try:
            yield daemon
        finally:
            daemon.stop()
    finally:
        if held is not None:
            held[1].close()  # releases the slot's lock


def _take_a_slot(cache: Path, slots: int) -> tuple[Path, IO[str]] | None:
    """The first slot no other run holds, with its lock's open file (the lock lasts while it is open)."""
    for n in range(slots):
        slot = cache / f"slot-{n}"
        slot.mkdir(exist_ok=True)
        handle = open(slot / ".lock", "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return slot, handle
    return None


def _start_on_kept_root(workdir: Path, slot: Path, keep_days: float) -> DockerDaemon:
    data, marks, pid_file = slot / "data", slot / "kept", slot / "dockerd.pid"
    marks.mkdir(exist_ok=True)
    # The daemon of a run killed without its teardown may still be shutting down (it gets SIGTERM
    # when its parent dies, and takes its time): two daemons on one data root would damage it.
    previous = read_pid(pid_file)
    if previous is not None and alive(previous) and str(data) in cmdline(previous):
        terminate(previous, _STOP_GRACE_S)
    unmount_under(data, itself=True)  # what a daemon that was killed outright left mounted
    try:
        daemon = start_dockerd(workdir, data)
        if daemon.run("images", "-q", timeout=60).returncode != 0:
            daemon.stop()
            raise GpuopsError(f"lab: dockerd on {data} does not list its images")
    except GpuopsError:
        # A data root this dockerd cannot use (damaged, or from another docker): made afresh.
        unmount_under(data, itself=True)
        if data.is_dir() and not data.is_symlink():
            shutil.rmtree(data, ignore_errors=True)  # what stays makes the start below fail, saying why
        else:
            data.unlink(missing_ok=True)
        for mark in marks.iterdir():
            mark.unlink()
        daemon = start_dockerd(workdir, data)
    pid_file.write_text(f"{daemon.pid}\n")
    daemon = replace(daemon, kept=marks)
    _tidy_kept_root(daemon, marks, keep_days)
    return daemon


def _tidy_kept_root(daemon: DockerDaemon, marks: Path, keep_days: float) -> None:
    """What a run may leave on a kept root and the next must not see: containers (a killed run
    leaves its own; one with a restart policy is running again by now), networks, volumes, and
    images that are not kept (no mark: a tag made outside ``keep_image``, or an image whose build
    was cut short) or have gone unused for ``keep_days``."""
    listing = daemon.run("ps", "-aq", timeout=60)
    ids = listing.stdout.decode().split() if listing.returncode == 0 else []
    if ids:
        daemon.run("rm", "-f", *ids, timeout=120)
    daemon.run("network", "prune", "-f", timeout=60)
    daemon.run("volume", "prune", "-f", timeout=60)
    listing = daemon.run("images", "--format", "{{.Repository}}:{{.Tag}}", timeout=60)
    tags = {t for t in listing.stdout.decode().split() if "<none>" not in t}
    stale = time.time() - keep_days * 86400
    unkept = []
    for tag in sorted(tags):
        mark = marks / quote(tag, safe="")
        try:
            fresh = mark.stat().st_mtime >= stale
        except FileNotFoundError:
            fresh = False
        if not fresh:
            unkept.append(tag)
    if unkept:
        daemon.run("rmi", "-f", *unkept, timeout=300)
    daemon.run("image", "prune", "-f", timeout=120)
    for mark in marks.iterdir():
        if unquote(mark.name) not in tags or unquote(mark.name) in unkept:
            mark.unlink()


def keep_image(daemon: DockerDaemon, tag: str) -> None:
    """Mark ``tag`` (complete: call only after it is built) as kept by a kept daemon, or refresh
    its mark; nothing for a daemon whose images go away with it. Only a tag that names what went
    into the image may be kept: a later run takes it as built from the same inputs."""
    if daemon.kept is None:
        return
    mark = daemon.kept / quote(tag, safe="")
    mark.touch()
    os.utime(mark)


def unmount_under(directory: Path, itself: bool = False) -> None:
    """Unmount what a stopped daemon left mounted below ``directory`` (its netns file, overlays),
    and ``directory`` itself when ``itself``, deepest first, so the directory can be removed."""
    top = str(Path(directory).absolute())
    try:
        with open("/proc/self/mountinfo") as handle:
            points = [line.split()[4] for line in handle]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(top + "/") or (itself and p == top)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, stdin=subprocess.DEVNULL)
