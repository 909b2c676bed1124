"""What gpuops says is in effect on the real SGLang 0.5.16 server of issue 36 (one H200, TP 1, a bf16
LlamaForCausalLM launched with ``--attention-backend triton``, no deep_gemm installed), replayed from
its recorded answers (tests/fixtures/real/h200-x1/sglang-0.5.16/: ``/server_info``, the process
tree, the server's ``pip list``, and gpuops c1b6aed's own ``inspect --json`` of it, whose verdicts
were wrong): each verdict here is what SGLang 0.5.16's own code decides for that server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuops.advise import Status, advise_host, render
from gpuops.facts.served_model import ModelFacts
from gpuops.facts.server_args import settings_from_argv
from gpuops.gates.catalog import load_catalog
from gpuops.gates.evaluate import GateReport, _server_state
from gpuops.gates.fits import HostShape, fold_stack, weight_format
from gpuops.gates.gpu_target import make_gpu
from gpuops.gates.in_effect import in_effect, reported_state
from gpuops.gates.logic import PredicateBook
from gpuops.gates.scan import GateScan
from gpuops.remote.server_report import NOT_SETTINGS

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-x1" / "sglang-0.5.16"
ALL_REDUCE = ("flashinfer_allreduce_fusion", "mnnvl_allreduce", "pcie_ipc_allreduce", "custom_allreduce",
              "torch_symm_mem")


def _json(name: str) -> Any:
    return json.loads((REAL / name).read_text(encoding="utf-8"))


def _host() -> dict[str, Any]:
    """gpuops c1b6aed's ``inspect host --json`` entry of the real server's host."""
    return dict(_json("gpuops/inspect.json")["hosts"]["gpu0"])


def _reported() -> dict[str, Any]:
    """The recorded ``/server_info`` as the server probe keeps it (remote/server_report.py)."""
    info = _json("http/server_info.json")["json"]
    return {"route": "/server_info", "settings": {k: v for k, v in info.items() if k not in NOT_SETTINGS},
            "error": None}


def _launch() -> Any:
    """The server's launch flags, parsed by gpuops from the recorded process tree's main argv."""
    main = next(p for p in _json("ps.json") if "sglang.launch_server" in p["argv"])
    return settings_from_argv(main["argv"])


def _server() -> dict[str, Any]:
    """The running server as the gates are judged against it (facts/collect.py ``_judge``)."""
    launch = _launch()
    return {"running": True, "args": launch.args, "tp_size": launch.tp_size, "reported": _reported(),
            "architecture": "LlamaForCausalLM", "gpu_name": "NVIDIA H200"}


def _shape() -> HostShape:
    """The host's shape (facts/collect.py ``host_shape``): TP, the model's weights (its config.json
    had no quantization_config: the recorded model facts), the server's settings and report."""
    facts = _host()["facts"]
    recorded = facts["model"]
    model = ModelFacts(**{**recorded, "architectures": tuple(recorded["architectures"])})
    launch = _launch()
    return HostShape(tp_size=launch.tp_size, dtype=model.torch_dtype, deterministic=False,
                     nvlink=facts["interconnect"]["nvlink"], p2p_gaps=(), capability=facts["compute_capability"],
                     server_args=launch.args, server_env=facts["server"]["env"], server_report=_reported(),
                     weights=weight_format(model.known, model.quant_method, model.weight_block_size,
                                           launch.quantization))


def _versions() -> dict[str, str | None]:
    software = _host()["facts"]["software"]
    return {"sglang": software["sglang"]["version"], "flashinfer": software["flashinfer"]["version"],
            "sgl_kernel": software["sglang_kernel"]["version"], "deep_gemm": None}


def _folded(names: tuple[str, ...]) -> dict[str, Any]:
    """The recorded verdicts folded again with the host's recorded reads (gates/fits.fold_stack)."""
    recorded = _host()["features"]
    report = GateReport([], {name: recorded[name] for name in names}, "0.5.16", "sm90")
    software = _host()["facts"]["software"]
    return fold_stack(report, load_catalog(), software["kernels"], _versions(), _shape()).features


def test_deepgemm_is_not_in_effect_without_deep_gemm_on_bf16_weights() -> None:
    # The server's environment has no deep_gemm, so SGLang's ENABLE_JIT_DEEPGEMM is false
    # (deep_gemm_wrapper/configurer.py: `import deep_gemm` fails); and a bf16 model has no
    # FP8 block-quantized layer for it to serve.
    assert not [name for name in _json("pip-server-env.json") if "gemm" in name.lower()]
    assert _host()["features"]["deepgemm"]["in_effect"] is True   # what gpuops c1b6aed said
    verdict = _folded(("deepgemm",))["deepgemm"]
    assert verdict["in_effect"] is False, verdict
    assert verdict["status"] == "blocked"
    [need] = verdict["kernels"]
    assert need["provider"] == "deep_gemm" and need["status"] == "blocked"
    assert "DeepGEMM is not installed for this python" in need["reason"]
    [fit] = verdict["fits"]
    assert fit["kind"] == "weights" and fit["holds"] is False
    assert "the served model's weights are unquantized (bfloat16)" in fit["reason"]
    assert "the served model's weights are unquantized (bfloat16)" in verdict["reason"]


def test_deepgemm_stays_in_effect_where_it_is_installed_and_the_weights_are_block_fp8() -> None:
    import dataclasses

    recorded = _host()["features"]
    software = _host()["facts"]["software"]
    reads = {**software["kernels"], "deep_gemm": {"root": "/site/deep_gemm", "files": {"__init__.py": {"exists": True}}}}
    shape = dataclasses.replace(_shape(), weights=weight_format(True, "fp8", (128, 128), None))
    report = GateReport([], {"deepgemm": recorded["deepgemm"]}, "0.5.16", "sm90")
    verdict = fold_stack(report, load_catalog(), reads, {**_versions(), "deep_gemm": "0.1.4.post1"}, shape)
    deepgemm = verdict.features["deepgemm"]
    assert deepgemm["status"] == "open" and deepgemm["in_effect"] is True, deepgemm
    assert [f["holds"] for f in deepgemm["fits"]] == [True]


def test_no_all_reduce_path_is_in_effect_at_tp_1() -> None:
    assert _reported()["settings"]["tp_size"] == 1
    assert _host()["features"]["custom_allreduce"]["in_effect"] is True   # what gpuops c1b6aed said
    catalog = load_catalog()
    assert tuple(f.name for f in catalog.features if f.all_reduce) == ALL_REDUCE
    # The features without GPU-generation gates, decided by their needs and fits (gates/fits.py).
    folded = _folded(("pcie_ipc_allreduce", "custom_allreduce", "torch_symm_mem"))
    assert folded["custom_allreduce"]["in_effect"] is False, folded["custom_allreduce"]["in_effect_reason"]
    for name, verdict in folded.items():
        assert verdict["in_effect"] is False, (name, verdict["in_effect_reason"])
        assert verdict["in_effect_reason"].startswith("TP 1 (the server reports tp_size=1 in /server_info)")
    # And through the gated features' judgement (gates/in_effect.py), whatever else each would say.
    book = PredicateBook(GateScan(known=True))
    gpu = make_gpu("9.0", "13.0")
    for feature in catalog.features:
        if feature.all_reduce:
            value, why = in_effect(feature, [], {}, book, gpu, _server(), [], "open", None)
            assert value is False and "a TP group of one GPU has no all-reduce" in why, (feature.name, why)


def test_advise_counts_no_all_reduce_at_tp_1_and_offers_none() -> None:
    recorded = (REAL / "gpuops" / "advise.txt").read_text(encoding="utf-8")
    assert "all-reduces per forward pass: 8" in recorded                   # what gpuops c1b6aed said
    advice = advise_host("gpu0", _host())
    assert advice.allreduces_per_pass == 0
    assert advice.allreduces_from.startswith("TP 1 (the server reports tp_size=1 in /server_info)")
    assert advice.ranked == ()
    ways = {w.feature: w for w in advice.others}
    assert set(ways) == set(ALL_REDUCE)
    assert all(w.status is Status.NOT_FOR_HOST and w.why == advice.allreduces_from for w in ways.values()), ways
    text = "\n".join(render(advice))
    assert "all-reduces per forward pass: 0 (TP 1" in text
    assert "custom all-reduce (CUDA IPC, and QuickAllReduce on ROCm): does not apply: TP 1" in text


def test_a_setting_that_selects_another_backend_does_not_turn_the_feature_on() -> None:
    trtllm = load_catalog().feature("trtllm_attention")
    recorded = _host()["features"]["trtllm_attention"]["reason"]
    assert "the running server has it on (attention_backend='triton')" in recorded   # what gpuops c1b6aed said
    state = _server_state(trtllm, _server())
    assert state == ("the running server has it off (attention_backend='triton' selects another choice than "
                     "trtllm_mla, trtllm_mha)")
    # The server's own report says the same.
    assert reported_state(trtllm, _server()) == (False, "the server reports attention_backend='triton'")
    fa3 = load_catalog().feature("fa3")
    assert _server_state(fa3, {"args": {"attention_backend": "fa3"}}) == \
        "the running server has it on (attention_backend='fa3')"


def test_the_weights_format_is_read_from_config_json() -> None:
    from gpuops.facts.served_model import model_from_config

    # DeepSeek-V3's published quantization_config: FP8 block-quantized weights.
    config = {"architectures": ["DeepseekV3ForCausalLM"], "torch_dtype": "bfloat16", "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}}
    model = model_from_config("/m", "/m/config.json", json.dumps(config).encode())
    assert (model.quant_method, model.weight_block_size) == ("fp8", (128, 128))
    assert weight_format(True, model.quant_method, model.weight_block_size, None) == "fp8_block"
    bf16 = model_from_config("/m", "/m/config.json", json.dumps({"torch_dtype": "bfloat16"}).encode())
    assert weight_format(True, bf16.quant_method, bf16.weight_block_size, None) == "unquantized"
    assert weight_format(True, bf16.quant_method, bf16.weight_block_size, "fp8") == "fp8"   # online: never blocks
    assert weight_format(False, None, None, None) is None
