"""gpuops advise on the lab's shapes, over real sshd with real SGLang releases: the field box at
0.5.8 (the path to 0.5.23 and the PCIe all-reduce first, fusion-sm120 needing a newer FlashInfer),
the field box at 0.5.23 (pcie-allreduce first, apply now), an 8x H100 on NVLink (nothing to apply:
both say why), a 4x RTX PRO 6000 workstation at 0.5.23 (TP 4: pcie-allreduce applies) and the field
box's GPUs in a server with P2P across its sockets (no override in the command). Text and --json
(docs/advise-json.md) both."""

from __future__ import annotations

import json

import pytest

from gpuops.lab.hosts import LabSpec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("field058",)),
                       LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.23", names=("field0523",)),
                       LabSpec(gpu="h100-x8", sglang="0.5.23", names=("h100",)),
                       LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.23", names=("ws4",)),
                       LabSpec(gpu="rtx-pro-6000-p2p-x8", sglang="0.5.23", names=("p2p0523",)))


@pytest.fixture(scope="module")
def advice(lab, tmp_path_factory):
    import subprocess
    import sys

    cwd = tmp_path_factory.mktemp("advise")
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuops.cli", "advise", "-i", str(lab.inventory_path), *args],
                              capture_output=True, text=True, cwd=cwd, timeout=300)
    text, document = run(), run("--json")
    assert text.returncode == 0 and document.returncode == 0, text.stdout + text.stderr + document.stderr
    return text.stdout, json.loads(document.stdout)


def test_the_field_box_at_0_5_8_is_shown_the_path_to_0_5_23_and_the_pcie_all_reduce(advice) -> None:
    text, document = advice
    host = document["hosts"]["field058"]
    assert host["allreduces_per_pass"] == 122
    first, second = host["ranked"]
    assert first["feature"] == "pcie_ipc_allreduce" and first["status"] == "upgrade"
    # Its TP group spans both sockets, without P2P between them: the override is part of the command, and why says so.
    assert first["commands"] == ["gpuops apply sglang-release -e sglang_version=0.5.23",
                                 "gpuops apply pcie-allreduce -e pcie_allow_without_p2p=true"]
    assert "SGLang 0.5.21 is the first with it" in first["why"] and "peer-to-peer is not possible" in first["why"]
    assert first["evidence"]["basis"] == "published" and "pcie_ipc_ar.py" in first["evidence"]["source"]
    assert "5.3 us vs NCCL's 205.1 us" in first["evidence"]["text"] and "21.14 -> 13.62 ms" in first["evidence"]["text"]
    assert first["evidence"]["saving_ms_per_pass"] == pytest.approx(122 * (205.1 - 5.3) / 1000, abs=0.01)
    assert second["feature"] == "flashinfer_allreduce_fusion" and second["status"] == "upgrade"
    assert "needs a newer FlashInfer" in second["why"] and "0.6.1" in second["why"]
    section = text.split("== field058")[1].split("== ")[0]
    assert "1. SGLang's PCIe IPC all-reduce" in section and "$ gpuops apply sglang-release -e sglang_version=0.5.23" in section
    assert "2. FlashInfer all-reduce + RMSNorm fusion" in section and "None" not in section
    # SGLang's own all-reduce paths and the model's other gated features, each with inspect's verdict.
    others = {w["feature"]: w for w in host["others"]}
    assert others["custom_allreduce"]["status"] == "not_for_host"
    assert "more than 2 PCIe-only GPUs" in others["custom_allreduce"]["why"]
    assert "custom_all_reduce.py:138" in others["custom_allreduce"]["evidence"]["source"]
    assert others["torch_symm_mem"]["status"] == "not_for_host" and "none for 12" in others["torch_symm_mem"]["why"]
    features = {w["feature"]: w for w in host["features"]}
    assert set(features) == {"fa3", "trtllm_attention", "deepgemm", "cutlass_fp8"}, features
    assert all(w["evidence"]["basis"] == "gate audit" and w["why"] for w in features.values())
    assert "other gated features for this model:" in section


def test_the_field_box_at_0_5_23_puts_pcie_allreduce_first(advice) -> None:
    text, document = advice
    host = document["hosts"]["field0523"]
    first = host["ranked"][0]
    assert first["feature"] == "pcie_ipc_allreduce" and first["status"] == "apply"
    assert first["commands"] == ["gpuops apply pcie-allreduce -e pcie_allow_without_p2p=true"]
    assert "peer-to-peer is not possible between 16 GPU pair(s)" in first["why"]
    fusion = next(w for w in host["ranked"] + host["others"] if w["feature"] == "flashinfer_allreduce_fusion")
    assert fusion["status"] == "apply" and "fusion_allow_without_p2p=true" in fusion["commands"][0]
    section = text.split("== field0523")[1].split("== ")[0]
    assert "1. SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): apply now" in section
    assert "$ gpuops apply pcie-allreduce -e pcie_allow_without_p2p=true" in section


def test_an_nvlink_host_is_told_why_nothing_applies(advice) -> None:
    text, document = advice
    host = document["hosts"]["h100"]
    assert host["ranked"] == []
    reasons = {w["feature"]: w["why"] for w in host["others"]}
    assert "for PCIe-only hosts; NVLink all-reduce is already fast" in reasons["pcie_ipc_allreduce"]
    assert "this host's GPUs are sm90" in reasons["flashinfer_allreduce_fusion"]
    section = text.split("== h100")[1].split("== ")[0]
    assert "nothing to apply for the all-reduce on this host" in section and "does not apply" in section
    others = {w["feature"]: w for w in host["others"]}
    assert others["custom_allreduce"]["status"] in ("in_effect", "unknown"), others["custom_allreduce"]
    assert "None" not in section


def test_the_4x_workstation_at_tp_4_gets_the_pcie_all_reduce(advice) -> None:
    _, document = advice
    host = document["hosts"]["ws4"]
    first = host["ranked"][0]
    assert first["feature"] == "pcie_ipc_allreduce" and first["status"] == "apply" and "TP 4" in first["why"]
    assert first["commands"] == ["gpuops apply pcie-allreduce"]   # one socket: P2P between all four
    assert host["allreduces_per_pass"] == 128


def test_a_server_with_p2p_across_its_sockets_gets_pcie_allreduce_without_the_override(advice) -> None:
    _, document = advice
    first = document["hosts"]["p2p0523"]["ranked"][0]
    assert first["feature"] == "pcie_ipc_allreduce" and first["status"] == "apply", first
    assert first["commands"] == ["gpuops apply pcie-allreduce"], first
    assert "peer-to-peer" not in first["why"], first["why"]
