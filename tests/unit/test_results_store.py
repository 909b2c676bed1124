"""Results: documents, fingerprints, the store and its index, compare, the HTML/Markdown report."""

from __future__ import annotations

import base64
import io
import json
import re
import sqlite3
from pathlib import Path

import pytest

from gpuops.bench.compare import compare_results
from gpuops.bench.fingerprint import configuration, fingerprint
from gpuops.bench.frames import RemoteRun
from gpuops.bench.options import AllreduceOptions, BenchOptions
from gpuops.bench.report import write_report
from gpuops.bench.results import RunContext, build_result, headline
from gpuops.bench.store import ResultsStore
from gpuops.errors import GpuopsError


def decode_run(run_id: str, rate: float, fusion: bool = False, env: dict | None = None,
               patched: list | None = None, version: str = "0.5.8") -> RemoteRun:
    gap = 1.0 / rate
    chunks = [[0.05 + i * gap, 1 + i] for i in range(64)]
    args = {"model_path": "/models/Kimi-K2.5", "tp_size": 8, "port": 30000, "host": "127.0.0.1",
            "speculative_algorithm": "EAGLE3", "enable_flashinfer_allreduce_fusion": fusion}
    run = RemoteRun(run_id=run_id)
    run.start = {"pid": 1}
    run.host = {"hostname": "gpu01", "gpus": [{"name": "NVIDIA RTX PRO 6000", "compute_cap": "12.0"}],
                "patched_sources": patched or []}
    run.server = {"url": "http://127.0.0.1:30000", "server_info": {
        "server_args": args, "env": {"NCCL_P2P_LEVEL": "SYS", **(env or {}), "GPUOPS_STANDIN_TTFT_MS": "5"},
        "version": version, "simulated": True, "internal_states": [{"avg_spec_accept_length": 2.18}]},
        "model_info": {"model_path": "/models/Kimi-K2.5"},
        "process_env": {"NCCL_IB_DISABLE": "1", "HF_TOKEN": "hf_secret"}}
    run.samples = [{"index": i, "ok": True, "chunks": chunks, "completion_tokens": 64, "prompt_tokens": 256,
                    "e2e_s": chunks[-1][0]} for i in range(3)]
    run.end = {"partial": False}
    return run


def allreduce_run(run_id: str) -> RemoteRun:
    run = RemoteRun(run_id=run_id)
    run.start = {"pid": 1}
    for algo, base in (("Ring", 30.0), ("Tree", 45.0)):
        for tokens in (1, 4, 16):
            latency = base + tokens * 2.0
            size = 7168 * tokens * 2
            run.allreduce.append({"variant": {"NCCL_ALGO": algo}, "tokens": tokens, "hidden_size": 7168,
                                  "bytes": size, "world_size": 8, "backend": "nccl", "cuda_graph": False,
                                  "ok": True, "latency_us": latency, "busbw_gbps": 1.75 * size / latency / 1e3,
                                  "step_cost_ms": latency * 122 / 1000, "allreduces_per_step": 122})
    run.end = {"partial": False}
    return run


def serving_run(run_id: str) -> RemoteRun:
    run = decode_run(run_id, 80.0)
    run.samples = []
    for c, total in ((1, 60.0), (4, 220.0), (16, 700.0)):
        run.levels.append({"concurrency": c, "completed": 2 * c, "failed": 0, "request_throughput": total / 64,
                           "total_output_tokens_per_s": total, "output_tokens_per_s": total / c * 1.2,
                           "ttft_ms": {"p50": 60.0 + c}, "itl_ms": {"p50": 12.0 + c / 4, "p90": 14.0, "p99": 20.0}})
    return run


def make(run: RemoteRun, suite: str = "decode", host: str = "gpu01") -> dict:
    options = BenchOptions(suite=suite, allreduce=AllreduceOptions())
    return build_result(RunContext(host, options, "http://127.0.0.1:30000", 1_790_000_000.0), run)


def test_result_document_is_complete_and_secret_free():
    result = make(decode_run("r1", 100.0))
    assert result["ok"] and not result["partial"]
    assert result["summary"]["output_tokens_per_s"] == pytest.approx(100.0)
    assert result["summary"]["accept_length"] == 2.18
    assert result["server"]["server_args"]["tp_size"] == 8
    assert result["server"]["version"] == "0.5.8"
    assert result["host_facts"]["gpus"][0]["compute_cap"] == "12.0"
    env = result["configuration"]["env"]
    assert env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}  # no secrets, no simulator knobs
    assert "hf_secret" not in json.dumps(result)
    assert "port" not in result["configuration"]["server_args"]
    line = headline(result)
    assert line["result_id"] == result["id"] and line["itl_ms"]["p50"] == pytest.approx(10.0)


def test_fingerprint_is_stable_and_sensitive():
    a = configuration({"tp_size": 8, "x": 1, "port": 1}, {"NCCL_ALGO": "Ring"}, "0.5.8", ["b", "a"])
    b = configuration({"x": 1, "tp_size": 8, "port": 2}, {"NCCL_ALGO": "Ring"}, "0.5.8", ["a", "b"])
    assert fingerprint(a) == fingerprint(b)
    for changed in (configuration({"tp_size": 4, "x": 1}, {"NCCL_ALGO": "Ring"}, "0.5.8", ["a", "b"]),
                    configuration({"tp_size": 8, "x": 1}, {"NCCL_ALGO": "Tree"}, "0.5.8", ["a", "b"]),
                    configuration({"tp_size": 8, "x": 1}, {"NCCL_ALGO": "Ring"}, "0.5.14", ["a", "b"]),
                    configuration({"tp_size": 8, "x": 1}, {"NCCL_ALGO": "Ring"}, "0.5.8", ["a"])):
        assert fingerprint(changed) != fingerprint(a)


def test_store_save_list_resolve_and_reindex(tmp_path: Path):
    store = ResultsStore(tmp_path / "results")
    first = make(decode_run("r1", 100.0))
    second = make(decode_run("r2", 120.0, fusion=True))
    path1 = store.save(first)
    store.save(second)
    assert path1.name.endswith(f"_gpu01_decode_{first['id']}.json")
    entries = store.entries()
    assert [e.id for e in entries] == sorted([first["id"], second["id"]], key=lambda i: (entries[0].created, i))
    assert sorted(e.output_tokens_per_s for e in entries) == [pytest.approx(100.0), pytest.approx(120.0)]
    assert store.load(first["id"][:6])["run_id"] == "r1"
    with pytest.raises(GpuopsError, match="no result 'zzz'"):
        store.resolve("zzz")
    with pytest.raises(GpuopsError, match="matches 2 results"):
        store.resolve("")
    # the index is derived: lose it, and listing rebuilds it from the files
    (tmp_path / "results" / "index.sqlite").unlink()
    assert len(store.entries()) == 2
    path1.unlink()
    assert [e.id for e in store.entries()] == [second["id"]]
    with sqlite3.connect(tmp_path / "results" / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 1


def test_compare_reports_deltas_and_configuration_differences():
    base = make(decode_run("r1", 66.0))
    fused = make(decode_run("r2", 100.0, fusion=True, env={"NCCL_PROTO": "LL"},
                            patched=["fusion-sm120:sglang/srt/layers/communicator.py"]))
    comparison = compare_results([base, fused])
    assert not comparison.same_configuration
    rate = next(m for m in comparison.metrics if m.name.startswith("output tokens/s"))
    assert rate.values == (pytest.approx(66.0), pytest.approx(100.0))
    assert rate.deltas_pct()[1] == pytest.approx(51.5, abs=0.1)
    assert rate.improved()[1] is True
    itl = next(m for m in comparison.metrics if m.name == "ITL p50")
    assert itl.improved()[1] is True  # lower is better
    diffs = {(d["section"], d["key"]): (d["a"], d["b"]) for d in comparison.config_diffs[0]["differences"]}
    assert diffs[("server_args", "enable_flashinfer_allreduce_fusion")] == (False, True)
    assert diffs[("env", "NCCL_PROTO")] == (None, "LL")
    assert diffs[("gates", "fusion-sm120:sglang/srt/layers/communicator.py")] == ("-", "patched")
    same = compare_results([base, make(decode_run("r3", 67.0))])
    assert same.same_configuration
    with pytest.raises(GpuopsError, match="at least two"):
        compare_results([base])


def test_allreduce_summary_ranks_variants():
    result = make(allreduce_run("a1"), suite="allreduce")
    summary = result["summary"]
    assert summary["best_variant"] == "NCCL_ALGO=Ring"
    assert summary["step_cost_ms"] == pytest.approx(32.0 * 122 / 1000)
    assert {v["label"] for v in summary["variants"]} == {"NCCL_ALGO=Ring", "NCCL_ALGO=Tree"}


def _decode_png(data: bytes):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.image as mpimg

    return mpimg.imread(io.BytesIO(data), format="png")


def test_report_html_has_valid_png_plots_and_markdown(tmp_path: Path):
    results = [make(decode_run("r1", 66.0)), make(decode_run("r2", 100.0, fusion=True)),
               make(allreduce_run("a1"), suite="allreduce"), make(serving_run("s1"), suite="serving")]
    html_path, md_path = write_report(results, tmp_path / "out" / "report.html")
    html = html_path.read_text()
    images = dict(re.findall(r"<img id='plot-([a-z_]+)' alt='[a-z_]+' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", html))
    assert set(images) == {"tokens_per_s", "itl_distribution", "allreduce_latency", "serving"}
    for data in images.values():
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = _decode_png(png)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert "simulated" in html and results[0]["id"] in html
    markdown = md_path.read_text()
    assert md_path.name == "report.md"
    assert "| id | host | suite |" in markdown and results[1]["id"] in markdown
    assert "+51.5%" in markdown  # the comparison table's delta of the decode rate
    assert "c=16 total output tokens/s" in markdown
    with pytest.raises(GpuopsError, match="no results"):
        write_report([], tmp_path / "x.html")


def test_hostile_host_names_stay_inside_the_results_dir(tmp_path: Path):
    store = ResultsStore(tmp_path / "results")
    result = make(decode_run("r9", 90.0), host="../../etc/passwd; rm -rf ~")
    path = store.save(result)
    assert path.parent == tmp_path / "results"
    assert "/" not in path.name and " " not in path.name and ";" not in path.name
    assert store.load(result["id"])["host"] == "../../etc/passwd; rm -rf ~"
