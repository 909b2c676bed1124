"""The SGLang release cache: a real download from the package index, shared by parallel processes."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuops.errors import GpuopsError
from gpuops.lab import sglang_cache

pytestmark = pytest.mark.integration

SMALL = "0.4.0"  # a ~0.5 MB wheel


def _fill(cache: str) -> str:
    code = "from gpuops.lab.sglang_cache import sglang_site; print(sglang_site(%r))" % SMALL
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GPUOPS_CACHE": cache})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_parallel_processes_share_one_unpacked_release(tmp_path):
    cache = str(tmp_path / "cache")
    with ThreadPoolExecutor(3) as pool:
        sites = list(pool.map(_fill, [cache] * 3))
    assert len(set(sites)) == 1
    site = sites[0]
    assert site == str(tmp_path / "cache" / "sglang" / SMALL / "site")
    assert os.path.isfile(os.path.join(site, "sglang", "__init__.py"))
    assert sorted(n for n in os.listdir(os.path.join(site)) if n.endswith(".dist-info")) == [f"sglang-{SMALL}.dist-info"]
    leftovers = [n for n in os.listdir(tmp_path / "cache" / "sglang" / SMALL) if n.startswith(".unpack-")]
    assert leftovers == []
    # Another python sees the release's version through importlib.metadata with the site on its path.
    version = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": site}, cwd=str(tmp_path))
    assert version.stdout.strip() == SMALL


def test_a_version_that_does_not_exist_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path))
    # The index must have answered: offline, pip fails too, but the index offered nothing.
    with pytest.raises(GpuopsError, match=r"pip download sglang==0\.0\.999 failed: no such release "
                                          r"\(the package index offers \d+: 0\.\S+ \.\.\. \d+\.\S+\)"):
        sglang_cache.sglang_site("0.0.999")
    assert not (tmp_path / "sglang" / "0.0.999" / "site").exists()


def test_a_bad_version_string_never_reaches_pip(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path))
    with pytest.raises(GpuopsError, match="is not a release version"):
        sglang_cache.sglang_source("0.5.8; rm -rf /")
    assert not (tmp_path / "sglang").exists()


def test_a_corrupt_wheel_is_refused_and_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path))
    download = tmp_path / "sglang" / "9.9.9" / "download"
    download.mkdir(parents=True)
    wheel = download / "sglang-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"not a zip")
    with pytest.raises(GpuopsError, match="not a readable wheel"):
        sglang_cache.sglang_site("9.9.9")
    assert not wheel.exists()


def test_a_wheel_with_escaping_paths_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_CACHE", str(tmp_path))
    download = tmp_path / "sglang" / "9.9.8" / "download"
    download.mkdir(parents=True)
    with zipfile.ZipFile(download / "sglang-9.9.8-py3-none-any.whl", "w") as archive:
        archive.writestr("sglang/__init__.py", "")
        archive.writestr("../../evil.py", "x = 1")
    with pytest.raises(GpuopsError, match="unsafe member path"):
        sglang_cache.sglang_site("9.9.8")
    assert not (tmp_path / "sglang" / "evil.py").exists()
