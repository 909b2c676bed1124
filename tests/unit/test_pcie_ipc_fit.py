"""Where SGLang's PCIe IPC all-reduce fits (gpuops/pcie_ipc.py::fit), one test per reason."""

from __future__ import annotations

import pytest

from gpuops import pcie_ipc
from gpuops.pcie_ipc import HostStack, Misfit, fit

FIELD_ARGS = ["--model-path", "/models/Kimi-K2.5", "--tp", "8", "--speculative-algorithm", "EAGLE3"]


def stack(**changes) -> HostStack:
    base = dict(sglang="0.5.23", flashinfer="0.7.2", nvlink=False, gpu_count=8, launch_args=FIELD_ARGS,
                model_dtype="bfloat16")
    base.update(changes)
    return HostStack(**base)


def test_the_field_box_on_a_current_release_fits() -> None:
    got = fit(stack())
    assert got.applies and got.tp == 8 and got.misfit is None, got


@pytest.mark.parametrize("changes, misfit, words", [
    (dict(nvlink=True), Misfit.NVLINK, "for PCIe-only hosts; NVLink all-reduce is already fast"),
    (dict(sglang="0.5.8", flashinfer="0.6.1"), Misfit.SGLANG_TOO_OLD, "SGLang 0.5.21 is the first with it"),
    (dict(sglang="0.5.20"), Misfit.SGLANG_TOO_OLD, "SGLang 0.5.20 lacks the PCIe IPC all-reduce module"),
    (dict(sglang="0.5.21", flashinfer="0.6.18"), Misfit.FLASHINFER_LACKS, "FlashInfer 0.6.18 lacks the PCIe IPC all-reduce (pcie_ipc_comm) by its version"),
    (dict(flashinfer=None), Misfit.FLASHINFER_LACKS, "FlashInfer 0.7.0 is the first with it"),
    (dict(launch_args=["--tp", "1"]), Misfit.TP_SIZE, "TP 1 is not among the sizes it serves (2, 4, 8)"),
    (dict(launch_args=["--model-path", "/m"]), Misfit.TP_SIZE, "TP 1 is not among"),
    (dict(launch_args=["--tp", "16"]), Misfit.TP_SIZE, "TP 16 is not among"),
    (dict(launch_args=["--tp-size", "6"]), Misfit.TP_SIZE, "TP 6 is not among"),
    (dict(model_dtype="float16"), Misfit.DTYPE, "it serves bfloat16 only"),
    (dict(launch_args=FIELD_ARGS + ["--dtype", "half"]), Misfit.DTYPE, "the model is float16"),
    (dict(launch_args=FIELD_ARGS + ["--enable-deterministic-inference"]), Misfit.DETERMINISTIC, "deterministic"),
    (dict(launch_env={"SGLANG_USE_1STAGE_ALLREDUCE": "1"}), Misfit.DETERMINISTIC, "deterministic"),
    (dict(launch_args=[]), Misfit.UNKNOWN, "cannot tell its TP size"),
])
def test_each_misfit_is_named(changes, misfit, words) -> None:
    """The rules are the catalog's, judged by gates/fits.py and gates/kernels.py as inspect judges them."""
    got = fit(stack(**changes))
    assert not got.applies and got.misfit is misfit, got
    assert words in got.reason and "\n" not in got.reason and "None" not in got.reason


def test_too_old_names_the_upgrade() -> None:
    got = fit(stack(sglang="0.5.8", flashinfer="0.6.1"))
    assert got.upgrade == (pcie_ipc.RECOMMENDED_SGLANG, pcie_ipc.RECOMMENDED_FLASHINFER)
    assert "upgrade to 0.5.23" in got.reason


def test_bf16_by_launch_flag_wins_over_the_config_and_1stage_off_wins_over_the_flag() -> None:
    assert fit(stack(model_dtype="float16", launch_args=FIELD_ARGS + ["--dtype", "bfloat16"])).applies
    assert fit(stack(launch_args=FIELD_ARGS + ["--enable-deterministic-inference"],
                     launch_env={"SGLANG_USE_1STAGE_ALLREDUCE": "0"})).applies


def test_missing_p2p_in_the_group_is_refused_unless_allowed() -> None:
    pairs = [["GPU0", "GPU4", "CNS"], ["GPU1", "GPU5", "CNS"]]
    refused = fit(stack(p2p_failed_pairs=pairs))
    assert not refused.applies and refused.misfit is Misfit.NO_P2P and "2 GPU pair(s)" in refused.reason
    assert "GPU0-GPU4 (CNS)" in refused.reason
    assert "-e pcie_allow_without_p2p=true" in refused.reason
    got = fit(stack(p2p_failed_pairs=pairs, allow_without_p2p=True))
    assert got.applies and len(got.warnings) == 1 and "going ahead" in got.warnings[0]
    assert fit(stack(p2p_failed_pairs=pairs, launch_args=["--tp", "4"])).applies   # GPUs 0-3: one socket


def test_log_verdict_reads_the_releases_lines() -> None:
    assert pcie_ipc.log_verdict("x\n[t] FlashInfer PCIe-IPC all-reduce enabled (world=8, workspace sized on first "
                                "reduction)\n")[0] is True
    assert pcie_ipc.log_verdict("[t] WARNING " + pcie_ipc.FALLBACK_LINE + "\n") == (False, pcie_ipc.FALLBACK_LINE)
    bad = "FlashInfer PCIe-IPC workspace (max_numel=458752) failed: boom; reductions stay on NCCL"
    assert pcie_ipc.log_verdict("ok\n" + bad)[0] is False
    assert pcie_ipc.log_verdict("nothing here")[0] is None


def test_the_hosts_own_files_decide_over_the_version() -> None:
    """A FlashInfer whose own comm/__init__.py lacks PcieIpcAllReduceWorkspace is refused though its
    version says 0.7.2; a release whose own _SUPPORTED_WORLD_SIZES lists 16 serves TP 16 (the same
    reads inspect judges)."""
    sglang = {"files": {pcie_ipc.SGLANG_MODULE: {"exists": True, "anchors": {
        "^_SUPPORTED_WORLD_SIZES\\s*=": [70, "_SUPPORTED_WORLD_SIZES = (2, 4, 8, 16)"]}}}}
    lacking = {"sglang": sglang, "flashinfer": {"files": {"comm/__init__.py": {"exists": True, "symbols": {}}}}}
    got = fit(stack(kernel_reads=lacking))
    assert got.misfit is Misfit.FLASHINFER_LACKS and "has no PcieIpcAllReduceWorkspace" in got.reason, got
    having = {"sglang": sglang, "flashinfer": {"files": {"comm/__init__.py": {"exists": True, "symbols": {
        "PcieIpcAllReduceWorkspace": 41}}}}}
    assert fit(stack(kernel_reads=having, launch_args=["--tp", "16"])).applies
    assert fit(stack(launch_args=["--tp", "16"])).misfit is Misfit.TP_SIZE
