"""What the kernel libraries themselves admit, read from the real FlashInfer wheels (cached under
``$GPUOPS_CACHE/flashinfer``, never committed) by the very software probe a host runs, and judged
by ``gates/kernels.py``: the catalog's ``first`` versions are facts of these wheels, checked here."""

from __future__ import annotations

from pathlib import Path

import pytest
from labtools import probe_site

from gpuops.gates.catalog import load_catalog
from gpuops.gates.kernels import KernelStatus, judge_feature, versions_of
from gpuops.lab.sglang_cache import flashinfer_site, sglang_site

pytestmark = pytest.mark.integration

# FlashInfer release -> the majors gen_trtllm_comm_module builds for (read from each wheel by hand:
# `supported_major_versions=[...]` in flashinfer/jit/comm.py), and whether it has pcie_ipc_comm.
WHEELS = {
    "0.6.1": ([9, 10], False),
    "0.6.13": ([9, 10], False),
    "0.6.16.post4": ([9, 10], False),   # the last release before 0.6.17
    "0.6.17": ([9, 10, 12], False),     # the first that builds the fused kernel for major 12
    "0.6.18": ([9, 10, 12], False),     # what SGLang 0.5.20 and 0.5.21 pin: no PcieIpcAllReduceWorkspace
    "0.7.0": ([9, 10, 12], True),       # the first with PcieIpcAllReduceWorkspace
    "0.7.2": ([9, 10, 12], True),       # what SGLang 0.5.23 pins
}


@pytest.mark.parametrize("version", sorted(WHEELS))
def test_fusion_kernel_majors_read_from_the_real_wheel(version: str) -> None:
    majors, _ = WHEELS[version]
    packages = probe_site(flashinfer_site(version))
    assert packages.known and packages.kernels is not None
    fusion = load_catalog().feature("flashinfer_allreduce_fusion")
    for capability in ("9.0", "10.0", "12.0"):
        (verdict,) = judge_feature(fusion, packages.kernels, versions_of(packages), capability)
        assert verdict.read and verdict.version == version
        want = KernelStatus.OPEN if int(capability.split(".")[0]) in majors else KernelStatus.BLOCKED
        assert verdict.status is want, (capability, verdict.reason)
        assert verdict.where.startswith("flashinfer/jit/comm.py:") and verdict.line
        if want is KernelStatus.BLOCKED:
            assert f"FlashInfer {version} cannot build" in verdict.reason
            assert "FlashInfer 0.6.17 is the first that builds it for major 12" in verdict.reason
    # The line cited is the line of the list in that wheel.
    text = (flashinfer_site(version) / "flashinfer" / "jit" / "comm.py").read_text().splitlines()
    (verdict,) = judge_feature(fusion, packages.kernels, versions_of(packages), "12.0")
    assert f"supported_major_versions=[{', '.join(str(m) for m in majors)}]" in text[verdict.line - 1]


def test_the_catalogs_first_versions_are_the_wheels() -> None:
    """``first`` in catalog.yaml: the first wheel above that has it, the one before lacks it."""
    catalog = load_catalog()
    fusion = catalog.feature("flashinfer_allreduce_fusion").kernels[0]
    assert fusion.first == {12: "0.6.17"}
    ordered = sorted(WHEELS, key=lambda v: tuple(int(p) for p in v.replace("post", "").split(".")))
    first_12 = next(v for v in ordered if 12 in WHEELS[v][0])
    assert first_12 == "0.6.17" and ordered[ordered.index(first_12) - 1] == "0.6.16.post4"
    pcie = [n for f in catalog.features for n in f.kernels if n.name == "PcieIpcAllReduceWorkspace"]
    for need in pcie:
        assert need.first == next(v for v in ordered if WHEELS[v][1]) == "0.7.0"


@pytest.mark.parametrize("version", ["0.6.18", "0.7.0", "0.7.2"])
def test_pcie_ipc_workspace_read_from_the_real_wheel(version: str) -> None:
    catalog = load_catalog()
    needs = [(f, n) for f in catalog.features for n in f.kernels if n.name == "PcieIpcAllReduceWorkspace"]
    if not needs:
        pytest.fail("no catalog feature needs FlashInfer's PcieIpcAllReduceWorkspace")
    packages = probe_site(flashinfer_site(version))
    for feature, need in needs:
        verdict = next(v for v in judge_feature(feature, packages.kernels, versions_of(packages), "12.0")
                       if v.need == need)
        if WHEELS[version][1]:
            assert verdict.status is KernelStatus.OPEN and verdict.line, verdict.reason
        else:
            assert verdict.status is KernelStatus.BLOCKED
            assert f"FlashInfer {version} has no PcieIpcAllReduceWorkspace" in verdict.reason
            assert "FlashInfer 0.7.0 is the first with it" in verdict.reason


def test_metadata_only_is_judged_by_the_version_rule_never_read(tmp_path) -> None:
    """A FlashInfer with its .dist-info but no package files (the lab's simulated stack): judged by
    the version rule (the catalog's first versions, the facts of the wheels above) and marked as not
    read. Below the first with the kernel is a known no (blocked: fusion-sm120 refuses on it), at or
    above it a yes; unknown only where no rule decides (no rule for this GPU's major)."""
    from gpuops.lab.site import write_dist_info

    fusion = load_catalog().feature("flashinfer_allreduce_fusion")
    got = {}
    for version in ("0.6.1", "0.6.16.post4", "0.6.17", "0.7.2"):
        site = tmp_path / version
        write_dist_info(site, "flashinfer-python", version)
        packages = probe_site(site)
        (verdict,) = judge_feature(fusion, packages.kernels, versions_of(packages), "12.0")
        assert not verdict.read and verdict.version == version, verdict
        got[version] = verdict
    for old in ("0.6.1", "0.6.16.post4"):
        assert got[old].status is KernelStatus.BLOCKED, got[old].reason
        assert got[old].reason.startswith(f"FlashInfer {old} lacks the fused all-reduce + RMSNorm kernel (trtllm_comm) "
                                          "for sm120 by its version (version rule: FlashInfer 0.6.17 is the first")
        assert "metadata only" in got[old].reason and got[old].first == "0.6.17"
    for new in ("0.6.17", "0.7.2"):
        assert got[new].status is KernelStatus.OPEN and "by its version" in got[new].reason, got[new].reason
    (sm90,) = judge_feature(fusion, probe_site(tmp_path / "0.6.1").kernels, {"flashinfer": "0.6.1"}, "9.0")
    assert sm90.status is KernelStatus.UNKNOWN and "no version rule" in sm90.reason


@pytest.mark.parametrize("version,has_pcie,custom_line", [("0.5.8", False, "custom_all_reduce.py:138"),
                                                          ("0.5.20", False, None), ("0.5.21", True, None),
                                                          ("0.5.23", True, "custom_all_reduce_utils.py:495")])
def test_sglang_reads_from_the_real_releases(version: str, has_pcie: bool, custom_line: str | None) -> None:
    """The SGLang side of the needs and fits, read from the real release by the same probe: the
    PCIe IPC module first in 0.5.21 (the catalog's `first`), the custom all-reduce's "more than two
    PCIe-only GPUs" line wherever it moved, the torch symmetric-memory table's keys."""
    from gpuops.gates.fits import HostShape, judge_fits

    catalog = load_catalog()
    packages = probe_site(sglang_site(version))
    pcie = catalog.feature("pcie_ipc_allreduce")
    module = next(n for n in pcie.kernels if n.provider == "sglang")
    assert module.first == "0.5.21"
    (verdict,) = [v for v in judge_feature(pcie, packages.kernels, versions_of(packages), "12.0") if v.need == module]
    assert verdict.status is (KernelStatus.OPEN if has_pcie else KernelStatus.BLOCKED), verdict.reason
    shape = HostShape(tp_size=8, nvlink=False, p2p_gaps=(), capability="12.0")
    if has_pcie:
        sizes = next(f for f in judge_fits(pcie, shape, packages.kernels) if f.fit.kind == "tp_size")
        assert sizes.holds is True and sizes.where and "pcie_ipc_ar.py:" in sizes.where
    limit = judge_fits(catalog.feature("custom_allreduce"), shape, packages.kernels)[0]
    assert limit.holds is False and limit.where is not None
    if custom_line:
        assert limit.where.endswith(custom_line), limit.where
    (symm,) = judge_fits(catalog.feature("torch_symm_mem"), shape, packages.kernels)
    assert symm.holds is False and "capability majors 9, 10" in symm.reason and symm.where.endswith("all_reduce_utils.py:3")


# (dist, version, FlashMLA's SASS): sgl-kernel 0.3.21 is SGLang 0.5.8's pin (536 MB), sglang-kernel
# 0.4.10 (its later name, 373 MB) SGLang 0.5.23's; both cached, their largest members left unpacked.
KERNEL_WHEELS = [("sgl-kernel", "0.3.21", [90, 100]), ("sglang-kernel", "0.4.10", [90, 100, 103])]


@pytest.mark.parametrize("dist, version, flashmla", KERNEL_WHEELS, ids=[w[1] for w in KERNEL_WHEELS])
def test_sgl_kernel_compiled_architectures_read_from_the_real_wheel(dist: str, version: str, flashmla: list[int]) -> None:
    """The real wheels (lab/sglang_cache.sgl_kernel_site / sglang_kernel_site): the software probe
    reads each build's .nv_fatbin. Their common_ops (the custom all-reduce's and the CUTLASS FP8
    kernels) carries SASS for sm_80, 89, 90, 100 and 120; their FlashMLA extension no sm120 code. A
    wrong offset in the fatbin reader, a wrong compatibility rule, or a layout the probe does not
    find under sgl-kernel's later name changes these."""
    import importlib.util

    from gpuops.lab.sglang_cache import sgl_kernel_site, sglang_kernel_site

    site = (sgl_kernel_site if dist == "sgl-kernel" else sglang_kernel_site)(version)
    packages = probe_site(site)
    assert versions_of(packages)["sgl_kernel"] == version
    read = packages.kernels["sgl_kernel"]["files"]["common_ops"]
    assert read["arches"] == {"sm100/common_ops.abi3.so": {"sass": [80, 89, 90, 100, 120], "ptx": []}}, read
    catalog = load_catalog()
    for name in ("custom_allreduce", "cutlass_fp8"):
        feature = catalog.feature(name)
        need = next(n for n in feature.kernels if n.provider == "sgl_kernel")
        verdicts = {cc: next(v for v in judge_feature(feature, packages.kernels, versions_of(packages), cc)
                             if v.need == need) for cc in ("12.0", "9.0", "7.5")}
        assert verdicts["12.0"].status is KernelStatus.OPEN and verdicts["9.0"].status is KernelStatus.OPEN
        assert verdicts["12.0"].where == "sgl_kernel/sm100/common_ops.abi3.so", verdicts["12.0"]
        assert "carries device code for sm120" in verdicts["12.0"].reason
        assert verdicts["7.5"].status is KernelStatus.BLOCKED, verdicts["7.5"].reason
        assert "no device code for sm75" in verdicts["7.5"].reason and "SASS sm_80, sm_89, sm_90, sm_100, sm_120" in \
            verdicts["7.5"].reason
    spec = importlib.util.spec_from_file_location("software_remote", Path(__file__).resolve().parents[2] / "src" /
                                                  "gpuops" / "facts" / "software_remote.py")
    assert spec is not None and spec.loader is not None
    remote = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(remote)
    assert remote.fatbin_arches(str(site / "sgl_kernel" / "flashmla_ops.abi3.so")) == {"sass": flashmla, "ptx": []}
    assert remote.fatbin_arches(str(site / "sgl_kernel" / "__init__.py")) is None   # not an ELF file
