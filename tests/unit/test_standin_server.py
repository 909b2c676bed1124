"""The stand-in SGLang server: API shapes, pacing, controls, start-up crash and SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuops.lab.standin_process import STANDIN_PATH, start_standin

sys.path.insert(0, str(STANDIN_PATH.parent))
import standin_sim as standin  # the stand-in is run by path; its simulation is a sibling file


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def post(url: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def sse_events(raw: bytes) -> list:
    events = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# ---------------------------------------------------------------- pure parts

def test_flags_use_sglang_field_names_and_keep_unknown_flags():
    fields = standin.parse_flags([
        "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8",
        "--enable-flashinfer-allreduce-fusion", "--cuda-graph-bs", "1", "2", "4",
        "--mem-fraction-static=0.85", "--speculative-algorithm", "EAGLE3",
    ])
    assert fields == {
        "model_path": "/m", "tp_size": 8, "enable_flashinfer_allreduce_fusion": True,
        "cuda_graph_bs": [1, 2, 4], "mem_fraction_static": 0.85, "speculative_algorithm": "EAGLE3",
    }


def test_missing_model_path_is_refused_like_sglang():
    with pytest.raises(SystemExit, match="--model-path"):
        standin.build_server_args(["--tp", "8"])


def test_speed_model_matches_the_field_report_story():
    # No GPU description: the "unmeasured" default shape, which borrows the field report's figures.
    base = standin.ServerSpeed(standin.build_server_args(["--model-path", "m", "--tp", "8"]), {})
    assert base.base_rate() == pytest.approx(82.0, abs=0.1)
    spec_flags = ["--model-path", "m", "--tp", "8", "--speculative-algorithm", "EAGLE3",
                  "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    spec = standin.ServerSpeed(standin.build_server_args(spec_flags), {})
    fused = standin.ServerSpeed(
        standin.build_server_args(spec_flags + ["--enable-flashinfer-allreduce-fusion"]), {})
    assert spec.base_rate() == pytest.approx(60.0, abs=0.05)  # the report's EAGLE-3 figure
    assert spec.base_rate() < base.base_rate()  # EAGLE-3 loses to plain decode before the fix
    assert fused.base_rate() > 1.3 * spec.base_rate()  # fusion: a visible gain (an assumed factor)
    backend = standin.ServerSpeed(standin.build_server_args(
        spec_flags + ["--flashinfer-allreduce-fusion-backend", "trtllm"]), {})
    assert backend.base_rate() == pytest.approx(fused.base_rate())
    auto = standin.ServerSpeed(standin.build_server_args(
        spec_flags + ["--flashinfer-allreduce-fusion-backend", "auto"]), {})
    assert auto.base_rate() == pytest.approx(spec.base_rate())
    tp1 = standin.ServerSpeed(standin.build_server_args(["--model-path", "m"]), {})
    assert tp1.prediction.steps[0].allreduces == 0
    assert tp1.base_rate() == pytest.approx(1000 / tp1.prediction.steps[0].compute_ms)
    record = base.record()
    assert record["shape"] == "unmeasured" and record["basis"] == "assumption"
    assert record["label"] == "unmeasured v%s" % record["version"]


def test_speed_model_shape_comes_from_the_hosts_gpu_description(tmp_path: Path):
    from gpuops.lab.gpu_description import load_description

    gpu_json = tmp_path / "gpu.json"
    gpu_json.write_text(json.dumps(load_description("rtx-pro-6000-x8").replay))
    model_dir = tmp_path / "Kimi"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 61}))
    server = standin.ServerSpeed(standin.build_server_args(["--model-path", str(model_dir), "--tp", "8"]),
                                {"GPUOPS_LAB_GPU": str(gpu_json)})
    record = server.record()
    assert record["shape"] == "rtx-pro-6000-pcie-x8" and record["basis"] == "calibrated"
    assert record["steps"][0]["allreduces"] == 122  # 2 x 61 layers, the report's count
    assert record["allreduce_count_from"] == "2 x num_hidden_layers (61) of the served model's config.json"
    assert {f["name"]: f["basis"] for f in record["figures"]} == {
        "calibrated_tp": "published", "decode_compute_ms": "assumption", "decode_allreduce_us": "derived",
        "decode_tokens_per_s": "published", "allreduces_per_step": "published"}  # every input, traced
    assert server.base_rate() == pytest.approx(82.0, abs=0.05)
    (model_dir / "config.json").write_text(json.dumps({"num_hidden_layers": 80}))
    deeper = standin.ServerSpeed(standin.build_server_args(["--model-path", str(model_dir), "--tp", "8"]),
                                {"GPUOPS_LAB_GPU": str(gpu_json)})
    assert deeper.record()["steps"][0]["allreduces"] == 160 and deeper.base_rate() < 82.0


def test_exact_rate_and_concurrency_slowdown():
    model = standin.ServerSpeed({"tp_size": 8}, {"GPUOPS_STANDIN_TOKENS_PER_S": "500"})
    assert model.rate(1) == 500
    assert model.rate(11) == pytest.approx(500 / 1.15)
    flat = standin.ServerSpeed({}, {"GPUOPS_STANDIN_TOKENS_PER_S": "500",
                                   "GPUOPS_STANDIN_CONCURRENCY_SLOWDOWN": "0"})
    assert flat.rate(64) == 500


def test_chunk_sizes_group_tokens_by_verify_cycle():
    spec = standin.ServerSpeed({"speculative_algorithm": "EAGLE3"}, {"GPUOPS_STANDIN_ACCEPT_LENGTH": "2.5"})
    sizes = spec.chunk_sizes(11)
    assert sizes[0] == 1 and sum(sizes) == 11 and set(sizes[1:]) <= {2, 3}
    plain = standin.ServerSpeed({}, {})
    assert plain.chunk_sizes(5) == [1, 1, 1, 1, 1]
    assert plain.chunk_sizes(0) == []


def test_crash_rules_match_env_or_flags():
    rules = standin.parse_crash_rules("NCCL_ALGO=Tree, enable_flashinfer_allreduce_fusion=true")
    args = {"enable_flashinfer_allreduce_fusion": False, "tp_size": 8}
    assert standin.matching_crash_rule(rules, args, {"NCCL_ALGO": "Ring"}) is None
    assert standin.matching_crash_rule(rules, args, {"NCCL_ALGO": "Tree"}) == ("NCCL_ALGO", "Tree")
    args["enable_flashinfer_allreduce_fusion"] = True
    assert standin.matching_crash_rule(rules, args, {}) == ("enable_flashinfer_allreduce_fusion", "true")
    assert standin.matching_crash_rule(standin.parse_crash_rules("--tp=8"), args, {}) == ("--tp", "8")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        standin.parse_crash_rules("NCCL_ALGO")


# ---------------------------------------------------------------- the running server

@pytest.fixture()
def spec_server(tmp_path: Path):
    flags = ["--model-path", "/models/Kimi-K2.5", "--tp", "8", "--speculative-algorithm", "EAGLE3",
             "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4", "--trust-remote-code"]
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "400", "GPUOPS_STANDIN_TTFT_MS": "20",
           "NCCL_P2P_LEVEL": "SYS", "SGLANG_ENABLE_X": "1", "HOME_SECRET": "x"}
    with start_standin(tmp_path, flags, env) as server:
        yield server


def test_info_endpoints(spec_server):
    info = get_json(spec_server.url + "/get_server_info")
    assert info["simulated"] is True
    assert info["server_args"]["tp_size"] == 8 and info["tp_size"] == 8
    assert info["server_args"]["speculative_algorithm"] == "EAGLE3"
    assert info["server_args"]["trust_remote_code"] is True
    assert info["env"]["NCCL_P2P_LEVEL"] == "SYS" and info["env"]["SGLANG_ENABLE_X"] == "1"
    assert "HOME_SECRET" not in info["env"]
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(1.8557, abs=1e-3)
    # An exact rate is still simulated, and says which control set it.
    assert info["speed_model"]["name"] == "exact-rate" and info["speed_model"]["label"] == "exact rate 400 tok/s"
    assert info["version"]
    model = get_json(spec_server.url + "/get_model_info")
    assert model == {"model_path": "/models/Kimi-K2.5", "tokenizer_path": "/models/Kimi-K2.5",
                     "is_generation": True, "simulated": True}
    assert get_json(spec_server.url + "/v1/models")["data"][0]["id"] == "/models/Kimi-K2.5"
    for route in ("/health", "/health_generate"):  # a bare 200, as SGLang answers (no body, no type)
        with urllib.request.urlopen(spec_server.url + route, timeout=10) as reply:
            assert reply.status == 200 and reply.read() == b"" and reply.headers.get("Content-Type") is None


def test_native_generate_streaming_carries_cumulative_counts(spec_server):
    status, raw = post(spec_server.url + "/generate",
                       {"text": "one two three", "sampling_params": {"max_new_tokens": 9}, "stream": True})
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts[0] == 1 and counts[-1] == 9 and counts == sorted(counts)
    assert max(b - a for a, b in zip(counts, counts[1:])) >= 2  # speculative: several tokens a chunk
    assert all(c["meta_info"]["prompt_tokens"] == 3 for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 9}
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert chunks[-1]["text"].startswith(chunks[-2]["text"])  # cumulative text


def test_native_generate_non_streaming(spec_server):
    status, raw = post(spec_server.url + "/generate",
                       {"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 6}})
    body = json.loads(raw)
    assert status == 200
    assert body["meta_info"]["completion_tokens"] == 6 and body["meta_info"]["prompt_tokens"] == 5
    assert body["text"]


def test_openai_completions_and_chat(spec_server):
    status, raw = post(spec_server.url + "/v1/completions", {"prompt": "a b", "max_tokens": 7})
    body = json.loads(raw)
    assert status == 200 and body["usage"] == {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}
    assert body["choices"][0]["finish_reason"] == "length"
    status, raw = post(spec_server.url + "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True,
                        "stream_options": {"include_usage": True}})
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8
    text = "".join(e["choices"][0]["delta"]["content"] for e in events[:-2])
    assert len(text.split()) >= 7
    status, raw = post(spec_server.url + "/v1/completions", {"prompt": "x", "max_tokens": 3, "stream": True})
    events = sse_events(raw)
    assert events[-2]["usage"]["completion_tokens"] == 3  # usage at the end even unasked


def test_bad_requests_get_clear_errors(spec_server):
    status, raw = post(spec_server.url + "/v1/chat/completions", {"messages": []})
    assert status == 400 and b"messages" in raw
    status, raw = post(spec_server.url + "/generate", {"sampling_params": {"max_new_tokens": "lots"}})
    assert status == 400
    status, _ = post(spec_server.url + "/nope", {})
    assert status == 404


def test_fail_after_tokens_errors_mid_stream(tmp_path):
    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "1000", "GPUOPS_STANDIN_TTFT_MS": "1",
           "GPUOPS_STANDIN_FAIL_AFTER_TOKENS": "3"}
    with start_standin(tmp_path, env=env) as server:
        _, raw = post(server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10},
                                                 "stream": True})
        events = sse_events(raw)
        assert [e["meta_info"]["completion_tokens"] for e in events[:3]] == [1, 2, 3]
        assert "after 3 tokens" in events[3]["error"]["message"]
        status, raw = post(server.url + "/v1/completions", {"prompt": "x", "max_tokens": 10})
        assert status == 500 and b"simulated failure" in raw


def test_startup_delay_then_healthy(tmp_path):
    server = start_standin(tmp_path, env={"GPUOPS_STANDIN_STARTUP_S": "2.5"}, wait_healthy=False)
    try:
        deadline = time.monotonic() + 10
        codes = []
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=1) as reply:
                    codes.append(reply.status)
                    break
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        assert 503 in codes and codes[-1] == 200
        while "fired up" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)  # the main thread logs it on its next look at the clock
        assert "fired up and ready to roll" in server.log()
    finally:
        server.stop()


def test_crash_if_logs_a_realistic_error_and_exits_1(tmp_path):
    server = start_standin(tmp_path, env={"GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree", "NCCL_ALGO": "Tree"},
                           wait_healthy=False)
    assert server.process.wait(20) == 1
    log = server.log()
    assert "Capture cuda graph failed" in log and "NCCL_ALGO=Tree" in log


def test_ngram_speculation_is_modelled_from_stated_assumptions():
    # The field box (tp 8): NGRAM drafts on the CPU (no draft model), but its verify pass pays the
    # same 122 all-reduces as EAGLE-3's, so it loses to plain decode there as well.
    base = standin.ServerSpeed(standin.build_server_args(["--model-path", "m", "--tp", "8"]), {})
    args = standin.build_server_args(["--model-path", "m", "--tp", "8", "--speculative-algorithm", "NGRAM"])
    assert (args["speculative_eagle_topk"], args["speculative_num_draft_tokens"], args["speculative_num_steps"]) \
        == (10, 12, 1)  # resolved as SGLang's _handle_ngram resolves them
    ngram = standin.ServerSpeed(args, {})
    assert ngram.accept_length == pytest.approx(2.0, abs=0.01)  # 0.5 over 11 drafted tokens
    assert ngram.base_rate() < base.base_rate()
    figures = {f["name"]: f for f in ngram.record()["figures"]}
    assert figures["ngram_accept_p"]["basis"] == "assumption" and figures["ngram_accept_p"]["source"] == "lab"
    assert figures["ngram_draft_ms"]["basis"] == "assumption"
    assert "accept_p" not in figures and "draft_ms_per_step" not in figures  # EAGLE's figures are not used


@pytest.mark.parametrize("extra, refused", [
    (["--page-size", "16", "--attention-backend", "triton"], True),
    (["--page-size", "16"], True),
    (["--page-size", "16", "--attention-backend", "flashinfer"], False),
    (["--page-size", "16", "--speculative-ngram-max-bfs-breadth", "1"], False),
    ([], False),
])
def test_an_ngram_launch_the_release_refuses_is_refused(extra, refused):
    args = standin.build_server_args(["--model-path", "m", "--speculative-algorithm", "NGRAM", *extra])
    text = standin.refused_launch(args)
    assert (text is not None) == refused
    if refused:  # the release's own words (0.5.8 server_args.py, 0.5.16 speculative_hook.py)
        assert text.startswith("speculative_eagle_topk(10) > 1 with page_size(16) > 1 is unstable")
    assert standin.refused_launch(standin.build_server_args(["--model-path", "m", *extra])) is None


def test_a_refused_launch_exits_1_before_its_port_opens(tmp_path):
    server = start_standin(tmp_path, flags=("--model-path", "/models/m", "--speculative-algorithm", "NGRAM",
                                            "--page-size", "16"), wait_healthy=False)
    assert server.process.wait(20) == 1
    assert "ValueError: speculative_eagle_topk(10) > 1 with page_size(16) > 1" in server.log()


def test_sigterm_exits_cleanly(tmp_path):
    server = start_standin(tmp_path)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(10) == 0
    assert "shutting down" in server.log()


def test_runs_under_python38(tmp_path):
    from labtools import require_python

    py38 = require_python("3.8")  # the stand-in is stdlib-only and runs on a host's 3.8
    done = subprocess.run([py38, "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())",
                           str(STANDIN_PATH)], capture_output=True)
    assert done.returncode == 0, done.stderr
    with start_standin(tmp_path, python=py38, env={"GPUOPS_STANDIN_TOKENS_PER_S": "2000",
                                                   "GPUOPS_STANDIN_TTFT_MS": "1"}) as server:
        status, raw = post(server.url + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4}})
        assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 4


def test_load_routes_count_the_requests_in_flight(spec_server):
    """``/v1/loads`` and ``/get_load`` as SGLang 0.5.8 shapes them: what a drain waits on."""
    import threading

    idle = get_json(spec_server.url + "/v1/loads")
    assert idle["loads"][0]["num_running_reqs"] == 0 and idle["aggregate"]["total_reqs"] == 0
    busy = threading.Thread(target=post, args=(spec_server.url + "/generate",
                                               {"text": "x", "sampling_params": {"max_new_tokens": 400}}))
    busy.start()  # ~1 s at 400 tok/s
    try:
        deadline = time.monotonic() + 5
        while get_json(spec_server.url + "/v1/loads")["loads"][0]["num_running_reqs"] != 1:
            assert time.monotonic() < deadline, "the running request was never counted"
            time.sleep(0.02)
        legacy = get_json(spec_server.url + "/get_load")
        assert legacy[0]["num_reqs"] == 1 and legacy[0]["dp_rank"] == 0
    finally:
        busy.join()
    assert get_json(spec_server.url + "/v1/loads")["loads"][0]["num_total_reqs"] == 0


def test_a_slow_writer_does_not_lengthen_the_recorded_ttft() -> None:
    """The stand-in's record (the truth bench tests hold the client to) stamps a chunk as it is
    handed to the writer, so a writer that takes long (a preempted thread on a busy machine) never
    makes a generation's TTFT longer than what a client measured: the parity test once read a
    client TTFT of 24.8 ms under a recorded 25.0 ms in a loaded whole run."""
    from gpuops.lab.standin_server import build_server_args
    from gpuops.lab.standin_sim import StandinState, generate_chunks

    env = {"GPUOPS_STANDIN_TOKENS_PER_S": "1000", "GPUOPS_STANDIN_TTFT_MS": "20"}
    state = StandinState(build_server_args(["--model-path", "/models/m", "--tp", "1"]), env, "0.5.8")
    for _ in generate_chunks(state, 16, 4):
        time.sleep(0.08)  # the write of each chunk
    (generation,) = list(state.recent)
    assert 0.019 <= generation["ttft_s"] < 0.06, generation


@pytest.mark.parametrize("release", ["0.4.0", "0.5.16"])
def test_the_version_is_read_from_the_releases_own_files(tmp_path: Path, release: str) -> None:
    """As SGLang finds its own (`_version.py`, else a literal in `version.py`): the release's two files
    alone, no dist-info beside them, so importlib.metadata cannot be what answers."""
    from gpuops.lab.sglang_cache import sglang_site

    package = tmp_path / "sglang"
    package.mkdir()
    for name in ("_version.py", "version.py", "__init__.py"):
        source = sglang_site(release) / "sglang" / name
        if source.exists():
            (package / name).write_bytes(source.read_bytes())
    code = ("import sys; sys.path[:0] = [%r, %r]; import standin_server; print(standin_server.installed_sglang_version())"
            % (str(tmp_path), str(STANDIN_PATH.parent)))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(STANDIN_PATH.parent.parent / "remote")}
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == release, done.stderr
