"""gpuops.advise (pure): evidence measured on the host wins over the published figure; ranking."""

from __future__ import annotations

import pytest

from gpuops import advise


def host_doc(sglang: str = "0.5.23", flashinfer: str = "0.7.2", nvlink: bool = False, env: dict | None = None) -> dict:
    return {"facts": {
        "gpu_count": 8, "sm": "sm120", "interconnect": {"nvlink": nvlink, "p2p_all_pairs": True},
        "software": {"sglang": {"version": sglang}, "flashinfer": {"version": flashinfer}},
        "server": {"argv": ["python3", "-m", "sglang.launch_server", "--tp", "8"], "env": env or {}},
        "model": {"num_hidden_layers": 61, "torch_dtype": "bfloat16"}},
        "features": {"flashinfer_allreduce_fusion": {"status": "blocked", "reason": "blocked on sm120 at x.py:1",
                                                     "kernels": [{"provider": "flashinfer", "status": "open",
                                                                  "read": True}]}}}


STORED = {"id": "r1", "summary": {"ranked_at_tokens": 1, "variants": [
    {"label": "NCCL default", "ok": True, "latency_us": {"1": 190.0}, "step_cost_ms": {"1": 23.18}}]}}


def test_measured_nccl_is_the_evidence_when_the_host_has_a_stored_result() -> None:
    got = advise.advise_host("h", host_doc(), [STORED])
    first = got.ranked[0]
    assert first.feature == "pcie_ipc_allreduce" and first.evidence is not None
    assert first.evidence.basis == "measured" and "result r1" in first.evidence.text
    assert first.evidence.saving_ms_per_pass == round(23.18 - 122 * 5.3 / 1000, 2)
    published = advise.advise_host("h", host_doc(), []).ranked[0].evidence
    assert published is not None and published.basis == "published"


def test_ranked_by_saving_and_in_effect_is_not_ranked() -> None:
    got = advise.advise_host("h", host_doc())
    assert [w.feature for w in got.ranked] == ["pcie_ipc_allreduce", "flashinfer_allreduce_fusion"]
    done = advise.advise_host("h", host_doc(env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}))
    assert [w.feature for w in done.ranked] == ["flashinfer_allreduce_fusion"]
    assert done.others[0].status is advise.Status.IN_EFFECT


def test_json_names_every_documented_key() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "advise-json.md").read_text()
    data = advise.advise_host("h", with_features(host_doc())).to_json()
    keys = set(data) | set(data["ranked"][0]) | set(data["ranked"][0]["evidence"]) | {
        w["status"] for w in data["others"] + data["features"]} | {w["evidence"]["basis"] for w in data["features"]}
    missing = [k for k in sorted(keys) if f"`{k}`" not in doc]
    assert not missing, missing


def test_switched_on_across_a_p2p_gap_is_in_effect_not_advised_again() -> None:
    doc = host_doc(env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    doc["facts"]["interconnect"]["p2p_failed_pairs"] = [["GPU0", "GPU4", "CNS"]]
    got = advise.advise_host("h", doc)
    assert [w.feature for w in got.others if w.status is advise.Status.IN_EFFECT] == ["pcie_ipc_allreduce"]


def with_features(doc: dict) -> dict:
    """The verdicts inspect gives the field box at 0.5.23 for the features advise reports beside
    the ranked ways (reasons abridged, file:line kept)."""
    doc["features"].update({
        "custom_allreduce": {"status": "blocked", "in_effect": False, "reason": "does not fit this host: TP 8 over PCIe "
                             "only: SGLang turns it off on more than 2 PCIe-only GPUs (sglang/srt/distributed/"
                             "device_communicators/custom_all_reduce_utils.py:495); on by default",
                             "fits": [{"kind": "tp_at_most_without_nvlink", "holds": False, "where":
                                       "sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py:495"}]},
        "torch_symm_mem": {"status": "blocked", "in_effect": False, "reason": "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES "
                           "has sizes for capability majors 9, 10 (sglang/srt/distributed/device_communicators/"
                           "all_reduce_utils.py:3); none for 12"},
        "fa3": {"status": "blocked", "in_effect": False, "reason": "blocked on sm120 at srt/layers/attention/"
                "flashattention_backend.py:40"},
        "cutlass_fp8": {"status": "open", "in_effect": None, "in_effect_reason": "SGLang chooses at start-up",
                        "reason": "open on 1 of 2 paths", "kernels": [{"provider": "sgl_kernel", "status": "open",
                                                                        "file": "sgl_kernel/sm100/common_ops.abi3.so"}]},
        "deepgemm": {"status": "unknown", "in_effect": None, "reason": "cannot tell: the gate reads a variable"},
    })
    return doc


def test_the_other_gated_features_come_with_the_verdicts_evidence() -> None:
    """SGLang's own all-reduce paths join `others` (not ranked: no gpuops role switches them), the
    model's other gated features `features`, each with the verdict as evidence and its file:line."""
    got = advise.advise_host("h", with_features(host_doc()))
    others = {w.feature: w for w in got.others}
    custom = others["custom_allreduce"]
    assert custom.status is advise.Status.NOT_FOR_HOST and "more than 2 PCIe-only GPUs" in custom.why
    assert custom.evidence is not None and custom.evidence.basis == "gate audit"
    assert "custom_all_reduce_utils.py:495" in custom.evidence.source
    assert others["torch_symm_mem"].status is advise.Status.NOT_FOR_HOST
    features = {w.feature: w for w in got.features}
    assert list(features) == ["fa3", "deepgemm", "cutlass_fp8"]   # in MODEL_FEATURES order, those judged
    assert features["fa3"].status is advise.Status.NOT_FOR_HOST and "flashattention_backend.py:40" in features["fa3"].why
    assert features["fa3"].why.startswith("an attention backend")
    fp8 = features["cutlass_fp8"]
    assert fp8.status is advise.Status.AVAILABLE and "launch with --moe-runner-backend" in fp8.why, fp8.why
    assert fp8.evidence is not None and "sgl_kernel/sm100/common_ops.abi3.so" in fp8.evidence.source
    assert features["deepgemm"].status is advise.Status.UNKNOWN
    assert [w.feature for w in got.ranked] == ["pcie_ipc_allreduce", "flashinfer_allreduce_fusion"]
    text = "\n".join(advise.render(got))
    assert "other gated features for this model:" in text and "FlashAttention-3 attention backend: does not apply" in text
    assert "None" not in text


NO_PYTHON = "no python 3.8+ found on the host"


@pytest.mark.parametrize("p2p", [True, False], ids=["p2p", "p2p-gap"])
@pytest.mark.parametrize("feature", ["flashinfer_allreduce_fusion", "pcie_ipc_allreduce"])
def test_a_feature_whose_verdict_is_unknown_is_never_apply_now(p2p: bool, feature: str) -> None:
    """Issue 42: on a host without python3 inspect cannot read SGLang's gates; advise ranked
    fusion-sm120 "apply now" (why: "no python 3.8+ found on the host") beside lines that said they
    could not tell. A verdict inspect did not reach is "cannot tell", with its reason, no command."""
    doc = host_doc()
    doc["facts"]["interconnect"]["p2p_all_pairs"] = p2p
    doc["features"][feature] = {"status": "unknown", "reason": NO_PYTHON}
    got = advise.advise_host("h", doc)
    assert feature not in [w.feature for w in got.ranked]
    way = next(w for w in got.others if w.feature == feature)
    assert way.status is advise.Status.UNKNOWN and way.why == NO_PYTHON and way.commands == ()
    assert not any(line.startswith(("1.", "2.")) and f"({feature})" in line and "apply now" in line
                   for line in advise.render(got))


def test_a_gpuops_python_that_is_not_there_is_a_note() -> None:
    """The commands advised run apply's helpers with gpuops_python (issue 42): inspect's warning
    that it is not on the host is said with the advice; other warnings are not notes."""
    from gpuops.facts.python_select import GPUOPS_PYTHON_MISSING

    doc = host_doc()
    missing = f"gpuops_python /opt/py/bin/python3 {GPUOPS_PYTHON_MISSING}"
    doc["facts"]["warnings"] = [missing, "mixed GPU models on one host (A, B)"]
    got = advise.advise_host("h", doc)
    assert got.notes == (missing,)
    assert f"note: {missing}" in advise.render(got)
