"""A FlashInfer generator need judged from what a host sends (gates/kernels.py): the major list and
its line, and how the JIT module would be had there (prebuilt, or the host's nvcc)."""

from __future__ import annotations

from gpuops.gates.catalog import load_catalog
from gpuops.gates.kernels import KernelStatus, fold, judge_need


def need():
    return load_catalog().feature("flashinfer_allreduce_fusion").kernels[0]


def reads(majors, nvcc=None, aot=None) -> dict:
    return {"flashinfer": {"root": "/site/flashinfer", "aot": aot, "files": {"jit/comm.py": {
        "exists": True, "generators": {"gen_trtllm_comm_module": [190, majors, 192]}}}}, "nvcc": nvcc}


def test_a_major_outside_the_list_is_blocked_with_its_line_and_the_first_that_builds_it() -> None:
    verdict = judge_need(need(), reads([9, 10]), {"flashinfer": "0.6.16.post4"}, "12.0")
    assert verdict.status is KernelStatus.BLOCKED and verdict.where == "flashinfer/jit/comm.py:192"
    assert verdict.reason == ("FlashInfer 0.6.16.post4 cannot build the fused all-reduce + RMSNorm kernel (trtllm_comm) "
                              "for sm120: flashinfer/jit/comm.py:192 builds majors [9, 10] only; FlashInfer 0.6.17 is "
                              "the first that builds it for major 12")
    assert judge_need(need(), reads([9, 10]), {"flashinfer": "0.6.1"}, "9.0").status is KernelStatus.OPEN


def test_how_the_jit_module_would_be_had() -> None:
    versions = {"flashinfer": "0.7.2"}
    old = judge_need(need(), reads([9, 10, 12], {"path": "/usr/local/cuda/bin/nvcc", "version": "12.4"}), versions, "12.0")
    assert old.status is KernelStatus.OPEN and "CUDA 12.4, which cannot target major 12 (CUDA 12.8" in old.reason
    none = judge_need(need(), reads([9, 10, 12]), versions, "12.0")
    assert "no nvcc is on the host's PATH" in none.reason
    aot = judge_need(need(), reads([9, 10, 12], aot=["trtllm_comm"]), versions, "12.0")
    assert "1 prebuilt module(s) in flashinfer/data/aot" in aot.reason
    cache = judge_need(need(), reads([9, 10, 12]), {**versions, "flashinfer_jit_cache": "0.7.2"}, "12.0")
    assert "flashinfer-jit-cache 0.7.2" in cache.reason


def test_hostile_or_missing_reads_never_crash_and_never_open() -> None:
    for bad in ({"flashinfer": {"files": {"jit/comm.py": {"exists": True, "generators": {"gen_trtllm_comm_module": "x"}}}}},
                {"flashinfer": {"files": {"jit/comm.py": {"exists": True, "generators": "gen_trtllm_comm_module"}}}},
                {"flashinfer": {"files": {"jit/comm.py": {"exists": True, "generators": []}}}},
                {"flashinfer": {"files": {"jit/comm.py": "x"}}}, {"flashinfer": []}, {"flashinfer": {"files": []}}):
        verdict = judge_need(need(), bad, {"flashinfer": "0.7.2"}, "12.0")
        assert verdict.status is not KernelStatus.OPEN, bad


def test_metadata_only_is_decided_by_the_version_rule() -> None:
    """No files read for the package (the probe found its .dist-info but no directory): below the
    catalog's first version is blocked (fusion-sm120 refuses on it), at or above it open, both not
    read; no version at all is blocked as not installed; no rule for the GPU's major is unknown."""
    old = judge_need(need(), {}, {"flashinfer": "0.6.1"}, "12.0")
    assert old.status is KernelStatus.BLOCKED and not old.read and old.first == "0.6.17", old
    assert "version rule: FlashInfer 0.6.17 is the first with it for sm120" in old.reason
    assert "metadata only" in old.reason
    new = judge_need(need(), {}, {"flashinfer": "0.6.17"}, "12.0")
    assert new.status is KernelStatus.OPEN and not new.read, new
    assert judge_need(need(), {}, {}, "12.0").status is KernelStatus.BLOCKED
    assert judge_need(need(), {}, {"flashinfer": "0.6.1"}, "9.0").status is KernelStatus.UNKNOWN
    assert judge_need(need(), None, {"flashinfer": "0.6.1"}, "12.0").status is KernelStatus.BLOCKED


def test_a_blocked_library_closes_an_open_feature_reason_first() -> None:
    blocked = judge_need(need(), reads([9, 10]), {"flashinfer": "0.6.1"}, "12.0")
    out = fold({"status": "open", "reason": "the runtime checks admit sm120"}, [blocked])
    assert out["status"] == "blocked" and out["reason"].startswith("FlashInfer 0.6.1 cannot build")
    assert out["reason"].endswith("SGLang's own gates admit it (the runtime checks admit sm120)")
    assert out["kernels"][0]["line"] == 192


def test_a_server_asking_for_a_kernel_the_library_lacks_does_not_have_it_in_effect() -> None:
    blocked = judge_need(need(), reads([9, 10]), {"flashinfer": "0.6.1"}, "12.0")
    out = fold({"status": "open", "in_effect": True, "in_effect_reason": "the running server has it on",
                "reason": "the runtime checks admit sm120; in effect in the running server: it has it on"}, [blocked])
    assert out["in_effect"] is False and "FlashInfer 0.6.1 cannot build" in out["in_effect_reason"]
    assert "in effect" not in out["reason"] and out["reason"].endswith("(the runtime checks admit sm120)")


def arch_need():
    feature = load_catalog().feature("custom_allreduce")
    return next(n for n in feature.kernels if n.provider == "sgl_kernel")


def arch_reads(files) -> dict:
    return {"sgl_kernel": {"root": "/site/sgl_kernel", "files": {"common_ops": {"exists": bool(files), "arches": files}}}}


def test_an_extensions_compiled_architectures_against_the_gpu() -> None:
    """SASS runs on its own major at a minor not below its own; PTX is compiled by the driver for
    any later GPU; a build without either for the GPU is blocked, naming what it carries."""
    versions = {"sgl_kernel": "0.3.21"}
    both = {"sm90/common_ops.abi3.so": {"sass": [90], "ptx": []}, "sm100/common_ops.abi3.so": {"sass": [100, 120], "ptx": []}}
    got = judge_need(arch_need(), arch_reads(both), versions, "12.0")
    assert got.status is KernelStatus.OPEN and got.where == "sgl_kernel/sm100/common_ops.abi3.so", got
    assert judge_need(arch_need(), arch_reads(both), versions, "12.1").status is KernelStatus.OPEN  # sm_120 SASS on 12.1
    old = {"common_ops.abi3.so": {"sass": [80, 90, 100], "ptx": []}}
    blocked = judge_need(arch_need(), arch_reads(old), versions, "12.0")
    assert blocked.status is KernelStatus.BLOCKED and blocked.reason == (
        "sgl-kernel 0.3.21 has no device code for sm120 in the custom all-reduce kernels (sgl_kernel common_ops) "
        "(its .nv_fatbin: sgl_kernel/common_ops.abi3.so: SASS sm_80, sm_90, sm_100)"), blocked.reason
    assert judge_need(arch_need(), arch_reads(old), versions, "8.6").status is KernelStatus.OPEN   # sm_80 on 8.6
    ptx = judge_need(arch_need(), arch_reads({"common_ops.so": {"sass": [90], "ptx": [90]}}), versions, "12.0")
    assert ptx.status is KernelStatus.OPEN and "PTX the driver compiles" in ptx.reason
    assert judge_need(arch_need(), arch_reads({}), versions, "12.0").status is KernelStatus.BLOCKED   # no such build


def test_hostile_or_unreadable_arches_are_never_open() -> None:
    versions = {"sgl_kernel": "0.3.21"}
    for bad in ({"x.so": "x"}, {"x.so": {"error": "cannot read"}}, {"x.so": {"sass": "120"}}, {"x.so": {"sass": [True]}}):
        got = judge_need(arch_need(), arch_reads(bad), versions, "12.0")
        assert got.status is not KernelStatus.OPEN, (bad, got)
    assert judge_need(arch_need(), arch_reads({"x.so": {"sass": [120]}}), versions, None).status is KernelStatus.UNKNOWN
    assert judge_need(arch_need(), {}, versions, "12.0").status is KernelStatus.UNKNOWN   # metadata only: no rule
