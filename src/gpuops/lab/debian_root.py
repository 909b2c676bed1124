"""A small Debian root filesystem, built once with debootstrap and cached, for lab hosts that run
a real service manager (systemd booted by ``systemd-nspawn``, or a docker image made from it).

Never boot systemd over the machine's own root: its boot units wipe ``/tmp`` and rewrite ``/etc``
for every process on the machine. A root of its own keeps every write inside it; and the cached
root is never booted itself, only an overlay on top of it (see ``gpuops.lab.nspawn``), so any
number of test sessions can share it.

The root lives in ``$GPUOPS_CACHE/rootfs/<key>/root`` (default ``~/.cache/gpuops/rootfs``), where
``<key>`` names the suite and a hash of the package list. Tests run in parallel processes: the
build is guarded by an exclusive file lock and finished by an atomic rename, so a reader sees a
complete root or none. The mirror is the one this machine's apt sources name, read at build time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from gpuops.errors import GpuopsError
from gpuops.lab.file_lock import exclusive_lock
from gpuops.frozen import frozen

# What a lab host that runs systemd needs: an init, a bus, the host's python, an SSH server.
# procps: `ps`/`pkill` for anyone debugging inside; iproute2: `ss` to see who owns a port.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "openssh-server", "procps", "iproute2")
DEBOOTSTRAP = "debootstrap"
INSTALL_HINT = "apt-get install -y debootstrap systemd-container"
_BUILD_TIMEOUT_S = 1800
# Units that only cost boot time (or touch hardware) in a throwaway test container.
_MASKED_UNITS = (
    "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
    "fstrim.timer", "systemd-timesyncd.service", "console-getty.service", "getty@.service",
    "systemd-networkd-wait-online.service", "man-db.timer", "dpkg-db-backup.timer",
    "ssh.socket",
)
# Written into the root once: what every lab container shares.
_SSHD_DROPIN = """# gpuops lab root: no DNS lookups, no message of the day; the port and host key of each
# booted container come from its own /etc/ssh/sshd_config.d/10-gpuops-lab.conf.
UseDNS no
PrintMotd no
PasswordAuthentication no
KbdInteractiveAuthentication no
"""


@frozen
class AptSource:
    uri: str
    suite: str


def cache_root() -> Path:
    """``$GPUOPS_CACHE/rootfs`` when set, else ``~/.cache/gpuops/rootfs``."""
    base = os.environ.get("GPUOPS_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops") / "rootfs"


def apt_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """Every (URI, suite) of the binary package sources this machine's apt reads, in order."""
    found: list[AptSource] = []
    files = [etc_apt / "sources.list"] + sorted((etc_apt / "sources.list.d").glob("*"))
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".sources":
            found.extend(_deb822_sources(text))
        elif path.name == "sources.list" or path.suffix == ".list":
            found.extend(_one_line_sources(text))
    return found


def _one_line_sources(text: str) -> list[AptSource]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        # deb [arch=amd64 signed-by=...] URI SUITE COMPONENTS...
        line = re.sub(r"\[[^\]]*\]", " ", line)
        words = line.split()
        if len(words) >= 3 and words[0] == "deb":
            out.append(AptSource(words[1], words[2]))
    return out


def _deb822_sources(text: str) -> list[AptSource]:
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                out.append(AptSource(uri, suite))
    return out


def main_source(sources: list[AptSource]) -> AptSource:
    """The release's own archive (``bookworm``, not ``bookworm-updates`` or the security one)."""
    for source in sources:
        if "-" not in source.suite and "/" not in source.suite and "security" not in source.uri:
            return source
    raise GpuopsError("lab: no Debian archive in /etc/apt/sources.list(.d) to debootstrap from")


def root_key(suite: str, packages: tuple[str, ...] = PACKAGES) -> str:
    digest = hashlib.sha256(("\n".join([suite, *sorted(packages), _SSHD_DROPIN, *_MASKED_UNITS])).encode())
    return f"{suite}-{digest.hexdigest()[:12]}"


def debian_root(packages: tuple[str, ...] = PACKAGES, progress: Callable[[str], None] | None = None) -> Path:
    """The cached root (a directory with ``usr/``, ``etc/``, ...); built first when missing."""
    source = main_source(apt_sources())
    release_dir = cache_root() / root_key(source.suite, packages)
    root = release_dir / "root"
    if _complete(root):
        return root
    release_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(release_dir / ".lock"):
        if _complete(root):  # another process built it while we waited
            return root
        if shutil.which(DEBOOTSTRAP) is None:
            raise GpuopsError(f"lab: {DEBOOTSTRAP} not found: install it ({INSTALL_HINT})")
        if progress:
            progress(f"building a Debian {source.suite} root in {root} (once; it is cached)")
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=release_dir))
        try:
            _debootstrap(source, packages, staging)
            _configure(staging)
            (staging / ".gpuops-root-complete").write_text(source.suite + "\n")
            if root.exists():
                shutil.rmtree(root)  # a half-renamed root from a killed run (we hold the lock)
            os.rename(staging, root)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return root


def _complete(root: Path) -> bool:
    return (root / ".gpuops-root-complete").is_file()


def _debootstrap(source: AptSource, packages: tuple[str, ...], target: Path) -> None:
    command = [DEBOOTSTRAP, "--variant=minbase", "--include=" + ",".join(packages),
               source.suite, str(target), source.uri]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuopsError(f"lab: debootstrap {source.suite} failed: {exc}") from None
    if done.returncode != 0:
        log = target / "debootstrap" / "debootstrap.log"
        text = log.read_text(errors="replace") if log.exists() else (done.stderr or done.stdout)
        last = (text.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise GpuopsError(f"lab: debootstrap {source.suite} failed: {last}")


def _configure(root: Path) -> None:
    """Once per cached root: mask what a test container never needs, quiet sshd."""
    etc_systemd = root / "etc" / "systemd" / "system"
    etc_systemd.mkdir(parents=True, exist_ok=True)
    for unit in _MASKED_UNITS:
        link = etc_systemd / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    (root / "etc" / "ssh" / "sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ssh" / "sshd_config.d" / "05-gpuops-lab-root.conf").write_text(_SSHD_DROPIN)
    # Each container gets its own host key; none is shared through the cache.
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    # An empty machine-id: systemd makes a transient one at each boot (containers stay distinct).
    (root / "etc" / "machine-id").write_text("")
