"""gpuops.advise (pure): evidence measured on the host wins over the published figure; ranking."""

from __future__ import annotations

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
    data = advise.advise_host("h", host_doc()).to_json()
    keys = set(data) | set(data["ranked"][0]) | set(data["ranked"][0]["evidence"])
    missing = [k for k in sorted(keys) if f"`{k}`" not in doc]
    assert not missing, missing


def test_switched_on_across_a_p2p_gap_is_in_effect_not_advised_again() -> None:
    doc = host_doc(env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    doc["facts"]["interconnect"]["p2p_failed_pairs"] = [["GPU0", "GPU4", "CNS"]]
    got = advise.advise_host("h", doc)
    assert [w.feature for w in got.others if w.status is advise.Status.IN_EFFECT] == ["pcie_ipc_allreduce"]
