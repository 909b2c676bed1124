"""A lab host's Python site dir: the real SGLang release plus simulated GPU-stack distributions.

The SGLang files are hard links into the release cache: creating thousands of them per host is
fast and costs no space. That is safe because gpuops (and every well-behaved patcher) writes a
changed file to a temp name and renames it over the old one, which replaces the link instead of
writing through it. Tools that edit files in place would change the cache: do not point them here.

The other distributions (torch, flashinfer-python, sgl-kernel, nvidia-nccl-cuXX, ...) exist only
as ``.dist-info/METADATA`` (so ``importlib.metadata`` and ``pip list`` see the versions) plus the
few files gpuops reads: ``torch/version.py`` (``cuda = "12.8"``) and NCCL's ``nccl.h`` version macros.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

from gpuops.errors import GpuopsError
from gpuops.facts.software_stack import parse_requirement

_SIMULATED_NOTE = "# Simulated by gpuops lab: not the real package, only its version data.\n"


def link_tree(source: Path, target: Path) -> int:
    """Recreate ``source`` under ``target`` with hard links to its files; returns the file count."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(source):
        rel = os.path.relpath(dirpath, source)
        out_dir = target if rel == "." else target / rel
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = os.path.join(dirpath, name)
            dst = out_dir / name
            try:
                os.link(src, dst)
            except OSError:
                # Another filesystem (cache on a different mount): fall back to a copy.
                import shutil

                shutil.copy2(src, dst)
            count += 1
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
    return count


def dist_info_name(dist: str, version: str) -> str:
    """``flashinfer-python``, ``0.6.1`` -> ``flashinfer_python-0.6.1.dist-info`` (wheel naming)."""
    return f"{re.sub(r'[-_.]+', '_', dist)}-{version}.dist-info"


def write_dist_info(site: Path, dist: str, version: str) -> Path:
    info = site / dist_info_name(dist, version)
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        "Summary: simulated by gpuops lab (version data only)\n"
    )
    (info / "INSTALLER").write_text("gpuops-lab\n")
    (info / "RECORD").write_text("")
    return info


def torch_cuda_version(torch_version: str) -> str | None:
    """``2.9.1+cu128`` -> ``12.8``; ``2.11.0+cu130`` -> ``13.0``; no ``+cuXXX`` -> None."""
    match = re.search(r"\+cu(\d+)(\d)$", torch_version)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def write_torch(site: Path, version: str) -> None:
    package = site / "torch"
    package.mkdir(parents=True, exist_ok=True)
    cuda = torch_cuda_version(version)
    (package / "version.py").write_text(
        _SIMULATED_NOTE
        + "from typing import Optional\n\n"
        + "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']\n"
        + f"__version__ = {version!r}\n"
        + "debug = False\n"
        + f"cuda: Optional[str] = {cuda!r}\n"
        + "git_version = '0000000000000000000000000000000000000000'\n"
        + "hip: Optional[str] = None\n"
        + "xpu: Optional[str] = None\n"
    )
    (package / "__init__.py").write_text(
        _SIMULATED_NOTE + "from torch import version as version\n__version__ = version.__version__\n"
    )


def write_nccl_header(site: Path, version: str) -> None:
    parts = (version.split(".") + ["0", "0"])[:3]
    if not all(p.isdigit() for p in parts):
        return
    major, minor, patch = (int(p) for p in parts)
    include = site / "nvidia" / "nccl" / "include"
    include.mkdir(parents=True, exist_ok=True)
    (include / "nccl.h").write_text(
        "/* Simulated by gpuops lab: only the version macros of NCCL's header. */\n"
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        '#define NCCL_SUFFIX ""\n'
        f"#define NCCL_VERSION_CODE {major * 10000 + minor * 100 + patch}\n"
    )


def build_site(site: Path, sglang_site: Path | None, packages: Mapping[str, str],
               flashinfer_site: Path | None = None) -> int:
    """Fill ``site`` (a fresh dir); returns how many SGLang files were linked. ``flashinfer_site``:
    a real FlashInfer release's unpacked wheel, linked in as the SGLang release is (then no
    simulated flashinfer-python version data is written)."""
    site.mkdir(parents=True, exist_ok=True)
    linked = 0
    if sglang_site is not None:
        if not (sglang_site / "sglang" / "__init__.py").is_file():
            raise GpuopsError(f"lab: {sglang_site} holds no sglang package")
        linked = link_tree(sglang_site, site)
    if flashinfer_site is not None:
        if not (flashinfer_site / "flashinfer" / "__init__.py").is_file():
            raise GpuopsError(f"lab: {flashinfer_site} holds no flashinfer package")
        link_tree(flashinfer_site, site)
    for dist, version in packages.items():
        if dist == "sglang" or (dist == "flashinfer-python" and flashinfer_site is not None):
            continue  # the real release's own .dist-info came with the link tree
        write_dist_info(site, dist, version)
        if dist == "torch":
            write_torch(site, version)
        elif dist.startswith("nvidia-nccl-"):
            write_nccl_header(site, version)
    return linked


def release_stack(sglang_site: Path, packages: Mapping[str, str]) -> dict[str, str]:
    """``packages`` with flashinfer, sgl-kernel / sglang-kernel and torch set to what the release
    in ``sglang_site`` pins in its own metadata (``==`` pins only), so a lab host on another release
    than its description's shows a consistent stack. torch keeps the description's CUDA build tag
    (``+cu128``): that is the host's, not the release's."""
    import re

    metadata = next(iter(sorted(sglang_site.glob("sglang-*.dist-info/METADATA"))), None)
    if metadata is None:
        return dict(packages)
    out = dict(packages)
    for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        name, specs = parse_requirement(line.split(":", 1)[1])
        pinned = next((v for op, v in specs if op == "=="), None)
        if pinned is None or name not in ("flashinfer-python", "sgl-kernel", "sglang-kernel", "torch"):
            continue
        if name == "torch":
            tag = re.search(r"\+cu\d+$", out.get("torch", ""))
            pinned += tag.group(0) if tag else ""
        if name in ("sgl-kernel", "sglang-kernel"):
            out.pop("sgl-kernel", None)
            out.pop("sglang-kernel", None)
        out[name] = pinned
    return out
