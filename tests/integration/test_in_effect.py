"""`in_effect` of a feature in the running server, judged on real releases (scans of the cached
wheels): auto-enabled, flag-enabled, blocked, and not applying; gate locations at the capability
test; interconnect-aware texts."""

from __future__ import annotations

import pytest
from labtools import release_scan

from gpuops.gates.evaluate import judge

pytestmark = pytest.mark.integration

FUSION = "flashinfer_allreduce_fusion"
H100 = "NVIDIA H100 80GB HBM3"
_SCANS: dict = {}


def scan_of(version: str):
    if version not in _SCANS:
        _SCANS[version] = release_scan(version)
        assert _SCANS[version].known
    return _SCANS[version]


def server(arch: str, *flags: tuple[str, object], tp: str = "8", gpu: str = H100) -> dict:
    args = {"tp_size": tp, "model_path": "/models/m", **dict(flags)}
    return {"running": True, "args": args, "architecture": arch, "gpu_name": gpu}


@pytest.mark.parametrize("version", ["0.5.8", "0.5.10", "0.5.23"])
def test_deepseek_at_tp8_on_sm90_is_auto_enabled(version: str) -> None:
    """The issue's case: no flag, yet SGLang switches fusion on by itself (gate and clauses hold)."""
    fusion = judge(scan_of(version), "9.0", "12.8", server("DeepseekV3ForCausalLM")).features[FUSION]
    assert fusion["status"] == "open"
    assert fusion["in_effect"] is True, fusion["in_effect_reason"]
    assert "turns it on by itself" in fusion["in_effect_reason"]
    assert "was not launched" not in fusion["reason"]


@pytest.mark.parametrize("version, arch, tp, gpu", [
    ("0.5.8", "LlamaForCausalLM", "8", H100),          # not a model SGLang enables it for
    ("0.5.10", "LlamaForCausalLM", "8", H100),
    ("0.5.10", "DeepseekV3ForCausalLM", "1", H100),   # 0.5.10 added `tp_size > 1` (0.5.8 has no such clause)
    ("0.5.23", "DeepseekV3ForCausalLM", "1", H100),
    ("0.5.8", "DeepseekV3ForCausalLM", "8", "NVIDIA H20"),   # SGLang's own H20 exclusion, from the GPU name
])
def test_clauses_that_do_not_hold_keep_it_off(version: str, arch: str, tp: str, gpu: str) -> None:
    fusion = judge(scan_of(version), "9.0", "12.8", server(arch, tp=tp, gpu=gpu)).features[FUSION]
    assert fusion["status"] == "open"
    assert fusion["in_effect"] is False, fusion["in_effect_reason"]
    assert "does not apply" in fusion["in_effect_reason"]


def test_flag_enabled_and_blocked() -> None:
    scan = scan_of("0.5.8")
    flagged = judge(scan, "9.0", "12.8", server("LlamaForCausalLM", ("enable_flashinfer_allreduce_fusion", True)))
    assert flagged.features[FUSION]["in_effect"] is True
    assert "launched with" in flagged.features[FUSION]["in_effect_reason"]
    blocked = judge(scan, "12.0", "12.8", server("DeepseekV3ForCausalLM", ("enable_flashinfer_allreduce_fusion", True),
                                                   gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition"))
    fusion = blocked.features[FUSION]
    assert fusion["status"] == "blocked" and fusion["in_effect"] is False
    assert "never runs" in fusion["in_effect_reason"]


@pytest.mark.parametrize("version, condition_line, capability_line", [("0.5.10", 2090, 2102)])
def test_gate_location_is_the_capability_test(version: str, condition_line: int, capability_line: int) -> None:
    report = judge(scan_of(version), "9.0", "12.8", None)
    auto = [g for g in report.gates if g["feature"] == FUSION and g["role"] == "auto_enable"]
    assert [(g["condition_line"], g["line"]) for g in auto] == [(condition_line, capability_line)]


def test_mnnvl_text_follows_the_interconnect() -> None:
    scan = scan_of("0.5.23")
    for nvlink, wanted, unwanted in ((True, "NVLink joins its own GPUs only", "PCIe-only"),
                                     (False, "PCIe-only", "NVLink joins")):
        report = judge(scan, "9.0", "12.8", None, interconnect={"nvlink": nvlink})
        texts = [g["meaning"] for g in report.gates if g["feature"] == FUSION and g["role"] == "hardware"]
        assert texts and all(wanted in t and unwanted not in t for t in texts), texts


def reporting(base: dict, **settings: object) -> dict:
    """``base`` with the settings the server reports for itself (``server.reported``, /server_info)."""
    return {**base, "reported": {"route": "/server_info", "settings": dict(settings), "error": None}}


def test_the_server_word_agrees_with_the_judgement() -> None:
    """0.5.23 resolves the auto-enable into flashinfer_allreduce_fusion_backend='auto'
    (arg_groups/overrides.py): the server's word, and gpuops' own judgement agreeing."""
    said = reporting(server("DeepseekV3ForCausalLM"), enable_flashinfer_allreduce_fusion=False,
                     flashinfer_allreduce_fusion_backend="auto")
    fusion = judge(scan_of("0.5.23"), "9.0", "12.8", said).features[FUSION]
    assert fusion["in_effect"] is True
    why = fusion["in_effect_reason"]
    assert "the server reports flashinfer_allreduce_fusion_backend='auto' in its resolved settings (/server_info)" in why
    assert "agrees" in why and "turns it on by itself" in why


def test_the_server_word_is_taken_where_the_judgement_differs_and_both_are_said() -> None:
    # --enforce-disable-flashinfer-allreduce-fusion resolves the backend to None: off, although the
    # auto-enable gate holds for this server
    said = reporting(server("DeepseekV3ForCausalLM"), enable_flashinfer_allreduce_fusion=False,
                     flashinfer_allreduce_fusion_backend=None)
    fusion = judge(scan_of("0.5.23"), "9.0", "12.8", said).features[FUSION]
    assert fusion["in_effect"] is False
    why = fusion["in_effect_reason"]
    assert "the server reports flashinfer_allreduce_fusion_backend=null, enable_flashinfer_allreduce_fusion=False" in why
    assert "the server's word is taken; gpuops' own judgement says on" in why and "turns it on by itself" in why
    # at TP 1 a backend the server reports runs nothing: a TP group of one GPU has no all-reduce to
    # fuse (communicator.py: `self._context.tp_size > 1`), and both words are said
    one = judge(scan_of("0.5.23"), "9.0", "12.8", reporting(server("DeepseekV3ForCausalLM", tp="1"),
                                                           flashinfer_allreduce_fusion_backend="trtllm")).features[FUSION]
    assert one["in_effect"] is False and one["in_effect_reason"].startswith("TP 1"), one["in_effect_reason"]
    assert "flashinfer_allreduce_fusion_backend='trtllm'" in one["in_effect_reason"]
    assert "gpuops' own judgement says off" in one["in_effect_reason"]
    # and where gpuops cannot tell (a LLaMA: a clause it cannot judge), the server's word decides
    llama = judge(scan_of("0.5.23"), "9.0", "12.8", reporting(server("LlamaForCausalLM"),
                                                             flashinfer_allreduce_fusion_backend="trtllm")).features[FUSION]
    assert llama["in_effect"] is True and "could not tell" in llama["in_effect_reason"]
    # an attention backend the server chose by itself (no flag given)
    fa3 = judge(scan_of("0.5.23"), "9.0", "12.8", reporting(server("LlamaForCausalLM"), attention_backend="fa3"))
    assert fa3.features["fa3"]["in_effect"] is True, fa3.features["fa3"]


def test_a_runtime_gate_still_closes_what_the_server_asks_for() -> None:
    said = reporting(server("DeepseekV3ForCausalLM", ("enable_flashinfer_allreduce_fusion", True),
                            gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition"), enable_flashinfer_allreduce_fusion=True)
    fusion = judge(scan_of("0.5.8"), "12.0", "12.8", said).features[FUSION]
    assert fusion["in_effect"] is False
    assert "the server reports enable_flashinfer_allreduce_fusion=True" in fusion["in_effect_reason"]
    assert "never runs" in fusion["in_effect_reason"]


def test_a_failed_report_leaves_the_judgement() -> None:
    failed = {**server("DeepseekV3ForCausalLM"), "reported": {"route": None, "settings": None, "error": "HTTP 401"}}
    fusion = judge(scan_of("0.5.23"), "9.0", "12.8", failed).features[FUSION]
    assert fusion["in_effect"] is True and "turns it on by itself" in fusion["in_effect_reason"]
    assert "server reports" not in fusion["in_effect_reason"]
