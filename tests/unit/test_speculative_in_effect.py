"""Speculative decoding as the server runs it (``facts/speculative.py``): the server's resolved
settings first, the launch flags beside them (agreeing, overruled, chosen by SGLang itself), the
launch flags alone where the server reports nothing."""

from __future__ import annotations

from gpuops.facts.server_args import settings_from_argv
from gpuops.facts.speculative import judge

LAUNCH = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--speculative-algorithm", "EAGLE3",
          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
RESOLVED = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "speculative_draft_model_path": None, "tp_size": 8}


def launched(*argv: str) -> dict | None:
    return settings_from_argv(list(argv)).speculative


def reported(**settings: object) -> dict:
    return {"route": "/server_info", "settings": {**RESOLVED, **settings}, "error": None}


def test_the_server_and_the_flags_agree() -> None:
    said = judge(launched(*LAUNCH), reported(), running=True)
    assert said.in_effect is True and said.source == "/server_info" and not said.disagreements
    assert said.settings == {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert said.reason == ("on: the server reports EAGLE3 (steps 3, topk 1, draft tokens 4) in its resolved settings "
                           "(/server_info); the launch flags agree")


def test_the_server_overrules_a_flag_and_says_both() -> None:
    # topk 1: SGLang sets the draft tokens to steps + 1 (srt/arg_groups/speculative_hook.py)
    argv = [w if w != "4" else "8" for w in LAUNCH]
    said = judge(launched(*argv), reported(), running=True)
    assert said.in_effect is True and said.settings["num_draft_tokens"] == 4
    assert said.disagreements == ("launched with --speculative-num-draft-tokens 8, the server runs 4",)
    assert "the server's word is taken over the launch flags" in said.reason


def test_what_sglang_chose_itself_is_named() -> None:
    said = judge(launched("python3", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"), reported(),
                 running=True)
    assert said.in_effect is True and not said.disagreements
    assert "SGLang chose num_steps 3, eagle_topk 1, num_draft_tokens 4 itself" in said.reason


def test_a_renamed_algorithm_is_a_disagreement() -> None:
    said = judge(launched("python3", "-m", "sglang.launch_server", "--speculative-algorithm", "NEXTN"),
                 reported(speculative_algorithm="EAGLE"), running=True)
    assert said.in_effect is True and said.settings["algorithm"] == "EAGLE"
    assert said.disagreements == ("launched with --speculative-algorithm NEXTN, the server runs EAGLE",)


def test_off_by_the_server_word() -> None:
    off = {"speculative_algorithm": None, "speculative_num_steps": None, "speculative_eagle_topk": None,
           "speculative_num_draft_tokens": None}
    said = judge(None, reported(**off), running=True)
    assert said.in_effect is False and said.settings == {} and said.reason.endswith("the launch flags agree")
    asked = judge(launched(*LAUNCH), reported(**off), running=True)
    assert asked.in_effect is False and asked.disagreements[0].startswith("launched with --speculative-algorithm EAGLE3")


def test_without_a_report_the_flags_answer_and_say_so() -> None:
    said = judge(launched("python3", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"), None,
                 running=True)
    assert said.in_effect is True and said.source == "launch flags" and said.settings == {"algorithm": "EAGLE3"}
    assert "the server reports no resolved settings" in said.reason
    assert "SGLang chooses num_steps, eagle_topk, num_draft_tokens at start-up" in said.reason
    failed = judge(launched(*LAUNCH), {"route": None, "settings": {}, "error": "HTTP 401"}, running=True)
    assert failed.source == "launch flags" and "unavailable: HTTP 401" in failed.reason
    assert judge(None, None, running=True).in_effect is False
    assert judge(launched(*LAUNCH), reported(), running=False).in_effect is None
