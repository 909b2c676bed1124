"""The SGLang server facts: flags, redaction, environment, manager, health, model (pure parts)."""

from __future__ import annotations

import json

from facts_fixtures import KIMI, b64, server_output

from gpuops.facts.served_model import model_from_config
from gpuops.facts.server import classify_manager, parse_server
from gpuops.facts.server_args import settings_from_argv
from gpuops.remote.sglang_argv import launch_args, parse_flags
from gpuops.secret_policy import mask
from gpuops.gather import ProbeOutput

def test_kimi_server_flags_and_typed_fields() -> None:
    s = settings_from_argv(KIMI)
    assert s.model_path == "/models/Kimi-K2.5"
    assert (s.tp_size, s.port, s.trust_remote_code) == (8, 30000, True)
    assert s.speculative == {
        "algorithm": "EAGLE3",
        "draft_model_path": "/models/Kimi-K2.5-eagle3",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
    }
    assert s.args["speculative_num_draft_tokens"] == "4"
    assert s.fusion_flags == {} and s.enable_flashinfer_allreduce_fusion is False


def test_flag_shapes() -> None:
    flags, positional = parse_flags(
        ["--tp-size=4", "--enable-flashinfer-allreduce-fusion", "--cuda-graph-bs", "1", "2", "4",
         "--flashinfer-allreduce-fusion-backend", "trtllm", "--mem-fraction-static", "0.85", "--random-seed", "-1"]
    )
    assert flags == {
        "tp_size": "4",
        "enable_flashinfer_allreduce_fusion": True,
        "cuda_graph_bs": ["1", "2", "4"],
        "flashinfer_allreduce_fusion_backend": "trtllm",
        "mem_fraction_static": "0.85",
        "random_seed": "-1",
    }
    assert positional == []
    s = settings_from_argv(["python", "-m", "sglang.launch_server", "--tp-size=4", "--enable-flashinfer-allreduce-fusion",
                            "--flashinfer-allreduce-fusion-backend", "trtllm"])
    assert s.tp_size == 4 and s.port == 30000
    assert s.fusion_flags == {"enable_flashinfer_allreduce_fusion": True, "flashinfer_allreduce_fusion_backend": "trtllm"}
    assert s.enable_flashinfer_allreduce_fusion is True


def test_launch_forms() -> None:
    assert launch_args(["/venv/bin/sglang", "serve", "--model-path", "m"]) == ["--model-path", "m"]
    assert launch_args(["python3", "/src/sglang/launch_server.py", "--tp", "2"]) == ["--tp", "2"]
    assert launch_args(["/venv/bin/python3", "/venv/bin/sglang", "serve", "--tp", "4"]) == ["--tp", "4"]
    assert launch_args(["python3", "-m", "sglang.cli.main", "serve", "--port", "1"]) == ["--port", "1"]
    assert launch_args(["python3", "-m", "vllm.entrypoints"]) is None
    assert settings_from_argv(["python3", "server.py", "--tp", "8"]).tp_size == 1  # not an SGLang launch


def test_secrets_are_redacted_in_flags() -> None:
    s = settings_from_argv(["python", "-m", "sglang.launch_server", "--api-key", "hunter2", "--admin-api-key=s3cret",
                            "--hf-token", "hf_abc", "--port", "30001"])
    assert s.args["api_key"] == mask("hunter2")
    assert s.args["admin_api_key"] == mask("s3cret")
    assert s.args["hf_token"] == mask("hf_abc")
    assert s.port == 30001
    counts = settings_from_argv(["python", "-m", "sglang.launch_server", "--max-total-tokens", "4096"])
    assert counts.args["max_total_tokens"] == "4096"  # a count of tokens is not a token
    assert "hunter2" not in json.dumps(s.args) and "s3cret" not in json.dumps(s.args)


def test_parse_server_systemd_with_env_and_model() -> None:
    config = json.dumps({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                         "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "n_routed_experts": 384}})
    server = parse_server(server_output(
        KIMI + ["--api-key", "hunter2"],
        extra=f"config_path=/models/Kimi-K2.5/config.json\nconfig_b64={b64(config.encode())}\n",
    ))
    assert server.running and server.pid == 4242 and server.ppid == 1
    assert server.settings.tp_size == 8
    assert server.env == {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1", "SGLANG_ADMIN_TOKEN": server.env["SGLANG_ADMIN_TOKEN"]}
    assert server.env["SGLANG_ADMIN_TOKEN"].startswith("<masked:")
    assert (server.manager, server.unit) == ("systemd", "sglang.service")
    assert server.healthy is True and server.health_status == 200
    assert server.others == ((999, 30001),)
    assert "hunter2" not in server.argv and mask("hunter2") in server.argv
    assert server.python == "/usr/bin/python3.12"  # argv[0] "python3" is relative: exe it is
    model = server.model
    assert (model.architecture, model.hidden_size, model.num_hidden_layers, model.num_experts) == (
        "KimiK25ForConditionalGeneration", 7168, 61, 384)


def test_unreadable_environ_says_why() -> None:
    server = parse_server(server_output(KIMI, env=None))
    assert server.env is None
    assert "another user" in server.env_reason


def test_unhealthy_and_unreachable() -> None:
    assert parse_server(server_output(KIMI, health="health=503")).healthy is False
    down = parse_server(server_output(KIMI, health="health_error=[Errno 111] Connection refused"))
    assert down.healthy is False and down.health_status is None and "refused" in down.health_error


def test_no_server_names_the_others() -> None:
    server = parse_server(ProbeOutput("want_port=30000\nothers= 17:30001 18:30002\nhealth_error=refused\n", "", 0))
    assert server.known and not server.running
    assert server.others == ((17, 30001), (18, 30002))
    assert "set the host var sglang_port" in server.notes[0]


def test_probe_crash_is_unknown() -> None:
    server = parse_server(ProbeOutput("", "sh: 1: base64: not found\n", 2))
    assert server.known is False and "base64" in server.reason


def test_manager_classification() -> None:
    assert classify_manager("0::/system.slice/sglang.service\n", 5, None) == ("systemd", "sglang.service")
    assert classify_manager("0::/system.slice/docker-0123456789abcdef0123.scope\n", 5, None) == ("docker", "0123456789ab")
    assert classify_manager("12:pids:/docker/abcdefabcdef1234\n0::/\n", 5, None) == ("docker", "abcdefabcdef")
    assert classify_manager("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-aaaaaaaaaaaaaaaa.scope\n", 5, None)[0] == "kubernetes"
    assert classify_manager("0::/user.slice/user-1000.slice/session-3.scope\n", 5, None) == ("process", None)
    assert classify_manager("0::/user.slice/user-1000.slice/user@1000.service/app.slice\n", 5, None) == ("process", None)
    # gpuops' own process manager wins over whatever cgroup the lab's parent had
    assert classify_manager("0::/system.slice/ci-runner.service\n", 5, 5)[0] == "process"


def test_model_config_variants() -> None:
    plain = model_from_config("/m", "/m/config.json", json.dumps(
        {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 94, "num_experts": 128}).encode())
    assert (plain.architecture, plain.hidden_size, plain.num_hidden_layers, plain.num_experts) == ("Qwen3MoeForCausalLM", 4096, 94, 128)
    missing = model_from_config("org/name", None, None, "no readable config.json for the model path")
    assert missing.known is False and "no readable config.json" in missing.reason
    broken = model_from_config("/m", "/m/config.json", b"{not json")
    assert broken.known is False and "not valid JSON" in broken.reason


def test_no_base64_on_the_host_says_so() -> None:
    out = ProbeOutput("want_port=30000\nothers=\npid=77\nb64_error=base64 (coreutils) is not installed on the host: x\n"
                      "argv_b64=\nhealth=200\n", "", 0)
    server = parse_server(out)
    assert server.running and server.pid == 77 and server.settings is None and server.healthy
    assert "base64" in server.notes[0]
