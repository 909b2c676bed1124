"""A wheelhouse a lab host can install an SGLang release from, for real, with no network.

It holds the release's own wheel, unchanged (from the release cache, ``sglang_cache.py``), and one
**stand-in** wheel for each package the release requires: the same name, the release's pinned
version (or one its specifier admits), no code, ``Summary: gpuops lab stand-in``. ``pip install``
resolves the release against them as it would against an index, so the new environment holds
exactly the release's pins. Two stand-ins carry a little more:

- ``torch``: ``torch/version.py`` with the CUDA build of its version tag (``+cu130`` -> ``13.0``), as
  the lab's site dirs have it (``site.write_torch``), and a requirement on ``gpuops-lab-launch``;
- ``gpuops-lab-launch``: a ``.pth`` hook that turns ``python -m sglang.launch_server FLAGS`` of the
  environment's python into the lab's stand-in server (``$GPUOPS_LAB_DIR/lib/standin_server.py``),
  as ``bin/python-sglang`` does for the host's own site. The stand-in then serves the release the
  environment holds (it reads ``importlib.metadata.version("sglang")``).

Built at test time (or by whoever wants a lab host to take a release change), never committed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable, Mapping

from gpuops.lab.site import write_torch
from gpuops.release.wheel import Requirement, canonical, parse_requires

STANDIN_SUMMARY = "gpuops lab stand-in: the version and metadata only, not the real package"
LAUNCH_DIST = "gpuops-lab-launch"
_HOOK = '''# gpuops lab: runs the lab's stand-in server for `python -m sglang.launch_server` (see gpuops/lab/wheelhouse.py)
import os
import sys

_argv = list(getattr(sys, "orig_argv", None) or [])
_lab = os.environ.get("GPUOPS_LAB_DIR", "")
if _lab and len(_argv) >= 3 and _argv[1:3] == ["-m", "sglang.launch_server"]:
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
    from gpuops.lab.sglang_cache import sglang_wheel

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
