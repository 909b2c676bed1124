"""A wheelhouse a lab host can install an SGLang release from, for real, with no network.

It holds the release's own wheel, unchanged (from the release cache, ``sglang_cache.py``), and one
**stand-in** wheel for each package the release requires: the same name, the release's pinned
version (or one its specifier admits), no code, ``Summary: gpuops lab stand-in``. ``pip install``
resolves the release against them as it would against an index, so the new environment holds
exactly the release's pins. Two stand-ins carry a little more:

- ``torch``: ``torch/version.py`` with the CUDA build of its version tag (``+cu130`` -> ``13.0``), as
  the lab's site dirs have it (``site.write_torch``), and a requirement on ``gpuops-lab-launch``;
- ``gpuops-lab-launch``: a ``.pth`` hook that turns ``python -m sglang.launch_server FLAGS`` (or
  ``python ENV/bin/sglang serve FLAGS``, the release's recommended entrypoint) of the
  environment's python into the lab's stand-in server (``$GPUOPS_LAB_DIR/lib/standin_server.py``),
  as ``bin/python-sglang`` does for the host's own site. The stand-in then serves the release the
  environment holds (it reads ``importlib.metadata.version("sglang")``).

``LabWheelhouse`` keeps one such wheelhouse per (releases, torch CUDA) in the user's cache
(``$GPUOPS_CACHE/lab-wheelhouse``), built once; ``gpuops lab up`` names it in the lab's inventory as
``sglang_wheelhouse``, the variable an operator whose hosts have no index sets to a folder of wheels,
so ``gpuops apply sglang-release`` on a lab host installs from it as it would on such a host. Never
committed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable, Mapping

from gpuops import pcie_ipc
from gpuops.lab.file_lock import exclusive_lock
from gpuops.lab.sglang_cache import cache_root, sglang_wheel
from gpuops.lab.site import write_torch
from gpuops.release.wheel import Requirement, canonical, parse_requires
from gpuops.frozen import frozen

STANDIN_SUMMARY = "gpuops lab stand-in: the version and metadata only, not the real package"
LAUNCH_DIST = "gpuops-lab-launch"
_HOOK = '''# gpuops lab: runs the lab's stand-in server for `python -m sglang.launch_server` and `python .../bin/sglang serve`
# (see gpuops/lab/wheelhouse.py)
import os
import sys

_argv = list(getattr(sys, "orig_argv", None) or [])
_lab = os.environ.get("GPUOPS_LAB_DIR", "")
_serve = len(_argv) >= 3 and os.path.basename(_argv[1]) == "sglang" and _argv[2] == "serve"
if _lab and len(_argv) >= 3 and (_argv[1:3] == ["-m", "sglang.launch_server"] or _serve):
    _standin = os.path.join(_lab, "lib", "standin_server.py")
    os.execv(sys.executable, [sys.executable, _standin] + _argv[1:])
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(folder: Path, dist: str, version: str, files: Mapping[str, bytes] | None = None,
                requires: Iterable[str] = (), extras: Iterable[str] = ()) -> Path:
    """A pure-python wheel of ``dist`` ``version`` holding ``files`` (path -> bytes)."""
    stem = re.sub(r"[-_.]+", "_", dist)
    info = f"{stem}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: {STANDIN_SUMMARY}\n"
                + "".join(f"Provides-Extra: {e}\n" for e in extras)
                + "".join(f"Requires-Dist: {r}\n" for r in requires))
    members = dict(files or {})
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: gpuops-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members[f"{info}/INSTALLER"] = b"gpuops-lab\n"
    record = [_record_line(name, data) for name, data in sorted(members.items())] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def satisfying_version(requirement: Requirement) -> str:
    """A version the requirement admits: its pin, else its lower bound (a release, not a pre-release), else 1.0."""
    if requirement.pinned:
        return requirement.pinned
    lower = next((v for op, v in requirement.specs if op in (">=", "~=")), None)
    if lower is not None:
        # 4.0.0b18 -> 4.0.0 (a release above the pre-release; pip skips pre-releases); 0.0.9.post1 stays
        return re.sub(r"\.?(a|b|rc|dev)\d+$", "", lower) or lower
    above = next((v for op, v in requirement.specs if op == ">"), None)
    if above is not None:
        parts = [int(p) for p in re.findall(r"\d+", above)[:3]]
        parts[-1] += 1
        return ".".join(str(p) for p in parts)
    upper = next((v for op, v in requirement.specs if op in ("<", "<=")), None)
    if upper is not None:
        return "0.0.1"
    return "1.0"


def build_wheelhouse(folder: Path, versions: Iterable[str], torch_cuda: str = "cu130") -> Path:
    """Fill ``folder`` with the releases' own wheels and stand-ins for what they require."""
    folder.mkdir(parents=True, exist_ok=True)
    made: set[tuple[str, str]] = set()
    launch = write_wheel(folder, LAUNCH_DIST, "1.0", {
        "gpuops_lab_launch.py": _HOOK.encode(), "gpuops_lab_launch.pth": b"import gpuops_lab_launch\n"})
    del launch
    for version in versions:
        wheel = sglang_wheel(version)
        shutil.copy2(wheel, folder / wheel.name)
        with zipfile.ZipFile(wheel) as archive:
            meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.startswith("sglang-"))
            requires = parse_requires(archive.read(meta).decode("utf-8", "replace"))
        extras: dict[str, set[str]] = {}
        for r in requires:
            extras.setdefault(r.name, set()).update(r.extras)
        for r in requires:
            chosen = satisfying_version(r)
            if r.name == "torch":
                chosen = f"{chosen}+{torch_cuda}"
            if (r.name, chosen) in made:
                continue
            made.add((r.name, chosen))
            files: dict[str, bytes] = {}
            needs: list[str] = []
            if r.name == "torch":
                with tempfile.TemporaryDirectory() as tmp:
                    write_torch(Path(tmp), chosen)
                    files = {f"torch/{p.name}": p.read_bytes() for p in (Path(tmp) / "torch").iterdir()}
                needs = [LAUNCH_DIST]
            write_wheel(folder, canonical(r.name), chosen, files, needs, sorted(extras.get(r.name, ())))
    return folder


def torch_cuda_tag(driver_cuda: str) -> str:
    """``13.0`` -> ``cu130``: the torch build a driver of that CUDA runs (the new environment's check
    refuses a torch built for a newer CUDA than the host's driver)."""
    major, _, minor = driver_cuda.partition(".")
    return f"cu{int(major)}{int(minor or 0)}"


# The releases `gpuops advise` can tell a lab host to move to (its PCIe IPC all-reduce and fusion ways
# both name this one), so the lab can rehearse every command it prints.
ADVISED_RELEASES = (pcie_ipc.RECOMMENDED_SGLANG,)


@frozen
class LabWheelhouse:
    """A wheelhouse kept in the user's cache: these releases, torch built for ``torch_cuda``."""
    releases: tuple[str, ...]
    torch_cuda: str

    @classmethod
    def for_host(cls, host_sglang: str, driver_cuda: str) -> "LabWheelhouse":
        """The advised releases and the host's own (to move back by `apply sglang-release` too, not
        only by `gpuops rollback`), torch for the host's driver (the new environment's check refuses
        a torch built for a newer CUDA than the driver runs: ``13.0`` -> ``cu130``)."""
        major, _, minor = driver_cuda.partition(".")
        return cls(tuple(sorted({*ADVISED_RELEASES, host_sglang})), f"cu{int(major)}{int(minor or 0)}")

    @property
    def folder(self) -> Path:
        """Keyed by the releases, the torch build and this module's text (stand-ins made by another
        gpuops are another wheelhouse)."""
        key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
        return cache_root().parent / "lab-wheelhouse" / f"{'-'.join(self.releases)}-{self.torch_cuda}-{key}"

    def build(self) -> Path:
        """Built once, under a lock, renamed into place whole: a folder that is there is complete."""
        folder = self.folder
        if folder.is_dir():
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(folder.parent / f".{folder.name}.lock"):
            if folder.is_dir():
                return folder
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
            try:
                build_wheelhouse(staging, self.releases, self.torch_cuda)
                os.rename(staging, folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return folder
