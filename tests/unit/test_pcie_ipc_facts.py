"""Every fact gpuops/pcie_ipc.py (and the stand-in's copy) states about SGLang's PCIe IPC all-reduce,
held to the real releases: the sglang wheels 0.5.20-0.5.23 and the flashinfer-python wheels 0.6.18
and 0.7.0-0.7.2, downloaded from the package index at test time and cached under $GPUOPS_CACHE."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile

import pytest

from gpuops import pcie_ipc
from gpuops.lab.sglang_cache import cache_root, sglang_site
from gpuops.lab.standin_process import STANDIN_PATH

sys.path.insert(0, str(STANDIN_PATH.parent))
import standin_sim  # (the stand-in is run by path; its simulation is a sibling file)

WITH_IT = ("0.5.21", "0.5.22", "0.5.23")


def flashinfer_wheel(version: str) -> zipfile.ZipFile:
    """The real flashinfer-python wheel (read in place: only a few members are looked at)."""
    download = cache_root().parent / "flashinfer" / version / "download"
    found = sorted(download.glob(f"flashinfer_python-{version}-*.whl"))
    if not found:
        download.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-q", f"flashinfer-python=={version}", "-d", str(download)],
                       check=True, capture_output=True, timeout=900)
        found = sorted(download.glob(f"flashinfer_python-{version}-*.whl"))
    return zipfile.ZipFile(found[0])


def module_source(version: str) -> str:
    return (sglang_site(version) / "sglang" / pcie_ipc.SGLANG_MODULE).read_text()


def string_constants(source: str) -> list[str]:
    """Every string literal, implicit concatenations joined (as Python joins them)."""
    return [node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)]


def test_the_first_release_with_the_module_is_0_5_21() -> None:
    assert not (sglang_site("0.5.20") / "sglang" / pcie_ipc.SGLANG_MODULE).exists()
    assert pcie_ipc.FIRST_SGLANG == "0.5.21"
    for version in WITH_IT:
        assert (sglang_site(version) / "sglang" / pcie_ipc.SGLANG_MODULE).is_file(), version


@pytest.mark.parametrize("version", WITH_IT)
def test_world_sizes_dtype_and_log_lines_are_the_releases_own(version: str) -> None:
    source = module_source(version)
    sizes = re.search(r"^_SUPPORTED_WORLD_SIZES = \(([^)]*)\)", source, re.M)
    from gpuops.gates.catalog import load_catalog

    (rule,) = [f for f in load_catalog().feature("pcie_ipc_allreduce").fits if f.kind == "tp_size"]
    assert sizes and [int(s) for s in sizes.group(1).split(",")] == [int(v) for v in rule.value]
    strings = string_constants(source)
    assert pcie_ipc.FALLBACK_LINE in strings
    assert pcie_ipc.FALLBACK_LINE == standin_sim.PCIE_IPC_FALLBACK
    assert any(s.startswith(pcie_ipc.ENABLED_LINE) for s in strings)
    assert standin_sim.PCIE_IPC_ENABLED in strings  # the stand-in logs the release's own format
    assert pcie_ipc.WORKSPACE_FAILED.search("FlashInfer PCIe-IPC workspace (max_numel=%d) failed: %s; "
                                            "reductions stay on NCCL".replace("%d", "64").replace("%s", "x"))
    assert any(s.startswith("FlashInfer PCIe-IPC workspace (max_numel=%d) failed") for s in strings)
    assert "inp.dtype is not torch.bfloat16" in source
    assert "deterministic=self._deterministic_collectives_enabled()" in (
        sglang_site(version) / "sglang" / "srt" / "distributed" / "parallel_state.py").read_text()
    environ = (sglang_site(version) / "sglang" / "srt" / "environ.py").read_text()
    assert f"{pcie_ipc.ENABLE_ENV} = EnvBool(False)" in environ
    assert f"{pcie_ipc.MAX_NUMEL_ENV} = EnvInt(0)" in environ


def test_published_figures_are_the_docstrings() -> None:
    doc = ast.get_docstring(ast.parse(module_source("0.5.23"))) or ""
    for message, (flashinfer_us, nccl_us) in pcie_ipc.PUBLISHED_PER_CALL_US.items():
        assert re.search(rf"^{re.escape(message)}\s+{flashinfer_us} us\s+{nccl_us} us", doc, re.M), message
    nccl_ms, decode_sized_ms = pcie_ipc.PUBLISHED_TPOT_MS
    assert re.search(rf"^NCCL only\s+\d+ ms\s+{nccl_ms} ms", doc, re.M)
    assert re.search(rf"^decode-sized\s+\d+ ms\s+{decode_sized_ms} ms", doc, re.M)
    assert "8x SM120 host" in doc


def test_the_pins_and_the_first_flashinfer_with_pcie_ipc_comm() -> None:
    def pin(version: str) -> str:
        metadata = next(sglang_site(version).glob("sglang-*.dist-info")) / "METADATA"
        found = re.search(r"^Requires-Dist: flashinfer_python(?:\[[^\]]*\])?==([^\s;]+)", metadata.read_text(), re.M)
        assert found, version
        return found.group(1)

    assert pin("0.5.21") == "0.6.18"
    assert pin(pcie_ipc.RECOMMENDED_SGLANG) == pcie_ipc.RECOMMENDED_FLASHINFER
    assert pcie_ipc.FLASHINFER_MODULE not in flashinfer_wheel("0.6.18").namelist()
    assert pcie_ipc.FIRST_FLASHINFER == "0.7.0"
    for version in ("0.7.0", pcie_ipc.RECOMMENDED_FLASHINFER):
        wheel = flashinfer_wheel(version)
        assert pcie_ipc.FLASHINFER_MODULE in wheel.namelist(), version
        exports = wheel.read("flashinfer/comm/__init__.py").decode()
        assert "PcieIpcAllReduceWorkspace as PcieIpcAllReduceWorkspace" in exports, version
