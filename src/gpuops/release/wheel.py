"""An SGLang release's own wheel on the operator's machine, and what its metadata pins.

The wheel comes from the wheelhouse the operator names (``sglang_wheelhouse``: the same files the
host installs from), else ``pip download --no-deps`` (``sglang_index_url`` when set, else pip's own
index) into ``$GPUOPS_CACHE/releases/<version>/`` (default ``~/.cache/gpuops/releases``). A release
is immutable once published, so a wheel found there is used as is.

Only METADATA and the server's argument sources are read, straight from the zip: nothing is
unpacked or imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from dataclasses import field
from pathlib import Path

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc|\.post|\.dev)[0-9]+)*$")
# The GPU stack that moves with a release: its own `==` pins of these are installed explicitly
# and checked in the new environment before the switch.
STACK = ("sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "torch")
_DOWNLOAD_TIMEOUT_S = 600


def canonical(name: str) -> str:
    """PEP 503 name: ``flashinfer_python`` -> ``flashinfer-python``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@frozen
class Requirement:
    """One ``Requires-Dist`` line of the release (extras of the release itself are left out)."""
    name: str                     # canonical
    extras: tuple[str, ...]       # of the required package: flashinfer_python[cu13]
    specs: tuple[tuple[str, str], ...]
    marker: str                   # "" when none

    @property
    def pinned(self) -> str | None:
        return next((v for op, v in self.specs if op == "=="), None)


@frozen
class Release:
    """An SGLang release's wheel on the operator's machine, as read from the zip: its version, its
    ``Requires-Dist`` lines, and the server's argument sources (for ``release_flags``)."""

    version: str
    wheel: Path
    requires: tuple[Requirement, ...]
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)  # argument sources

    @property
    def pins(self) -> dict[str, str]:
        """The stack packages the release pins with ``==`` (canonical name -> version)."""
        return {r.name: r.pinned for r in self.requires if r.name in STACK and r.pinned and not r.marker}

    def install_requirements(self) -> list[str]:
        """What the new environment is installed from: the release and its stack pins, verbatim."""
        out = [f"sglang=={self.version}"]
        for r in self.requires:
            if r.name in self.pins:
                extras = f"[{','.join(r.extras)}]" if r.extras else ""
                out.append(f"{r.name}{extras}=={r.pinned}")
        return out


def parse_requires(metadata: str) -> tuple[Requirement, ...]:
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.split(":", 1)[1].strip()
        head, _, marker = text.partition(";")
        if "extra ==" in marker or "extra==" in marker:
            continue  # an optional part of the release, not installed by `pip install sglang==X`
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?\s*\(?([^)]*)\)?\s*$", head)
        if not match:
            continue
        extras = tuple(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
        specs = tuple((m.group(1), m.group(2).strip())
                      for m in re.finditer(r"(===|==|>=|<=|!=|~=|<|>)\s*([^,\s]+)", match.group(3)))
        out.append(Requirement(canonical(match.group(1)), extras, specs, marker.strip()))
    return tuple(out)


def cache_dir() -> Path:
    base = os.environ.get("GPUOPS_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gpuops") / "releases"


def _wheels_in(folder: Path, version: str) -> list[Path]:
    return sorted(folder.glob(f"sglang-{version}-*.whl")) if folder.is_dir() else []


def find_wheel(version: str, wheelhouse: str | None = None, index_url: str | None = None) -> Path:
    """The release's wheel on this machine (downloaded once when no wheelhouse is named)."""
    if not VERSION_RE.match(version):
        raise GpuopsError(f"sglang_version {version!r} is not a release version (such as 0.5.21)")
    if wheelhouse:
        folder = Path(wheelhouse).expanduser()
        if not folder.is_dir():
            raise GpuopsError(f"sglang_wheelhouse {wheelhouse}: not a directory on this machine")
        found = _wheels_in(folder, version)
        if not found:
            raise GpuopsError(f"sglang_wheelhouse {wheelhouse}: holds no wheel of sglang {version} "
                              f"(sglang-{version}-*.whl); no such release there")
        return found[0]
    folder = cache_dir() / version
    found = _wheels_in(folder, version)
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", f"sglang=={version}", "-d", str(folder)]
    if index_url:
        command[4:4] = ["--index-url", index_url]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuopsError(f"sglang {version}: cannot fetch the release's wheel: {exc}") from None
    found = _wheels_in(folder, version)
    if done.returncode != 0 or not found:
        lines = (done.stderr or "").strip().splitlines() or ["no wheel downloaded"]
        reason = next((ln for ln in lines if "from versions" in ln or "No matching distribution" in ln), lines[-1])
        raise GpuopsError(f"sglang {version}: no such release on the package index ({reason.strip()})")
    return found[0]


# The server's argument sources: 0.5.8 has every add_argument in server_args.py; later releases
# build most flags from annotated dataclass fields under arg_groups/.
_ARG_SOURCES = re.compile(r"^sglang/srt/(server_args\.py|arg_groups/.*\.py)$")


def read_release(version: str, wheel: Path) -> Release:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            meta = next((n for n in names if re.match(rf"^sglang-{re.escape(version)}\.dist-info/METADATA$", n)), None)
            if meta is None:
                raise GpuopsError(f"{wheel}: no sglang-{version}.dist-info/METADATA inside; not the release's wheel")
            metadata = archive.read(meta).decode("utf-8", "replace")
            sources = {n: archive.read(n).decode("utf-8", "replace") for n in names if _ARG_SOURCES.match(n)}
    except (OSError, zipfile.BadZipFile) as exc:
        raise GpuopsError(f"{wheel}: not a readable wheel ({exc})") from None
    return Release(version, wheel, parse_requires(metadata), sources)


_MEMO: dict[tuple[str, str | None, str | None], Release] = {}


def release(version: str, wheelhouse: str | None = None, index_url: str | None = None) -> Release:
    """The release read from its wheel (once per process and source)."""
    key = (version, wheelhouse or None, index_url or None)
    if key not in _MEMO:
        _MEMO[key] = read_release(version, find_wheel(version, wheelhouse, index_url))
    return _MEMO[key]
