"""The measured decode rate is within 2% of the truth, from 50 to 2,000 tok/s (stand-in at an exact rate).

The whole path runs: payload -> client shipped on stdin to a local python -> framed output -> result.

The truth is what the stand-in really emitted (it records when each chunk left; /get_server_info
``recent_generations``): every request's rate and the run's summary must be within 2% of it, or the
test fails. That truth does not depend on how busy the machine is, so a loaded machine can neither
skip these tests nor pass them by luck; how late a busy client reads a chunk does, which is why each
request decodes long enough for such a delay to stay well inside the bound. Whether the stand-in kept the rate it was given is a
separate question about the stand-in, measured on its own (``test_standin_keeps_its_pace``).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from gpuops.bench.options import BenchOptions
from gpuops.bench.runner import run_bench, targets_for
from gpuops.lab.standin_process import StandinProcess, start_standin
from gpuops.bench.store import ResultsStore
from gpuops.inventory import local_inventory
from gpuops.remote.bench_stats import sample_figures
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


def emitted(server: StandinProcess, count: int) -> list[dict]:
    """The stand-in's own record of its last ``count`` generations (decode tokens, decode seconds)."""
    with urllib.request.urlopen(server.url + "/get_server_info", timeout=10) as reply:
        return json.loads(reply.read())["internal_states"][0]["recent_generations"][-count:]


def held_rate(spans: list[dict]) -> float:
    """The decode rate the stand-in really emitted over these generations (its own clock)."""
    return sum(s["decode_tokens"] for s in spans) / sum(s["decode_s"] for s in spans)


def check_against_truth(result: dict, spans: list[dict]) -> None:
    samples = result["samples"]
    assert len(samples) == len(spans)
    for sample, span in zip(samples, spans):
        figures = sample_figures(sample)
        assert figures["decode_tokens"] == span["decode_tokens"]
        server_rate = span["decode_tokens"] / span["decode_s"]
        assert figures["tokens_per_s"] == pytest.approx(server_rate, rel=0.02)  # the client's own error
    assert result["summary"]["output_tokens_per_s"] == pytest.approx(held_rate(spans), rel=0.02)


def check_itl(result: dict, spans: list[dict]) -> None:
    """ITL: its mean against the stand-in's truth, its p50 against the client's own chunk times.

    The mean of the per-token ITLs is the decode time over the decode tokens, so it has a truth
    (what the stand-in emitted) that load does not move. The median has none: a late wake-up of the
    stand-in's writer is caught up by a burst of chunks (its deadline schedule), and a busy client
    reads several chunks at once, so under load the median gap falls below the mean (0.473 vs 0.500 ms
    at 2000 tok/s) while every rate is right. The p50 is checked as what it is, the median of the
    per-token gaps of the measured requests, recomputed from their raw chunks.
    """
    from gpuops.remote.bench_stats import describe

    itl = result["summary"]["itl_ms"]
    assert itl["mean"] == pytest.approx(1000.0 / held_rate(spans), rel=0.02)
    gaps = [x * 1000.0 for s in result["samples"] for x in sample_figures(s)["itls_s"]]
    assert itl["p50"] == pytest.approx(describe(gaps)["p50"])


# About 0.8-2 s of decoding per request: few tokens at low rates keep the test short. The client's
# window runs from its read of the first token to its read of the last, so a read made late by the
# machine's load moves it: at 2,000 tok/s the client parses 2,000 chunks a second, and on CI's two
# busy cores it once read the last one 31 ms late (2.2% of that request's 1.41 s). Two seconds there
# keeps such a delay under the 2% bound. At 50 tok/s a read 19 ms late failed a 0.8 s request (2.4%,
# a whole run, 2026-12-03): 1.6 s there. The 0.8-1.6 s requests at the lower rates still fail a
# window that wrongly includes the 40 ms TTFT (2.5-5%). The other tests here decode 1.5-1.6 s per request for
# the same reason: the chat case at 0.8 s failed once (a whole run beside another, 2026-12-03: 280.9
# against 287.8 tok/s, the last chunk read ~20 ms late).
@pytest.mark.parametrize("rate,tokens", [(50, 80), (500, 400), (2000, 4000)])
def test_measured_rate_within_2_percent(tmp_path: Path, rate: int, tokens: int):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": str(rate), "GPUOPS_STANDIN_TTFT_MS": "40"}
    with start_standin(tmp_path, env=env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", output_len=tokens,
                                                                num_requests=2, warmup=1, input_len=32))
        spans = emitted(server, 2)
    summary = result["summary"]
    assert summary["completed"] == 2 and summary["output_tokens"] == 2 * tokens
    assert summary["ttft_ms"]["p50"] >= 39.0  # the server holds the first token back 40 ms
    assert result["server"]["simulated"] is True
    check_against_truth(result, spans)
    check_itl(result, spans)


def test_speculative_chunks_give_per_token_itl(tmp_path: Path):
    # Chunks carry 2-3 tokens (accept length 2.5); ITL per token must still be 1/rate.
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "400", "GPUOPS_STANDIN_TTFT_MS": "10",
           "GPUOPS_STANDIN_ACCEPT_LENGTH": "2.5"}
    with start_standin(tmp_path, SPEC_FLAGS, env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", output_len=601,
                                                                num_requests=1, warmup=1))
        spans = emitted(server, 1)
    chunks = result["samples"][0]["chunks"]
    assert {b[1] - a[1] for a, b in zip(chunks, chunks[1:])} == {2, 3}
    assert result["summary"]["accept_length"] == pytest.approx(2.5)
    check_against_truth(result, spans)
    check_itl(result, spans)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_apis_measure_the_same_rate(tmp_path: Path, api: str):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "300", "GPUOPS_STANDIN_TTFT_MS": "10"}
    with start_standin(tmp_path, env=env) as server:
        result = bench_local(tmp_path, server.url, BenchOptions(suite="decode", api=api, output_len=480,
                                                                num_requests=2, warmup=1))
        spans = emitted(server, 2)
    assert result["summary"]["output_tokens"] == 960  # from the server's usage, not the text
    check_against_truth(result, spans)


# The stand-in's own pace, on its own: at a rate its deadline schedule keeps even on a busy machine
# (one chunk every 20 ms, 2 s in all, so one late wake-up of 60 ms stays within 3%), with no gpuops
# client involved: its record of what it emitted is read back.
def test_standin_keeps_its_pace(tmp_path: Path):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "50", "GPUOPS_STANDIN_TTFT_MS": "10"}
    with start_standin(tmp_path, env=env) as server:
        body = json.dumps({"text": "x", "sampling_params": {"max_new_tokens": 101}}).encode()
        request = urllib.request.Request(server.url + "/generate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
        spans = emitted(server, 1)
    assert spans[0]["decode_tokens"] == 100
    held = held_rate(spans)
    assert held == pytest.approx(50, rel=0.03), f"the stand-in emitted {held:.1f} tok/s, not its 50 tok/s"
