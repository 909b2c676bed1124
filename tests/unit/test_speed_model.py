"""The stand-in's speed model: every figure traceable, the documented predictions computed from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.lab import speed_model as sm
from gpuops.lab.gpu_description import load_description

REPO = Path(__file__).resolve().parents[2]
BASES = {"published", "measured", "derived", "assumption"}


@pytest.fixture(scope="module")
def model() -> sm.SpeedModel:
    return sm.load()


def _settings(flags: list[str], env: dict[str, str]) -> sm.Settings:
    """The server arguments the documented flags stand for, parsed as the stand-in parses them."""
    import sys

    sys.path.insert(0, str(Path(sm.__file__).parent))
    import standin_sim

    return sm.settings_from_server(standin_sim.build_server_args(["--model-path", "m", *flags]), env)


def test_every_figure_names_its_basis_and_a_source_with_date_and_hardware(model):
    for key, source in model.sources.items():
        assert source.get("date") and source.get("hardware") and source.get("where"), key
    raw = json.loads(Path(sm.DATA_FILE).read_text())
    figures = [(shape, name, fig) for shape, spec in raw["shapes"].items() for name, fig in spec["figures"].items()]
    figures += [("common", name, fig) for name, fig in raw["common"].items()]
    assert len(figures) > 20
    for shape, name, fig in figures:
        assert fig["basis"] in BASES - {"derived"}, (shape, name)  # derived figures are computed, not written
        assert fig["source"] in model.sources, (shape, name)
        if fig["basis"] in ("published", "measured"):
            assert fig.get("quote") or fig.get("file"), (shape, name)  # the words or file it comes from
        if fig.get("file"):
            assert (REPO / fig["file"]).is_file(), (shape, name)
        if fig["basis"] == "assumption":
            assert fig["source"] == "lab", (shape, name)
    for measurement in raw["measurements"]:
        assert measurement["source"] in model.sources and (REPO / measurement["file"]).exists()


def test_a_shape_without_evidence_is_labelled_an_assumption(model):
    for shape in model.shapes:
        figures = model.figures(shape)
        own = model.shapes[shape]["figures"]
        rates = [n for n in ("decode_tokens_per_s", "verify_ms", "eagle3_tokens_per_s") if n in own]
        evidence = [n for n in rates if own[n]["basis"] in sm.EVIDENCE]
        assert model.shape_basis(shape) == ("calibrated" if evidence else "assumption"), shape
        for name, figure in figures.items():
            if name not in own and figure.basis != "derived":
                assert figure.basis == "assumption" and "borrowed from" in figure.note, (shape, name)


def test_the_calibrated_shape_reproduces_the_field_report(model):
    f = model.figures("rtx-pro-6000-pcie-x8")
    assert f["verify_compute_ms"].value == pytest.approx(5.0) and f["verify_compute_ms"].basis == "derived"
    assert not f["verify_compute_ms"].on_assumption  # 30 - 25, both published
    assert f["verify_allreduce_us"].value == pytest.approx(25_000 / 122)
    spec = model.predict("rtx-pro-6000-pcie-x8", _settings(
        ["--tp", "8", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
         "--speculative-num-draft-tokens", "4"], {}))
    verify = spec.steps[1]
    assert verify.kind == "verify" and verify.allreduces == 122
    assert verify.total_ms == pytest.approx(30.0)  # ~30 ms verify ...
    assert verify.allreduces * verify.allreduce_us / 1000 == pytest.approx(25.0)  # ... ~25 ms of it all-reduce
    assert verify.total_ms / spec.cycle_ms == pytest.approx(0.97)  # 97% of the cycle
    assert spec.tokens_per_s == pytest.approx(60.0)
    plain = model.predict("rtx-pro-6000-pcie-x8", _settings(["--tp", "8"], {}))
    assert plain.tokens_per_s == pytest.approx(82.0)


def test_the_documented_predictions_are_what_the_model_computes(model):
    assert model.predictions
    for doc in model.predictions:
        prediction = model.predict(doc["shape"], _settings(doc["flags"], doc["env"]))
        assert prediction.tokens_per_s == pytest.approx(doc["tokens_per_s"], abs=0.05), doc["config"]


def test_fusion_tp_and_nccl_settings_scale_only_the_all_reduce_part(model):
    base = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=8))
    fused = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=8, fusion=True))
    ll = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=8, nccl_proto="LL"))
    nop2p = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=8, p2p_disable=True))
    tp4 = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=4))
    tp1 = model.predict("rtx-pro-6000-pcie-x8", sm.Settings(tp=1))
    step = base.steps[0]
    assert fused.steps[0].compute_ms == step.compute_ms
    assert fused.steps[0].allreduce_us == pytest.approx(step.allreduce_us * 0.55)
    assert ll.steps[0].allreduce_us == pytest.approx(step.allreduce_us * 0.9)
    assert nop2p.steps[0].allreduce_us == pytest.approx(step.allreduce_us * 1.3)
    assert tp4.steps[0].allreduce_us == pytest.approx(step.allreduce_us * 3 / 7)
    assert tp1.steps[0].allreduces == 0 and tp1.tokens_per_s == pytest.approx(1000 / step.compute_ms)
    assert fused.tokens_per_s > base.tokens_per_s > nop2p.tokens_per_s


def test_measured_fusion_factors_come_from_the_two_h200_kernel_times(model):
    """nvlink-x2: the all-reduce and fused-kernel costs gpuops measured on 2x H200 (h200-x2)."""
    result = json.loads((REPO / model.sources["h200-x2"]["where"].split(" ")[0] /
                         "results/20261130T084959Z_localhost_fusion_768c8a48d7.json").read_text())
    graph = {row["tokens"]: row for row in result["summary"]["table"] if row["cuda_graph"]}
    f = model.figures("nvlink-x2")
    assert f["decode_allreduce_us"].value == pytest.approx(graph[1]["nccl_allreduce_us"], abs=0.01)
    assert f["verify_allreduce_us"].value == pytest.approx(graph[4]["nccl_allreduce_us"], abs=0.01)
    assert f["fusion_decode_factor"].value == pytest.approx(graph[1]["fused_us"] / graph[1]["unfused_nccl_us"], abs=1e-3)
    assert f["fusion_verify_factor"].value == pytest.approx(graph[4]["fused_us"] / graph[4]["unfused_nccl_us"], abs=1e-3)
    assert f["fusion_decode_factor"].basis == "derived" and not f["fusion_decode_factor"].on_assumption
    assert f["decode_compute_ms"].basis == "assumption"  # no decode rate was measured on it
    fused = model.predict("nvlink-x2", sm.Settings(tp=2, fusion=True))
    plain = model.predict("nvlink-x2", sm.Settings(tp=2))
    assert fused.steps[0].allreduce_us == pytest.approx(plain.steps[0].allreduce_us * f["fusion_decode_factor"].value)
    assert "fusion_decode_factor" in [x["name"] for x in fused.as_record()["figures"]]
    two_h200 = {"gpus": [{"compute_cap": "9.0"}] * 2, "nvlink": [[26.562] * 18] * 2}
    assert model.shape_for(two_h200)[0] == "nvlink-x2"


@pytest.mark.parametrize("gpu, shape, basis", [
    ("rtx-pro-6000-x8", "rtx-pro-6000-pcie-x8", "calibrated"),
    ("rtx-pro-6000-p2p-x8", "rtx-pro-6000-pcie-x8", "calibrated"),  # the same GPUs and links; P2P is no speed input
    ("h100-x8", "nvlink-x8", "assumption"),
    ("h200-x1", "single-gpu", "assumption"),
    ("rtx-pro-6000-ws-x4", "unmeasured", "assumption"),  # same GPUs, but not the 8 the report measured
])
def test_each_builtin_lab_gpu_gets_a_shape(model, gpu, shape, basis):
    chosen, reason = model.shape_for(load_description(gpu).replay)
    assert (chosen, model.shape_basis(chosen)) == (shape, basis), reason


def test_unknown_shapes_and_no_description_fall_back_to_an_assumption(model):
    four_sm90_pcie = {"gpus": [{"compute_cap": "9.0"}] * 4, "nvlink": []}
    assert model.shape_for(four_sm90_pcie)[0] == "unmeasured"
    assert model.shape_for(None) == ("unmeasured", "no GPU description: the default shape")
    assert model.shape_basis("unmeasured") == "assumption"
    record = model.predict("unmeasured", sm.Settings(tp=8)).as_record()
    assert record["label"] == f"unmeasured v{model.version}" and record["basis"] == "assumption"
    assert all(f["basis"] == "assumption" for f in record["figures"])


def test_a_broken_data_file_is_refused_with_its_path(tmp_path: Path):
    bad = tmp_path / "m.json"
    bad.write_text("{")
    with pytest.raises(sm.SpeedModelError, match="m.json: not valid JSON"):
        sm.load(str(bad))
    data = json.loads(Path(sm.DATA_FILE).read_text())
    del data["shapes"]["rtx-pro-6000-pcie-x8"]["figures"]["verify_ms"]
    bad.write_text(json.dumps(data))
    with pytest.raises(sm.SpeedModelError, match="rtx-pro-6000-pcie-x8.*lacks verify_compute_ms"):
        sm.load(str(bad)).figures("rtx-pro-6000-pcie-x8")
