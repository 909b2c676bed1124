"""Lab hosts on 0.5.8, 0.5.16 and 0.5.23 stand-ins (the routes and ``/server_info`` fields of each
release, read from its source), and a 0.5.23-shaped server with the deprecated aliases removed:
apply with its health wait and smoke check, inspect, and bench work on each, asking each server the
way it answers; bench keeps the server's ``/metrics`` deltas over the run."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

ARGS = ("--model-path", "/models/Qwen3-32B", "--tp", "4", "--enable-metrics",
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4")
# The host without aliases asks for 8 draft tokens at top-k 1; SGLang runs steps + 1 = 4
# (srt/arg_groups/speculative_hook.py), and its /server_info says so.
BARE_ARGS = tuple("8" if i > 0 and ARGS[i - 1] == "--speculative-num-draft-tokens" else w for i, w in enumerate(ARGS))
FAST = ("-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5")


def test_apply_inspect_and_bench_on_each_release(lab_factory, run_gpuops, tmp_path) -> None:
    from gpuops.lab.hosts import LabSpec

    base = {"GPUOPS_STANDIN_TOKENS_PER_S": "400", "GPUOPS_STANDIN_ACCEPT_LENGTH": "2.5"}
    lab = lab_factory(
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.8", names=("r058",), server_args=ARGS, server_env=base),
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.16", names=("r0516",), server_args=ARGS, server_env=base),
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.23", names=("r0523",), server_args=ARGS, server_env=base),
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.23", names=("bare",), server_args=BARE_ARGS,
                server_env={**base, "GPUOPS_STANDIN_DROP_DEPRECATED": "1",
                            "GPUOPS_STANDIN_RESOLVE": "attention_backend=flashinfer,disable_custom_all_reduce=true,"
                                                      "speculative_num_draft_tokens=4"}),
    )
    inv = str(lab.inventory_path)
    versions = {"r058": "0.5.8", "r0516": "0.5.16", "r0523": "0.5.23", "bare": "0.5.23"}
    bare = next(h for h in lab.hosts if h.name == "bare")
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError):  # the alias really is gone on that server
        urllib.request.urlopen(f"http://127.0.0.1:{bare.server_port}/get_server_info", timeout=10)

    # apply: a restart, the health wait (/health, then the model's report) and the smoke check's prompts
    proc = run_gpuops("apply", "nccl-env", "-i", inv, "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}',
                      "-e", "smoke_check=true", *FAST, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    for name in versions:
        assert hosts[name]["status"] == "finished", hosts[name]
        assert any("answer the same" in n for n in hosts[name]["notes"]), hosts[name]["notes"]

    # inspect: the server's own report, asked the way its release answers
    proc = run_gpuops("inspect", "host", "-i", inv, "--json", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    for name, version in versions.items():
        server = doc["hosts"][name]["facts"]["server"] if "facts" in doc["hosts"][name] else doc["hosts"][name]["server"]
        reported = server["reported"]
        assert reported["error"] is None and reported["route"] == "/server_info", reported
        assert reported["version"] == version and reported["settings"]["speculative_algorithm"] == "EAGLE3"
        assert server["metrics_enabled"] is True
        assert ("launch_command" in reported and reported["launch_command"] is not None) == (version == "0.5.23")
        # speculative decoding as the server runs it, from its own resolved settings
        speculative = server["speculative_in_effect"]
        assert speculative["in_effect"] is True and speculative["source"] == "/server_info", speculative
        assert speculative["settings"] == {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
        assert speculative["disagreements"] == (
            ["launched with --speculative-num-draft-tokens 8, the server runs 4"] if name == "bare" else []), speculative
    bare_settings = (doc["hosts"]["bare"].get("facts") or doc["hosts"]["bare"])["server"]["reported"]["settings"]
    assert bare_settings["attention_backend"] == "flashinfer" and bare_settings["disable_custom_all_reduce"] is True
    text = run_gpuops("inspect", "host", "-v", "-i", inv, "-l", "bare", timeout=400).stdout
    assert "the server reports (via /server_info, version 0.5.23)" in text and "attention_backend=flashinfer" in text
    assert "metrics: on (/metrics)" in text
    assert ("speculative decoding on: the server reports EAGLE3 (steps 3, topk 1, draft tokens 4) in its resolved "
            "settings (/server_info)") in text and "launched with --speculative-num-draft-tokens 8, the server runs 4" in text

    # bench: each server asked right, and its /metrics deltas over the run kept
    results = tmp_path / "results"
    proc = run_gpuops("bench", "--remote", "-i", inv, "--suite", "decode", "--results-dir", str(results),
                      "--num-requests", "3", "--warmup", "0", "--input-len", "16", "--output-len", "32", "--json",
                      timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = json.loads(proc.stdout)["hosts"]
    for name, version in versions.items():
        line = lines[name]
        assert line["ok"], line
        stored = json.loads(open(line["result_file"]).read())
        assert stored["server"]["version"] == version
        assert stored["server"]["routes"]["server_info"] == "/server_info"
        deltas = stored["server_metrics"]["deltas"]
        assert deltas["requests"] == 3 and deltas["generation_tokens"] == 96, deltas
        assert deltas["decode_cuda_graph_passes"] > 0 and deltas["decode_eager_passes"] == 0
        # 0.5.8's collector has no spec_verify_calls_total: the stand-in follows the release
        assert (deltas["spec_verify_calls"] is None) == (version == "0.5.8"), deltas
        if version != "0.5.8":
            assert 2.0 <= deltas["tokens_per_verify"] <= 3.2, deltas
        assert line["server_metrics"] == deltas
        # the bench's record of speculative decoding: the server's resolved settings, the flags beside them
        speculative = stored["server"]["speculative_in_effect"]
        assert speculative["source"] == "/server_info" and speculative["settings"]["num_draft_tokens"] == 4
        assert bool(speculative["disagreements"]) == (name == "bare") and line["speculative"] == speculative
        assert stored["configuration"]["server_args"]["speculative_num_draft_tokens"] == 4
    shown = run_gpuops("bench", "--remote", "-i", inv, "-l", "bare", "--suite", "decode", "--results-dir", str(results),
                       "--num-requests", "1", "--warmup", "0", "--input-len", "16", "--output-len", "8", timeout=400)
    assert "bare: speculative decoding on: the server reports EAGLE3" in shown.stdout, shown.stdout + shown.stderr
