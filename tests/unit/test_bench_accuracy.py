"""The measured decode rate is within 2% of the truth, from 50 to 2,000 tok/s (stand-in at an exact rate).

The whole path runs: payload -> client shipped on stdin to a local python -> framed output -> result.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.bench.options import BenchOptions
from gpuops.bench.runner import run_bench, targets_for
from gpuops.bench.standin_process import start_standin
from gpuops.bench.store import ResultsStore
from gpuops.inventory import local_inventory
from gpuops.transport import ConnectOptions

SPEC_FLAGS = ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--speculative-algorithm", "EAGLE3",
              "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")


def bench_local(tmp_path: Path, url: str, options: BenchOptions) -> dict:
    targets = targets_for(local_inventory().select(None), None, url, remote=False)
    states = run_bench(targets, options, ResultsStore(tmp_path / "results"), ConnectOptions(), remote=False)
    state = states["localhost"]
    assert state.error is None, state.error
    assert state.file is not None and state.file.is_file()
    return state.result


# Few tokens at low rates keep the test short: about 1 s of decoding per rate.
@pytest.mark.parametrize("rate,tokens", [(50, 24), (500, 160), (2000, 600)])
def test_measured_rate_within_2_percent(tmp_path: Path, rate: int, tokens: int):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": str(rate), "GPUOPS_STANDIN_TTFT_MS": "40"}
    with start_standin(tmp_path, env=env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", output_len=tokens,
                                                                num_requests=2, warmup=1, input_len=32))
    summary = result["summary"]
    assert summary["completed"] == 2 and summary["output_tokens"] == 2 * tokens
    assert summary["output_tokens_per_s"] == pytest.approx(rate, rel=0.02)
    assert summary["itl_ms"]["p50"] == pytest.approx(1000.0 / rate, rel=0.05)
    assert summary["ttft_ms"]["p50"] == pytest.approx(40.0, abs=25.0)
    assert result["server"]["simulated"] is True


def test_speculative_chunks_give_per_token_itl(tmp_path: Path):
    # Chunks carry 2-3 tokens (accept length 2.5); ITL per token must still be 1/rate.
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "400", "GPUOPS_STANDIN_TTFT_MS": "10",
           "GPUOPS_STANDIN_ACCEPT_LENGTH": "2.5"}
    with start_standin(tmp_path, SPEC_FLAGS, env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", output_len=201,
                                                                num_requests=1, warmup=1))
    summary = result["summary"]
    steps = [b[1] - a[1] for a, b in zip(result["samples"][0]["chunks"], result["samples"][0]["chunks"][1:])]
    assert set(steps) == {2, 3}
    assert summary["output_tokens_per_s"] == pytest.approx(400, rel=0.02)
    assert summary["itl_ms"]["p50"] == pytest.approx(2.5, rel=0.05)
    assert summary["accept_length"] == pytest.approx(2.5)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_apis_measure_the_same_rate(tmp_path: Path, api: str):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "300", "GPUOPS_STANDIN_TTFT_MS": "10"}
    with start_standin(tmp_path, env=env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", api=api, output_len=90,
                                                                num_requests=2, warmup=1))
    assert result["summary"]["output_tokens"] == 180  # from the server's usage, not the text
    assert result["summary"]["output_tokens_per_s"] == pytest.approx(300, rel=0.02)
