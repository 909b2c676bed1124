"""Bench options and payloads: variants, tool argv, hostile values, one-line errors."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from gpuops.bench.options import (
    AllreduceOptions,
    BenchOptions,
    build_payload,
    expand_env_variants,
    host_port,
    parse_int_list,
    parse_tool_args,
    stop_command,
    tool_runs,
)
from gpuops.errors import GpuopsError


def test_env_variants_are_the_cross_product():
    variants = expand_env_variants(["NCCL_ALGO=Ring,Tree", "NCCL_PROTO=LL,LL128,Simple", "NCCL_NVLS_ENABLE=0"])
    assert len(variants) == 6
    assert dict(variants[0]) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_NVLS_ENABLE": "0"}
    assert dict(variants[-1]) == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "0"}
    assert expand_env_variants([]) == ((),)


@pytest.mark.parametrize("spec", ["NCCL_ALGO", "BAD KEY=1", "1X=2", "A=1,,2", "$(reboot)=1"])
def test_bad_env_specs_are_refused(spec):
    with pytest.raises(GpuopsError, match="--env"):
        expand_env_variants([spec])


def test_same_env_key_twice_is_refused():
    with pytest.raises(GpuopsError, match="twice"):
        expand_env_variants(["NCCL_ALGO=Ring", "NCCL_ALGO=Tree"])


def test_option_checks():
    assert parse_int_list("1, 4,16", "--concurrency") == (1, 4, 16)
    with pytest.raises(GpuopsError, match="--concurrency"):
        parse_int_list("1,x", "--concurrency")
    with pytest.raises(GpuopsError, match="positive"):
        parse_int_list("0", "--concurrency")
    with pytest.raises(GpuopsError, match="suite"):
        BenchOptions(suite="prefill")
    with pytest.raises(GpuopsError, match="output-len"):
        BenchOptions(suite="decode", output_len=1)
    with pytest.raises(GpuopsError, match="not allreduce"):
        BenchOptions(suite="allreduce", tool="sglang")
    with pytest.raises(GpuopsError, match="sglang_port"):
        host_port({"sglang_port": "http"}, None)
    assert host_port({"sglang_port": "31000"}, None) == 31000
    assert host_port({"sglang_port": 31000}, 32000) == 32000
    with pytest.raises(GpuopsError, match="tool-args"):
        parse_tool_args("--x 'unclosed")


def test_tool_runs_fill_defaults_and_keep_user_args():
    options = BenchOptions(suite="serving", concurrency=(1, 8), input_len=100, output_len=50,
                           tool="sglang", tool_args=parse_tool_args("--num-prompts 7 --dataset-name sharegpt"))
    module, flag, runs = tool_runs(options)
    assert module == "sglang.bench_serving" and flag == "--output-file"
    assert len(runs) == 2
    first = runs[0]
    assert first[first.index("--max-concurrency") + 1] == "1"
    assert first.count("--num-prompts") == 1 and first[first.index("--num-prompts") + 1] == "7"
    assert first.count("--dataset-name") == 1 and "sharegpt" in first
    assert first[first.index("--random-input-len") + 1] == "100"
    module, flag, runs = tool_runs(BenchOptions(suite="decode", tool="sglang", output_len=64))
    assert module == "sglang.bench_one_batch_server" and flag == "--result-filename"
    assert runs[0][runs[0].index("--batch-size") + 1] == "1"


def test_payload_carries_host_vars_and_worker():
    options = BenchOptions(suite="allreduce", allreduce=AllreduceOptions(
        env_variants=expand_env_variants(["NCCL_PROTO=LL,Simple"]), cuda_graph=True))
    payload = build_payload(options, "abc", "http://127.0.0.1:30000",
                            {"sglang_python": "/opt/venv/bin/python", "gpuops_state_dir": "/var/lib/gpuops"},
                            worker_source="print(1)")
    assert payload["allreduce"]["python"] == "/opt/venv/bin/python"
    assert payload["allreduce"]["variants"] == [{"NCCL_PROTO": "LL"}, {"NCCL_PROTO": "Simple"}]
    assert payload["allreduce"]["cuda_graph"] is True
    assert payload["server_pid_file"] == "/var/lib/gpuops/sglang.pid"
    with pytest.raises(GpuopsError, match="worker"):
        build_payload(options, "abc", "http://x:1", {})


def test_stop_command_is_quoted_and_harmless_without_a_client(tmp_path):
    text = stop_command("abc; touch /tmp/pwned", "h1")
    assert shlex.split(text)  # well-formed
    assert "'/tmp/gpuops-bench-abc; touch /tmp/pwned-" in text
    assert stop_command("r", "h1") != stop_command("r", "h2")  # lab hosts share one /tmp
    done = subprocess.run(["/bin/sh", "-c", stop_command("nosuchrun")], capture_output=True)
    assert done.returncode == 0
