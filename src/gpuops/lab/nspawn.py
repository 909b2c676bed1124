"""A booted Debian root: real systemd as PID 1 of a ``systemd-nspawn`` container, reached over SSH.

The cached root (``gpuops.lab.debian_root``) is never written: each boot mounts an overlay on it
(upper and work dirs under the caller's directory) and boots that with

    systemd-nspawn -D MERGED --boot --register=no --keep-unit

so every write the container's systemd makes (journal, /run, units gpuops installs) lands in the
caller's directory, and any number of sessions can boot the same cache. The container shares the
host's network namespace: its sshd listens on a loopback port of our choosing (never 22, the
host's), with a host key made for this boot and the caller's public key for root. Code outside
drives systemd with ``nsenter -t <init pid> -a`` (``BootedRoot.run``). Stopping is by pid: the
nspawn process gets SIGTERM (an orderly shutdown of the container), SIGKILL after a grace time,
then the overlay is unmounted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from gpuops.errors import GpuopsError
from gpuops.lab import sshd
from gpuops.lab.processes import terminate
from gpuops.frozen import frozen

NSPAWN = "systemd-nspawn"
NSENTER = "nsenter"
INSTALL_HINT = "apt-get install -y systemd-container"
_BOOT_TIMEOUT_S = 120.0
_STOP_GRACE_S = 20.0
_HOST_KEY = "/etc/ssh/gpuops_lab_host_ed25519_key"


@frozen
class BootedRoot:
    """A running container. ``merged`` is its ``/`` seen from outside (read and write it there)."""

    dir: Path
    merged: Path
    nspawn_pid: int
    init_pid: int
    ssh_port: int
    host_key_pub: Path

    def path(self, inside: str) -> Path:
        """Where the container's ``inside`` (an absolute path) is seen from outside."""
        return self.merged / inside.lstrip("/")

    def run(self, argv: Sequence[str], timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the container (all its namespaces), as root; output as text."""
        return subprocess.run([NSENTER, "-t", str(self.init_pid), "-a", *argv], input=input,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def known_hosts_line(self) -> str:
        return sshd.host_key_line(self.ssh_port, self.host_key_pub)

    def stop(self) -> None:
        stop_root(self)


def require_nspawn() -> None:
    """One clear line when the machine cannot boot a container (tool missing, not root)."""
    if shutil.which(NSPAWN) is None:
        raise GpuopsError(f"lab: {NSPAWN} not found: install it ({INSTALL_HINT})")
    if shutil.which(NSENTER) is None:
        raise GpuopsError(f"lab: {NSENTER} not found (util-linux)")
    if os.geteuid() != 0:
        raise GpuopsError("lab: booting a container with systemd-nspawn needs root")


def boot_root(lower: Path, workdir: Path, authorized_key: str, ssh_port: int | None = None,
              binds: Sequence[tuple[Path, str]] = (), sshd_extra: str = "") -> BootedRoot:
    """Boot an overlay of ``lower`` in ``workdir`` (a fresh dir); wait until systemd and sshd run.

    ``authorized_key``: the public key line root accepts. ``binds``: (outside, inside) read-only
    bind mounts (e.g. the SGLang release cache). ``sshd_extra``: more sshd_config lines.
    Raises ``GpuopsError`` with the boot log's tail.
    """
    require_nspawn()
    workdir = Path(workdir).absolute()
    upper, work, merged = workdir / "upper", workdir / "work", workdir / "root"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    if mount.returncode != 0:
        raise GpuopsError(f"lab: cannot mount an overlay on {lower}: {mount.stderr.strip()}")
    try:
        port = ssh_port or sshd.free_port()
        host_key_pub = _prepare(merged, workdir, authorized_key, port, sshd_extra)
        log = workdir / "nspawn.log"
        machine = f"gpuops-lab-{os.getpid()}-{port}"
        command = [NSPAWN, "-D", str(merged), "--boot", "--register=no", "--keep-unit", "--quiet",
                   "--console=pipe", f"--machine={machine}"]
        for outside, inside in binds:
            command.append(f"--bind-ro={outside}:{inside}")
        # With --keep-unit the container's cgroup tree hangs below nspawn's own cgroup: started
        # from a shared one, every container's /system.slice/sglang.service would be one cgroup
        # (systemd then sees other containers' processes in its units). A cgroup of its own each.
        groups = _own_cgroups(machine)
        (workdir / "cgroups").write_text("".join(f"{g}\n" for g in groups))
        enter = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 97; shift; done; shift; exec "$@"'
        with open(log, "ab") as handle:
            child = subprocess.Popen(["/bin/sh", "-c", enter, "sh", *groups, "--", *die_with_parent(command)],
                                     stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                     start_new_session=True, close_fds=True)
        (workdir / "nspawn.pid").write_text(f"{child.pid}\n")
        try:
            init_pid = _wait_for_init(child, log)
            booted = BootedRoot(dir=workdir, merged=merged, nspawn_pid=child.pid, init_pid=init_pid,
                                ssh_port=port, host_key_pub=host_key_pub)
            _wait_running(booted, child, log)
        except BaseException:
            _terminate(child.pid)
            raise
        return booted
    except BaseException:
        _umount(merged)
        _remove_cgroups(workdir)
        raise


def die_with_parent(command: list[str]) -> list[str]:
    """``command`` set to get SIGTERM when the process that started it dies (a test run killed
    without its teardown): an orphaned container or daemon then shuts itself down. Uses
    util-linux's setpriv where it is installed; the command as it is otherwise."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)


def _own_cgroups(name: str) -> list[str]:
    """A fresh cgroup named ``name`` below ours in each hierarchy systemd uses (the named v1
    ``name=systemd`` one, and cgroup2, unified or not); returns their directories."""
    mine: dict[str, str] = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            mine[controllers] = path
    candidates = []
    if "name=systemd" in mine and os.path.isfile("/sys/fs/cgroup/systemd/cgroup.procs"):
        candidates.append("/sys/fs/cgroup/systemd" + mine["name=systemd"])
    if "" in mine:
        for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            if os.path.isfile(root + "/cgroup.controllers"):
                candidates.append(root + mine[""])
                break
    made = []
    for parent in candidates:
        path = os.path.join(parent, name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            continue  # not ours to create here: nspawn manages as it would have
        made.append(path)
    return made


def _remove_cgroups(workdir: Path) -> None:
    """Remove the container's cgroups (empty once it has stopped), deepest first."""
    try:
        groups = (workdir / "cgroups").read_text().split()
    except OSError:
        return
    for group in groups:
        for dirpath, _dirs, _files in sorted(os.walk(group), key=lambda entry: -len(entry[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def _prepare(merged: Path, workdir: Path, authorized_key: str, port: int, sshd_extra: str = "") -> Path:
    """This boot's sshd: loopback only, its own port and host key; root's authorized key."""
    key = merged / _HOST_KEY.lstrip("/")
    for stale in (key, key.with_name(key.name + ".pub")):
        stale.unlink(missing_ok=True)
    sshd.generate_key(key, "gpuops-lab-nspawn")
    conf = merged / "etc" / "ssh" / "sshd_config.d" / "10-gpuops-lab.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        "# This container shares the machine's network: loopback only, on the lab's own port.\n"
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {_HOST_KEY}\n" + sshd_extra
    )
    ssh_dir = merged / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(authorized_key.strip() + "\n")
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    return key.with_name(key.name + ".pub")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                out.extend(int(p) for p in handle.read().split())
    except OSError:
        pass
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _log_tail(log: Path, lines: int = 8) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def _wait_for_init(child: subprocess.Popen, log: Path) -> int:
    """The container's PID 1 seen from outside: nspawn's child once it has exec'd systemd."""
    deadline = time.monotonic() + _BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise GpuopsError(f"lab: systemd-nspawn exited at boot (status {child.returncode}): {_log_tail(log)}")
        for pid in _children(child.pid):
            if _comm(pid) == "systemd":
                return pid
        time.sleep(0.05)
    raise GpuopsError(f"lab: the container's systemd did not start within {_BOOT_TIMEOUT_S:.0f} s: {_log_tail(log)}")


def _wait_running(booted: BootedRoot, child: subprocess.Popen, log: Path) -> None:
    """systemd has finished booting (``running``, or ``degraded`` when some unit failed) and
    sshd accepts connections on the lab's port."""
    deadline = time.monotonic() + _BOOT_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise GpuopsError(f"lab: the container stopped during boot: {_log_tail(log)}")
        try:
            state = booted.run(["systemctl", "is-system-running"], timeout=10).stdout.strip()
        except subprocess.TimeoutExpired:
            state = "timeout"
        if state in ("running", "degraded") and sshd._accepts(booted.ssh_port):
            return
        time.sleep(0.2)
    failed = booted.run(["systemctl", "--failed", "--no-legend", "--plain"], timeout=10).stdout.strip()
    raise GpuopsError(f"lab: the container did not finish booting within {_BOOT_TIMEOUT_S:.0f} s "
                      f"(state {state!r}; failed units: {failed or 'none'}; sshd port {booted.ssh_port})")


def _terminate(pid: int, grace: float = _STOP_GRACE_S) -> None:
    terminate(pid, grace)  # nspawn turns SIGTERM into an orderly shutdown of the container's systemd


def _is_ours(booted: BootedRoot) -> bool:
    """The pid still runs nspawn on this root, or the overlay is still mounted (a pid is never
    signalled once it may belong to someone else)."""
    try:
        with open(f"/proc/{booted.nspawn_pid}/cmdline", "rb") as handle:
            if str(booted.merged).encode() in handle.read():
                return True
    except OSError:
        pass
    with open("/proc/self/mountinfo") as handle:
        mounted = any(line.split()[4] == str(booted.merged) for line in handle)
    if mounted:
        _umount(booted.merged)
    _remove_cgroups(booted.dir)
    return False


def _umount(merged: Path) -> None:
    done = subprocess.run(["umount", str(merged)], capture_output=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        # Still busy (a process outside held a file): detach it now, the kernel frees it later.
        subprocess.run(["umount", "-l", str(merged)], capture_output=True, stdin=subprocess.DEVNULL)


def stop_root(booted: BootedRoot) -> None:
    """Shut the container down (by nspawn's pid), unmount its overlay, remove its cgroups; the
    upper dir stays. Idempotent: a second call finds nothing left to do."""
    if not _is_ours(booted):
        return
    _terminate(booted.nspawn_pid)
    _umount(booted.merged)
    _remove_cgroups(booted.dir)
