"""The grown catalog judged on real releases (cached wheels): each feature's status on sm90, sm100
and sm120, as each release's own code decides it (checked by reading that code, comments in
catalog.yaml). A release without the feature reads `unknown` with "no ... gate found"."""

from __future__ import annotations

import pytest
from labtools import release_scan

from gpuops.gates.evaluate import judge

pytestmark = pytest.mark.integration

GPUS = ("9.0", "10.0", "12.0")
O, B, U = "open", "blocked", "unknown"
# release -> feature -> status on (sm90, sm100, sm120)
EXPECTED = {
    "0.5.7": {"flashinfer_allreduce_fusion": (O, O, B), "deepgemm": (O, O, O), "fa3": (O, B, B),
              "trtllm_attention": (B, O, B), "cutlass_fp8": (O, O, O), "mnnvl_allreduce": (U, U, U),
              "pcie_ipc_allreduce": (U, U, U),
              "custom_allreduce": (U, U, U), "torch_symm_mem": (U, U, U)},
    # 0.5.10/0.5.14: the TRT-LLM MHA *prefill* guard admits SM100 only (`prefill_backend ==
    # "trtllm_mha" and not is_sm100_supported()`), so sm120 is blocked on that path.
    "0.5.10": {"flashinfer_allreduce_fusion": (O, O, B), "deepgemm": (O, O, O), "fa3": (O, B, B),
               "trtllm_attention": (B, O, B), "cutlass_fp8": (O, O, O), "mnnvl_allreduce": (U, U, U),
              "pcie_ipc_allreduce": (U, U, U),
              "custom_allreduce": (U, U, U), "torch_symm_mem": (U, U, U)},
    # 0.5.14: DeepGEMM refuses sm120 (`sm_version == 120`); MNNVL appears (`_mnnvl_supported`).
    "0.5.14": {"flashinfer_allreduce_fusion": (O, O, B), "deepgemm": (O, O, B), "fa3": (O, B, B),
               "trtllm_attention": (B, O, B), "cutlass_fp8": (O, O, O), "mnnvl_allreduce": (O, O, B),
              "pcie_ipc_allreduce": (U, U, U),
              "custom_allreduce": (U, U, U), "torch_symm_mem": (U, U, U)},
    # 0.5.23: DeepGEMM refuses sm120/sm121 unless its SM120 APIs are installed (`sm_version in
    # (120, 121) and not _sm120_deep_gemm_apis_available()`): blocked on that condition; the
    # TRT-LLM MHA prefill guard now admits SM120.
    "0.5.23": {"flashinfer_allreduce_fusion": (O, O, B), "deepgemm": (O, O, B), "fa3": (O, B, B),
               "trtllm_attention": (B, O, O), "cutlass_fp8": (O, O, O), "mnnvl_allreduce": (O, O, B),
              "pcie_ipc_allreduce": (U, U, U),
              "custom_allreduce": (U, U, U), "torch_symm_mem": (U, U, U)},
}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_catalog_features_on_real_releases(version: str) -> None:
    scan = release_scan(version)
    assert scan.known, scan.reason
    got = {}
    for cc in GPUS:
        for name, feature in judge(scan, cc, "12.8", None).features.items():
            got.setdefault(name, []).append(feature["status"])
            if feature["status"] == "blocked":
                assert ".py:" in feature["reason"]          # where, with file:line
            if feature["status"] == "unknown":
                assert "no " in feature["reason"] and "gate found" in feature["reason"]
    # pcie_ipc_allreduce, custom_allreduce and torch_symm_mem have no GPU-generation gate: SGLang's
    # gates alone cannot tell (their kernel needs and fits decide them: gates/fits.py,
    # tests/unit/test_fits.py, tests/integration/test_kernel_gates_lab.py).
    assert {k: tuple(v) for k, v in got.items()} == EXPECTED[version]
    assert len(got) >= 6
