"""The remote bench client: its figures, framed output, failures and a clean stop with partial results."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuops.bench.frames import parse_frames
from gpuops.bench.options import BenchOptions, build_payload, stop_command
from gpuops.bench.runner import run_bench, targets_for
from gpuops.lab.ports import free_port
from gpuops.lab.standin_process import start_standin
from gpuops.bench.store import ResultsStore
from gpuops.inventory import local_inventory
from gpuops.remote import bench_http, bench_stats
from gpuops.shipping import python_command, python_stdin
from gpuops.transport import ConnectOptions


# ---------------------------------------------------------------- pure figures

def test_itl_is_per_token_when_chunks_carry_several_tokens():
    sample = {"ok": True, "chunks": [[0.100, 1], [0.110, 3], [0.115, 4], [0.130, 7]], "completion_tokens": 7}
    figures = bench_stats.sample_figures(sample)
    assert figures["ttft_s"] == pytest.approx(0.100)
    assert figures["decode_tokens"] == 6 and figures["decode_s"] == pytest.approx(0.030)
    assert figures["tokens_per_s"] == pytest.approx(200.0)
    assert figures["itls_s"] == pytest.approx([0.005, 0.005, 0.005, 0.005, 0.005, 0.005])


def test_spread_counts_ends_at_the_server_total():
    chunks = [[0.1, None], [0.2, None], [0.3, None], [0.4, None]]
    bench_http.spread_counts(chunks, 10)
    assert [c[1] for c in chunks] == [1, 4, 7, 10]
    single = [[0.1, None]]
    bench_http.spread_counts(single, 5)
    assert single[0][1] == 5


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert bench_stats.percentile(values, 50) == 3.0
    assert bench_stats.percentile(values, 90) == pytest.approx(7.6)
    assert bench_stats.percentile([], 50) is None


def test_summary_counts_failures_and_pools_decode_time():
    good = {"ok": True, "chunks": [[0.05, 1], [0.15, 11]], "completion_tokens": 11, "prompt_tokens": 4, "e2e_s": 0.15}
    good2 = {"ok": True, "chunks": [[0.05, 1], [0.35, 21]], "completion_tokens": 21, "prompt_tokens": 4, "e2e_s": 0.35}
    bad = {"ok": False, "error": "server error mid-stream: boom", "chunks": []}
    summary = bench_stats.summarize_samples([good, good2, bad], duration_s=1.0)
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["output_tokens_per_s"] == pytest.approx(30 / 0.4)
    assert summary["first_error"] == "server error mid-stream: boom"
    assert summary["request_throughput"] == 2.0 and summary["output_tokens"] == 32


def test_frames_survive_noise_and_a_cut_last_line():
    text = "\n".join([
        "some tool chatter",
        'GPUOPS-BENCH r1 start {"pid": 5}',
        'GPUOPS-BENCH other sample {"index": 99}',
        'GPUOPS-BENCH r1 sample {"index": 0, "ok": true}',
        'GPUOPS-BENCH r1 sample {"index": 1, "ok"',
    ])
    run = parse_frames(text, "r1")
    assert run.start == {"pid": 5}
    assert [s["index"] for s in run.samples] == [0]
    assert run.partial and not run.finished


def test_prompts_are_fixed_by_seed():
    assert bench_http.make_prompt_ids(3, 16, 32000) == bench_http.make_prompt_ids(3, 16, 32000)
    assert bench_http.make_prompt_ids(3, 16, 32000) != bench_http.make_prompt_ids(4, 16, 32000)
    # a vocabulary that holds the old range gets the prompts earlier results were measured with
    old = random.Random(3)
    assert bench_http.make_prompt_ids(3, 16, 152064) == [old.randint(1000, 20000) for _ in range(16)]
    path, body = bench_http.build_request("native", "m", 1, 8, 32, vocab_size=32000)
    assert path == "/generate" and len(body["input_ids"]) == 8
    assert body["sampling_params"] == {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    path, body = bench_http.build_request("chat", "m", 1, 8, 32)
    assert path == "/v1/chat/completions" and body["stream_options"] == {"include_usage": True}


# ---------------------------------------------------------------- against a live stand-in

def local_targets(url: str):
    return targets_for(local_inventory().select(None), None, url, remote=False)


def test_server_down_is_a_clear_error(tmp_path: Path):
    url = f"http://127.0.0.1:{free_port()}"
    states = run_bench(local_targets(url), BenchOptions(suite="decode", output_len=4), ResultsStore(tmp_path),
                       ConnectOptions(), remote=False)
    state = states["localhost"]
    assert state.status == "failed" and state.file is None
    assert f"cannot reach the server at {url}" in state.error
    assert not list(tmp_path.glob("*.json"))


def test_error_mid_stream_is_recorded_not_hidden(tmp_path: Path):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "1000", "GPUOPS_STANDIN_TTFT_MS": "1",
           "GPUOPS_STANDIN_FAIL_AFTER_TOKENS": "20"}
    with start_standin(tmp_path, env=env) as server:
        states = run_bench(local_targets(server.url), BenchOptions(suite="decode", output_len=50, warmup=1),
                           ResultsStore(tmp_path / "r"), ConnectOptions(), remote=False)
    state = states["localhost"]
    assert state.status == "failed"
    assert "mid-stream" in state.error and "after 20 tokens" in state.error
    # the failed request is a raw sample: the measurement shows what happened
    assert state.result["samples"][0]["ok"] is False


def test_serving_sweep_levels(tmp_path: Path):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "400", "GPUOPS_STANDIN_TTFT_MS": "5",
           "GPUOPS_STANDIN_CONCURRENCY_SLOWDOWN": "0.2"}
    with start_standin(tmp_path, env=env) as server:
        states = run_bench(local_targets(server.url),
                           BenchOptions(suite="serving", output_len=40, concurrency=(1, 4), warmup=1),
                           ResultsStore(tmp_path / "r"), ConnectOptions(), remote=False)
    result = states["localhost"].result
    assert states["localhost"].error is None
    one, four = sorted(result["levels"], key=lambda lv: lv["concurrency"])
    assert (one["concurrency"], four["concurrency"]) == (1, 4)
    assert one["completed"] == 4 and four["completed"] == 8  # max(4, 2 x c) requests per level
    # four streams at once: each is slower (the stand-in's batching cost: 400 -> 250 tok/s a stream),
    # together faster (1,000 tok/s); the rate accuracy itself is test_bench_accuracy's job
    assert four["output_tokens_per_s"] < one["output_tokens_per_s"]
    assert four["total_output_tokens_per_s"] > 1.5 * one["total_output_tokens_per_s"]
    assert len([s for s in result["samples"] if s["concurrency"] == 4]) == 8


def test_ctrl_c_stops_the_client_and_keeps_what_was_measured(tmp_path: Path):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "200", "GPUOPS_STANDIN_TTFT_MS": "1"}
    with start_standin(tmp_path, env=env) as server:
        options = BenchOptions(suite="decode", output_len=40, num_requests=1000, warmup=0)
        payload = build_payload(options, "stoptest1", server.url, {})
        proc = subprocess.Popen(["/bin/sh", "-c", python_command(sys.executable)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdin.write(python_stdin("bench_client", payload))
        proc.stdin.close()
        pid_file = Path(payload["pid_file"])
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        while time.monotonic() < deadline and proc.poll() is None:  # two requests done, then stop
            with urllib.request.urlopen(server.url + "/get_server_info", timeout=10) as reply:
                if json.loads(reply.read())["internal_states"][0]["completed_requests"] >= 2:
                    break
            time.sleep(0.05)
        subprocess.run(["/bin/sh", "-c", stop_command("stoptest1")], check=True)
        out = proc.stdout.read()
        assert proc.wait(20) == 0
    run = parse_frames(out.decode(), "stoptest1")
    assert run.finished and run.end["partial"] is True
    assert 1 <= len(run.samples) < 1000
    assert all(s["ok"] for s in run.samples)
    assert not pid_file.exists()


def serving_tool_bench(tmp_path: Path, server_env: dict) -> Any:
    """``bench --suite serving --tool sglang`` (local) against a stand-in started with ``server_env``,
    its host's sglang_python this test's python (which has no sglang of its own)."""
    from types import MappingProxyType

    from gpuops.bench.runner import BenchTarget
    from gpuops.inventory import Host

    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "500", "GPUOPS_STANDIN_TTFT_MS": "1", **server_env}
    with start_standin(tmp_path, env=env) as server:
        host = Host(name="h", address=None, port=None, user=None, key_file=None, connection="local",
                    groups=("all",), vars=MappingProxyType({"sglang_python": sys.executable}))
        options = BenchOptions(suite="serving", tool="sglang", concurrency=(1,))
        return run_bench([BenchTarget(host, server.url, sys.executable)], options, ResultsStore(tmp_path / "r"),
                         ConnectOptions(), remote=False)["h"]


def test_sglang_tool_without_sglang_fails_clearly(tmp_path: Path):
    # `--tool sglang` runs `<sglang_python> -m sglang.bench_serving` on the host; a python without
    # SGLang must fail that host with the tool's own last words, not hang or pass silently.
    state = serving_tool_bench(tmp_path, {})
    assert state.status == "failed" and state.file is None
    assert "sglang.bench_serving exited 1" in state.error and "No module named 'sglang'" in state.error


def test_client_runs_under_python38(tmp_path: Path):
    from labtools import require_python

    from gpuops.bench.runner import BenchTarget

    PY38 = require_python("3.8")  # the helper's 3.8 promise

    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "300", "GPUOPS_STANDIN_TTFT_MS": "5"}
    with start_standin(tmp_path, env=env) as server:
        target = BenchTarget(local_inventory().select(None)[0], server.url, str(PY38))
        state = run_bench([target], BenchOptions(suite="decode", output_len=30, num_requests=1, warmup=1),
                          ResultsStore(tmp_path / "r"), ConnectOptions(), remote=False)["localhost"]
    assert state.error is None, state.error
    assert state.result["host_facts"]["python"].startswith("3.8.")
    # The stand-in emits 300 tok/s at most. The decode rate is the tokens after the first over the
    # time after the first, and on a loaded machine (4 workers on 2 cores) the client can read the
    # first token late while the later ones wait in the socket: 30 tokens span ~97 ms, so a 4 ms late
    # first read reads 311 tok/s (a whole run on a quiet machine saw exactly that, once). This test
    # holds that the client runs under 3.8 and measures a plausible rate; the rate's accuracy is held
    # on an idle stand-in by test_bench_noise, not by a bound contention can break here.
    assert 0 < state.result["summary"]["output_tokens_per_s"] <= 300 * 1.2


def test_sglang_tool_runs_in_the_servers_environment(tmp_path: Path):
    # A real 0.5.16 on the H200 (tests/fixtures/real/h200-x1/sglang-0.5.16) ran from PYTHONPATH=/tmp/site
    # with a python that has no sglang of its own: `bench --tool sglang` ran that python without the
    # server's PYTHONPATH and failed "No module named 'sglang'". The tool must import what the server does.
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("__version__ = '0.5.16'\n")
    # SGLang's bench_serving as far as gpuops reads it: one JSONL line in --output-file.
    (site / "sglang" / "bench_serving.py").write_text(
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--output-file') + 1]\n"
        "line = {'completed': 2, 'duration': 1.0, 'request_throughput': 2.0, 'output_throughput': 100.0,\n"
        "        'total_output_tokens': 100, 'total_input_tokens': 20, 'mean_tpot_ms': 10.0, 'max_concurrency': 1}\n"
        "open(out, 'a').write(json.dumps(line) + '\\n')\n")
    state = serving_tool_bench(tmp_path, {"PYTHONPATH": str(site)})
    assert state.error is None, state.error
    assert state.result["levels"][0]["completed"] == 2
