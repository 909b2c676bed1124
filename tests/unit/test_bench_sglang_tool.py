"""`--tool sglang`: bench_serving / bench_one_batch_server JSONL read into our schema.

The sample lines use the field names of the real release: the test reads them out of the downloaded
SGLang 0.5.8 source (``result = {...}`` in bench_serving.py, ``res = {...}`` in
bench_one_batch_server_internal.py) and checks that every field the parser reads really exists.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpuops.bench.frames import RemoteRun
from gpuops.bench.options import BenchOptions
from gpuops.bench.results import RunContext, build_result
from gpuops.bench.sglang_tool import one_batch_summary, serving_level, serving_samples
from gpuops.errors import GpuopsError

# One line as `python -m sglang.bench_serving --backend sglang --dataset-name random --random-input-len 256
# --random-output-len 128 --num-prompts 32 --max-concurrency 16 --output-file out.jsonl --output-details`
# writes it (server_info shortened; the figures are of an 8x RTX PRO 6000 EAGLE-3 shape).
BENCH_SERVING_LINE = json.dumps({
    "tag": None, "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
    "max_concurrency": 16, "sharegpt_output_len": None, "random_input_len": 256, "random_output_len": 128,
    "random_range_ratio": 0.0, "server_info": {"tp_size": 8, "version": "0.5.8"},
    "duration": 7.91, "completed": 32, "total_input_tokens": 4265, "total_input_text_tokens": 4265,
    "total_input_vision_tokens": 0, "total_output_tokens": 2180, "total_output_tokens_retokenized": 2178,
    "request_throughput": 4.045, "input_throughput": 539.2, "output_throughput": 275.6,
    "total_throughput": 814.8, "mean_e2e_latency_ms": 3650.1, "median_e2e_latency_ms": 3702.4,
    "std_e2e_latency_ms": 410.0, "p90_e2e_latency_ms": 4102.0, "p99_e2e_latency_ms": 4390.7,
    "mean_ttft_ms": 180.3, "median_ttft_ms": 171.9, "std_ttft_ms": 40.2, "p99_ttft_ms": 301.2,
    "mean_tpot_ms": 51.2, "median_tpot_ms": 50.7, "std_tpot_ms": 3.1, "p99_tpot_ms": 60.3,
    "mean_itl_ms": 102.4, "median_itl_ms": 98.8, "std_itl_ms": 20.1, "p95_itl_ms": 140.2, "p99_itl_ms": 171.0,
    "concurrency": 14.77, "accept_length": 2.12, "max_output_tokens_per_s": 320.0, "max_concurrent_requests": 16,
    "input_lens": [133, 140], "output_lens": [68, 70], "ttfts": [0.17, 0.18],
    "itls": [[0.1, 0.09], [0.1, 0.11]], "generated_texts": ["..", ".."], "errors": ["", ""],
})

ONE_BATCH_LINE = json.dumps({
    "run_name": "default", "batch_size": 1, "input_len": 256, "output_len": 256, "latency": 3.9214,
    "input_throughput": 1489.55, "output_throughput": 65.28, "overall_throughput": 130.56,
    "last_ttft": 0.1719, "last_gen_throughput": 66.02, "acc_length": 2.18, "cache_hit_rate": None,
})


def _dict_keys_assigned(source: str, name: str) -> set[str]:
    keys: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return keys


@pytest.fixture(scope="module")
def sglang_058() -> Path:
    from gpuops.lab.sglang_cache import sglang_source

    try:
        return sglang_source("0.5.8")
    except GpuopsError as exc:
        pytest.skip(f"SGLang 0.5.8 release not available: {exc}")


def test_sample_lines_use_the_real_field_names(sglang_058: Path):
    serving_keys = _dict_keys_assigned((sglang_058 / "bench_serving.py").read_text(), "result")
    details_keys = _dict_keys_assigned((sglang_058 / "bench_serving.py").read_text(), "result_details")
    assert set(json.loads(BENCH_SERVING_LINE)) == serving_keys | details_keys
    one_batch_keys = _dict_keys_assigned(
        (sglang_058 / "test" / "bench_one_batch_server_internal.py").read_text(), "res")
    assert set(json.loads(ONE_BATCH_LINE)) == one_batch_keys
    # and the module/flag names the runner uses exist in that release
    assert '"--output-file"' in (sglang_058 / "bench_serving.py").read_text()
    assert '"--result-filename"' in (sglang_058 / "test" / "bench_one_batch_server_internal.py").read_text()


def test_bench_serving_line_to_level():
    level = serving_level(json.loads(BENCH_SERVING_LINE))
    assert level["concurrency"] == 16 and level["completed"] == 32
    assert level["total_output_tokens_per_s"] == 275.6 and level["request_throughput"] == 4.045
    assert level["output_tokens_per_s"] == pytest.approx(1000 / 51.2)
    assert level["ttft_ms"]["p50"] == 171.9 and level["itl_ms"]["p99"] == 171.0 and level["itl_ms"]["p95"] == 140.2
    assert level["accept_length"] == 2.12
    samples = serving_samples(json.loads(BENCH_SERVING_LINE))
    assert [s["completion_tokens"] for s in samples] == [68, 70] and samples[1]["itls_s"] == [0.1, 0.11]


def test_one_batch_line_to_decode_summary():
    summary = one_batch_summary(json.loads(ONE_BATCH_LINE))
    assert summary["output_tokens_per_s"] == 65.28  # the tool's own measurement, not the server's statistic
    assert summary["server_last_gen_throughput"] == 66.02
    assert summary["ttft_ms"]["p50"] == pytest.approx(171.9)
    assert summary["accept_length"] == 2.18


def test_the_real_0516_one_batch_line_gives_the_measured_rate():
    # What a real 0.5.16's sglang.benchmark.one_batch_server wrote on the H200 (device call 4,
    # benchmarks/results/h200-x1/real-sglang/call4): 64 tokens 26.2 ms after the first, in 153.9 ms.
    # Its last_gen_throughput is the scheduler's interval statistic (0.93, idle time included) and
    # -1 means not measured: read as the rate they gave "0.93 tok/s, ITL 1,075 ms, accept -1.00".
    line = {"run_name": "default", "batch_size": 1, "input_len": 128, "output_len": 64, "latency": 0.1539,
            "input_throughput": 4885.5, "output_throughput": 501.23, "last_ttft": 0.0262,
            "last_gen_throughput": 0.93, "acc_length": -1.0}
    summary = one_batch_summary(line)
    assert summary["output_tokens_per_s"] == 501.23
    assert summary["itl_ms"]["p50"] == pytest.approx(1000 / 501.23)
    assert summary["accept_length"] is None and summary["server_last_gen_throughput"] == 0.93
    assert summary["tool_record"] == line


def test_a_line_without_figures_is_refused():
    with pytest.raises(GpuopsError, match="bench_serving"):
        serving_level({"backend": "sglang"})
    with pytest.raises(GpuopsError, match="bench_one_batch_server"):
        one_batch_summary({"batch_size": 1})


def test_tool_records_become_a_serving_result():
    run = RemoteRun(run_id="t1")
    run.start = {"pid": 1}
    low = json.loads(BENCH_SERVING_LINE)
    low.update({"max_concurrency": 1, "output_throughput": 66.0})
    run.tool = [low, json.loads(BENCH_SERVING_LINE)]
    run.end = {"partial": False}
    options = BenchOptions(suite="serving", tool="sglang", concurrency=(1, 16))
    result = build_result(RunContext("gpu01", options, "http://127.0.0.1:30000", 0.0), run)
    assert result["ok"], result["errors"]
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 16]
    assert result["summary"]["peak_total_output_tokens_per_s"] == 275.6
    assert len(result["samples"]) == 4


def test_the_tool_asks_for_ids_in_the_vocabulary_where_the_release_has_them(sglang_058: Path):
    # SGLang's "random" dataset downloads ShareGPT from the Hub: on the offline H200 a real 0.5.16's
    # tool died with LocalEntryNotFoundError (benchmarks/results/h200-x1/real-sglang). "random-ids"
    # needs no download; a release without it (0.5.8) gets its own default, as before.
    from gpuops.lab.sglang_cache import sglang_source
    from gpuops.remote.bench_tool import dataset_args, tool_module

    asked = ["--batch-size", "1", "--dataset-name", "random-ids", "--input-len", "8"]
    root_0516 = str(sglang_source("0.5.16"))
    for module in ("sglang.bench_one_batch_server", "sglang.bench_serving"):
        assert dataset_args(asked, tool_module(module, root_0516), root_0516) == asked
    assert dataset_args(asked, "sglang.bench_serving", str(sglang_058)) == asked
    assert dataset_args(asked, "sglang.bench_one_batch_server", str(sglang_058)) == [
        "--batch-size", "1", "--input-len", "8"]
    assert dataset_args(asked, "sglang.bench_serving", None) == asked  # unreadable: as asked


def test_a_fifo_in_the_release_or_the_model_does_not_block_the_bench(tmp_path: Path):
    # Everything a host holds is untrusted: a FIFO named like a benchmark module or a model's
    # config.json is not read (and never waited on); the bench goes on as if it were unreadable.
    import os
    import threading

    from gpuops.remote.bench_snapshot import served_vocab
    from gpuops.remote.bench_tool import dataset_args, reads_key

    root = tmp_path / "sglang"
    (root / "benchmark").mkdir(parents=True)
    os.mkfifo(root / "benchmark" / "serving.py")
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    answers: dict = {}

    def ask() -> None:
        asked = ["--dataset-name", "random-ids"]
        answers["args"] = dataset_args(asked, "sglang.benchmark.serving", str(root))
        answers["key"] = reads_key("sglang.benchmark.serving", str(root))
        answers["vocab"] = served_vocab({"model_info": {"model_path": str(model)}})

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "blocked on a FIFO"
    assert answers["args"] == ["--dataset-name", "random-ids"] and answers["key"] is None
    assert answers["vocab"]["vocab_size"] is None and "not a regular file" in answers["vocab"]["reason"]
