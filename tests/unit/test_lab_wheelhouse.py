"""The lab's wheelhouse (lab/wheelhouse.py::LabWheelhouse): which releases, which torch, where kept,
built once and whole. Built here from a fake release cache (GPUOPS_CACHE) holding a small real-shaped
sglang wheel: the build is the one `lab up` runs; its install on a lab host is test_quickstart's."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from gpuops.lab.wheelhouse import ADVISED_RELEASES, LabWheelhouse, write_wheel
from gpuops.pcie_ipc import RECOMMENDED_SGLANG


def test_the_advised_release_and_the_hosts_own_torch_for_its_driver() -> None:
    assert ADVISED_RELEASES == (RECOMMENDED_SGLANG,)  # what advise prints is what the lab can install
    house = LabWheelhouse.for_host("0.5.8", "12.8")
    assert house.releases == tuple(sorted({RECOMMENDED_SGLANG, "0.5.8"})) and house.torch_cuda == "cu128"
    assert LabWheelhouse.for_host(RECOMMENDED_SGLANG, "13.0") == LabWheelhouse((RECOMMENDED_SGLANG,), "cu130")


def _cached_release(cache: Path, version: str) -> None:
    """What sglang_cache keeps of a release: its unpacked site and the downloaded wheel."""
    release = cache / "sglang" / version
    (release / "site" / "sglang").mkdir(parents=True)
    (release / "site" / "sglang" / "__init__.py").write_text("")
    (release / "download").mkdir()
    write_wheel(release / "download", "sglang", version, {"sglang/__init__.py": b""},
                requires=["torch==2.9.1", "flashinfer-python==0.6.1"])


def test_built_once_in_the_cache_and_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path / "cache"))
    for version in ("0.5.8", RECOMMENDED_SGLANG):
        _cached_release(tmp_path / "cache", version)
    house = LabWheelhouse.for_host("0.5.8", "12.8")
    assert house.folder.parent == tmp_path / "cache" / "lab-wheelhouse" and not house.folder.exists()
    folder = house.build()
    assert folder == house.folder
    names = sorted(p.name for p in folder.iterdir())
    assert f"sglang-{RECOMMENDED_SGLANG}-py3-none-any.whl" in names and "sglang-0.5.8-py3-none-any.whl" in names
    torch = next(folder.glob("torch-2.9.1+cu128-*.whl"))
    with zipfile.ZipFile(torch) as archive:
        assert "torch/version.py" in archive.namelist()
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.") and p.is_dir()] == []
    stamp = folder.stat().st_mtime_ns
    assert house.build() == folder and folder.stat().st_mtime_ns == stamp  # kept, not rebuilt
