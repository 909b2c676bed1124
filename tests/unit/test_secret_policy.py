"""The one secrets policy (gpuops.secret_policy): names, launch words, URLs, free text."""

from __future__ import annotations

import json

import pytest

from gpuops.bench.fingerprint import configuration, public_server_record, tuning_env
from gpuops.facts.server_args import settings_from_argv
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role
from gpuops.secret_policy import is_secret_name, mask, mask_args, mask_text, secret_values

KEY = "sk-live-abcdef123456"


@pytest.mark.parametrize("name", ["--api-key", "--admin-api-key", "api_key", "HF_TOKEN", "--hf-token", "GITHUB_TOKEN",
                                  "SGLANG_ADMIN_PASSWORD", "db_passwd", "client_secret", "AWS_SECRET_ACCESS_KEY",
                                  "ansible_become_pass", "OPENAI_APIKEY"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_total_tokens", "--max-total-tokens", "--max-prefill-tokens", "--tokenizer-path",
                                  "SGLANG_KEY_CACHE", "--speculative-token-map", "ansible_ssh_private_key_file",
                                  "NCCL_P2P_LEVEL", "--api-key-file", "sglang_port"])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_masked_values_keep_a_short_hash() -> None:
    assert mask(KEY) == mask(KEY) != mask(KEY + "x")
    assert mask(KEY).startswith("<masked:") and KEY not in mask(KEY)


def test_launch_words_and_urls() -> None:
    words = ["--api-key", KEY, "--admin-api-key=adm1n-pass", "--max-total-tokens", "4096",
             "--model-path", "https://user:pa55word@hub.example/m"]
    masked = mask_args(words)
    text = " ".join(masked)
    for secret in (KEY, "adm1n-pass", "pa55word"):
        assert secret not in text
    assert "4096" in masked and "--max-total-tokens" in masked
    assert set(secret_values({"sglang_args": words})) >= {KEY, "adm1n-pass", "user:pa55word"}
    assert KEY not in mask_text(f"error: {KEY} refused", [KEY])


def test_server_flags_inspect_and_bench_agree() -> None:
    """Inspect (parsed flags) and bench (fingerprint, results) apply the same rules."""
    settings = settings_from_argv(["python", "-m", "sglang.launch_server", "--api-key", KEY, "--max-total-tokens", "4096"])
    assert settings.args["api_key"] == mask(KEY) and settings.args["max_total_tokens"] == "4096"
    env = {"SGLANG_KEY_CACHE": "1", "HF_TOKEN": "hf_secret_zz", "NCCL_ALGO": "Ring"}
    assert tuning_env(env) == {"NCCL_ALGO": "Ring", "SGLANG_KEY_CACHE": "1"}
    record = public_server_record({"server_args": {"api_key": KEY, "tp_size": 8}, "env": env,
                                   "process_cmdline": ["python3", "-m", "sglang.launch_server", "--api-key", KEY]})
    config = configuration({"admin_api_key": "adm1n-pass", "watchdog_password": "pw-secret"}, env, "0.5.8")
    text = json.dumps([record, config])
    for secret in (KEY, "hf_secret_zz", "adm1n-pass", "pw-secret"):
        assert secret not in text


def test_api_key_in_sglang_args_never_reaches_a_diff() -> None:
    inventory = {"sglang_manager": "process", "gpuops_state_dir": "/s",
                 "sglang_args": ["--model-path", "/m", "--api-key", KEY]}
    paths = discover("sglang-service", "h01", inventory, {}).paths
    facts = PlanFacts(host="h01", files={p: FileState(path=p, exists=False) for p in paths})
    plan = plan_role("sglang-service", facts, inventory, {})
    launch = next(c for c in plan.changes if c.path.endswith("sglang-launch.sh"))
    assert KEY in launch.after                       # the host gets the real value
    assert KEY not in json.dumps([c.summary() for c in plan.changes])
    assert mask(KEY) in launch.diff
