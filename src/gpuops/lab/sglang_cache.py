"""A local cache of real SGLang releases (and of the FlashInfer releases they pin), unpacked from
their PyPI wheels.

Tests and the lab read real SGLang source (never a copy committed here). Each release is fetched
once with ``pip download --no-deps`` and its wheel unpacked into ``<cache>/<version>/site/``, which
holds ``sglang/`` and ``sglang-<version>.dist-info/`` so that a python with that dir on its
``PYTHONPATH`` sees both the package and its version through ``importlib.metadata``.
``flashinfer_site`` does the same for ``flashinfer-python`` under ``$GPUOPS_CACHE/flashinfer``:
its Python package and ``.dist-info`` only (not ``flashinfer/data/``, the C++ sources and headers
its JIT compiles from, ~400 MB in 0.7.2, which nothing here reads).

Tests run in parallel processes, so the fill is guarded by an exclusive file lock and finished by
an atomic rename: a reader either sees a complete ``site/`` or none at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gpuops.errors import GpuopsError
from gpuops.lab.file_lock import exclusive_lock

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$")
_DOWNLOAD_TIMEOUT_S = 600


def cache_root() -> Path:
    """``$GPUOPS_CACHE/sglang`` when set, else ``~/.cache/gpuops/sglang``."""
    base = os.environ.get("GPUOPS_CACHE")
    if base:
        return Path(base).expanduser() / "sglang"
    return Path.home() / ".cache" / "gpuops" / "sglang"


def sglang_site(version: str) -> Path:
    """The unpacked wheel of sglang==``version``: a dir with ``sglang/`` and its ``.dist-info``."""
    return _release_site("sglang", "sglang", version, cache_root() / version)


def flashinfer_site(version: str) -> Path:
    """The unpacked wheel of flashinfer-python==``version`` (without ``flashinfer/data/``): a dir
    with ``flashinfer/`` and ``flashinfer_python-<version>.dist-info``."""
    return _release_site("flashinfer-python", "flashinfer", version, cache_root().parent / "flashinfer" / version,
                         skip=("flashinfer/data/",))


# What sgl_kernel_site leaves out of the wheel (1.6 GB unpacked): the flash-attention extension
# (850 MB), the sm90/ build of common_ops (sgl-kernel loads sm100/ on every GPU but sm90, and the
# two list the same architectures in 0.3.21), the bundled DeepGEMM and mscclpp, headers.
_SGL_KERNEL_SKIP = ("sgl_kernel/flash_ops", "sgl_kernel/sm90/", "deep_gemm/", "lib/", "lib64/", "include/",
                    "share/", "_mscclpp", "mscclpp")


def sgl_kernel_site(version: str) -> Path:
    """The unpacked wheel of sgl-kernel==``version`` (its Python files, its sm100/ common_ops build
    and its small extensions; the largest members left out: ``_SGL_KERNEL_SKIP``), under
    ``$GPUOPS_CACHE/sgl-kernel``: the compiled architectures the probe reads are the real build's."""
    return _release_site("sgl-kernel", "sgl_kernel", version, cache_root().parent / "sgl-kernel" / version,
                         skip=_SGL_KERNEL_SKIP)


def sglang_kernel_site(version: str) -> Path:
    """The same for sglang-kernel==``version``, sgl-kernel's later name (SGLang 0.5.23 pins 0.4.10):
    the same import name and layout, under ``$GPUOPS_CACHE/sglang-kernel``."""
    return _release_site("sglang-kernel", "sgl_kernel", version, cache_root().parent / "sglang-kernel" / version,
                         skip=_SGL_KERNEL_SKIP)


def _release_site(dist: str, package: str, version: str, release_dir: Path, skip: tuple[str, ...] = ()) -> Path:
    if not _VERSION_RE.match(version):
        raise GpuopsError(f"{package} cache: {version!r} is not a release version")
    site = release_dir / "site"
    if (site / package / "__init__.py").is_file():
        return site
    release_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(release_dir / ".lock"):
        # Another process may have filled it while we waited for the lock.
        if (site / package / "__init__.py").is_file():
            return site
        wheel = _download_wheel(version, release_dir, dist)
        _unpack_atomically(wheel, site, package, skip)
    return site


def _pip_reason(stderr: str, dist: str = "sglang") -> str:
    """pip's own reason, with what the index offered when it answered (so "no such release" and
    "no index reachable", which end on the same last line, read differently)."""
    lines = stderr.strip().splitlines() or ["no wheel downloaded"]
    for line in lines:
        offered = re.search(r"\(from versions: ([^)]*)\)", line)
        if offered:
            versions = [v.strip() for v in offered.group(1).split(",") if v.strip() and v.strip() != "none"]
            if not versions:
                return f"the package index offered no {dist} release (is it reachable?)"
            return f"no such release (the package index offers {len(versions)}: {versions[0]} ... {versions[-1]})"
    return lines[-1]


def sglang_wheel(version: str) -> Path:
    """The release's own wheel, as downloaded (the lab's wheelhouse installs it as it is)."""
    site = sglang_site(version)
    wheel = _find_wheel(site.parent / "download", version)
    if wheel is None:
        raise GpuopsError(f"sglang cache: {site.parent}: the wheel of sglang {version} is no longer there")
    return wheel


def sglang_source(version: str) -> Path:
    """The unpacked ``sglang`` package dir (the one with ``__init__.py``) of that release."""
    return sglang_site(version) / "sglang"


def _download_wheel(version: str, release_dir: Path, dist: str = "sglang") -> Path:
    download_dir = release_dir / "download"
    existing = _find_wheel(download_dir, version, dist)
    if existing is not None:
        return existing
    download_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-q", f"{dist}=={version}", "-d", str(download_dir),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuopsError(f"{dist} cache: pip download {dist}=={version} failed: {exc}") from None
    wheel = _find_wheel(download_dir, version, dist)
    if done.returncode != 0 or wheel is None:
        raise GpuopsError(f"{dist} cache: pip download {dist}=={version} failed: {_pip_reason(done.stderr, dist)}")
    return wheel


def _find_wheel(download_dir: Path, version: str, dist: str = "sglang") -> Path | None:
    if not download_dir.is_dir():
        return None
    wheels = sorted(download_dir.glob(f"{re.sub(r'[-_.]+', '_', dist)}-{version}-*.whl"))
    return wheels[0] if wheels else None


def _unpack_atomically(wheel: Path, site: Path, package: str = "sglang", skip: tuple[str, ...] = ()) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=site.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as archive:
                _check_member_paths(archive, wheel)
                archive.extractall(staging, [n for n in archive.namelist() if not n.startswith(skip)])
        except zipfile.BadZipFile as exc:
            wheel.unlink(missing_ok=True)  # so that the next call downloads it again
            raise GpuopsError(f"{package} cache: {wheel}: not a readable wheel ({exc})") from None
        if not (staging / package / "__init__.py").is_file():
            raise GpuopsError(f"{package} cache: {wheel}: no {package}/__init__.py inside")
        if site.exists():
            shutil.rmtree(site)  # a half-made site from a killed run (we hold the lock)
        os.rename(staging, site)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _check_member_paths(archive: zipfile.ZipFile, wheel: Path) -> None:
    # A wheel is data from the network: refuse members that would land outside the site dir.
    for name in archive.namelist():
        parts = Path(name).parts
        if name.startswith("/") or ".." in parts:
            raise GpuopsError(f"sglang cache: {wheel}: unsafe member path {name!r}")
