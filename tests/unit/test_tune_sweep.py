"""The pure half of `gpuops tune`: variants checked before any host is touched, and the ranking."""

from __future__ import annotations

import pytest

from gpuops.errors import GpuopsError
from gpuops.bench.stats import Interval
from gpuops.tune.sweep import BASELINE, Trial, best_variant, plan_variants, rank, verdicts


def test_cross_product_in_a_stable_order() -> None:
    variants = plan_variants(["NCCL_ALGO=Ring,Tree", "NCCL_PROTO=LL,Simple"])
    assert [v.label for v in variants] == [
        "NCCL_ALGO=Ring NCCL_PROTO=LL", "NCCL_ALGO=Ring NCCL_PROTO=Simple",
        "NCCL_ALGO=Tree NCCL_PROTO=LL", "NCCL_ALGO=Tree NCCL_PROTO=Simple",
    ]
    assert dict(variants[3].env) == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}


@pytest.mark.parametrize("sweep, words", [
    (["NCCL_ALGOS=Ring"], "did you mean NCCL_ALGO?"),
    (["NCCL_PROTO=fast"], "LL, LL128, Simple"),
    (["NCCL_ALGO=Ring", "NCCL_ALGO=Tree"], "given twice"),
    (["SGLANG_FOO=1"], "only NCCL_*"),
    (["NCCL_ALGO"], "tune: --sweep"),
    ([], "at least one --sweep"),
])
def test_bad_sweeps_are_refused_with_the_reason(sweep: list[str], words: str) -> None:
    with pytest.raises(GpuopsError) as exc:
        plan_variants(sweep)
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


def test_tree_is_warned_about() -> None:
    (variant,) = plan_variants(["NCCL_ALGO=Tree"])
    assert any("Tree" in w for w in variant.warnings)


def _trial(variant: str, rate: float | None, ttft: float = 10.0, status: str = "measured",
           spread: float = 1.0) -> Trial:
    interval = Interval(rate, rate - spread, rate + spread, 5, "requests") if rate is not None else None
    return Trial(host="h", variant=variant, env={}, status=status, output_tokens_per_s=rate, ttft_ms=ttft,
                 interval=interval)


def test_rank_fastest_first_ties_by_ttft_failures_last() -> None:
    trials = [
        _trial("fail-1", None, status="apply_failed"),
        _trial(BASELINE, 80.0),
        _trial("b", 95.0, ttft=30.0),
        _trial("a", 95.0, ttft=20.0),
        _trial("fail-2", None, status="bench_failed"),
    ]
    assert [t.variant for t in rank(trials)] == ["a", "b", BASELINE, "fail-1", "fail-2"]
    assert best_variant(trials).variant == "a"
    assert best_variant([_trial("x", None, status="apply_failed")]) is None


def test_a_win_inside_the_noise_keeps_the_baseline_and_says_so() -> None:
    # 95 vs 80 tok/s, but the intervals overlap (+-10): not a reason to change a host
    noisy = [_trial(BASELINE, 80.0, spread=10.0), _trial("a", 95.0, spread=10.0), _trial("b", 40.0, spread=1.0)]
    assert [t.variant for t in rank(noisy)] == ["a", BASELINE, "b"]  # still ordered by the estimate
    assert best_variant(noisy).variant == BASELINE
    assert verdicts(noisy) == {"a": "fastest", BASELINE: "indistinguishable", "b": "slower"}
    # no interval (one measurement) is never a significant win either
    single = [_trial(BASELINE, 80.0), Trial(host="h", variant="a", env={}, status="measured",
                                            output_tokens_per_s=200.0, ttft_ms=1.0)]
    assert best_variant(single).variant == BASELINE
    # with no measured baseline, the fastest measured variant is the best there is
    assert best_variant([_trial(BASELINE, None, status="bench_failed"), _trial("a", 95.0)]).variant == "a"


# ---- launch flags beside NCCL variables (issue 38)

def _releases(speculative: bool = False):
    from test_tune_flags import _release

    return [_release("0.5.16", speculative)]


def test_flags_and_env_cross_then_one_at_a_time() -> None:
    from gpuops.tune.sweep import ONE_AT_A_TIME

    sweeps = ["speculative_algorithm=NGRAM", "speculative_num_draft_tokens=4,8", "NCCL_PROTO=LL,Simple"]
    grid = plan_variants(sweeps)
    assert [v.label for v in grid] == [
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=4 NCCL_PROTO=LL",
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=4 NCCL_PROTO=Simple",
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=8 NCCL_PROTO=LL",
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=8 NCCL_PROTO=Simple",
    ]
    assert dict(grid[0].flags) == {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": "4"}
    assert dict(grid[0].env) == {"NCCL_PROTO": "LL"} and grid[0].speculative
    # one at a time: the first values, then each axis moved alone (3 variants, not 4)
    assert [v.label for v in plan_variants(sweeps, mode=ONE_AT_A_TIME)] == [
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=4 NCCL_PROTO=LL",
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=8 NCCL_PROTO=LL",
        "speculative_algorithm=NGRAM speculative_num_draft_tokens=4 NCCL_PROTO=Simple",
    ]
    # a flag spelled two ways is one axis
    with pytest.raises(GpuopsError, match="given twice"):
        plan_variants(["speculative_num_steps=1", "--speculative-num-steps=3"])


def test_flags_are_checked_against_the_host_release_and_get_their_launch_words() -> None:
    from gpuops.tune.sweep import check_flags

    variants = check_flags(plan_variants(["speculative_algorithm=NGRAM", "--speculative-num-draft-tokens=4,8"]),
                           _releases())
    assert [v.launch for v in variants] == [
        ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"),
        ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"),
    ]
    with pytest.raises(GpuopsError, match="closest: speculative_num_draft_tokens"):
        check_flags(plan_variants(["speculative_algorithm=NGRAM", "speculative_num_draft_token=4"]), _releases())


def test_speculation_is_always_measured_against_speculation_off() -> None:
    from gpuops.tune.flags import ReleaseFlags
    from gpuops.tune.runner import role_for
    from gpuops.tune.sweep import SPEC_OFF, check_flags
    from test_tune_flags import _answer

    # the server as configured runs no speculation: it is the baseline, nothing is added
    plain = check_flags(plan_variants(["speculative_algorithm=NGRAM"]), _releases())
    assert [v.label for v in plain] == ["speculative_algorithm=NGRAM"]
    # it speculates (the field box's EAGLE-3): a run with its speculative flags taken out comes first
    eagle = ReleaseFlags.from_answer("gpu0", dict(_answer("0.5.16"), speculative=True, speculative_flags=[
        "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps", "--no-such-flag"]))
    off, *rest = check_flags(plan_variants(["speculative_num_steps=1,3"]), [eagle])
    assert off.label == SPEC_OFF and not off.speculative and off.launch == ()
    assert off.drop == ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps")
    assert [v.label for v in rest] == ["speculative_num_steps=1", "speculative_num_steps=3"]
    assert role_for(off, smoke_check=False) == ("launch-flags", {"launch_flags": [], "launch_env": {},
                                                                 "launch_drop": list(off.drop)})
    # no speculation configured and no variant turns it on: every row would measure the same thing
    with pytest.raises(GpuopsError, match="no variant turns speculation on"):
        check_flags(plan_variants(["speculative_num_steps=1,3"]), _releases())
    # NCCL alone: nothing is asked of a server that speculates
    assert [v.label for v in check_flags(plan_variants(["NCCL_PROTO=LL"]), [eagle])] == ["NCCL_PROTO=LL"]
    assert role_for(plan_variants(["NCCL_PROTO=LL"])[0], smoke_check=True) == (
        "nccl-env", {"nccl_env": {"NCCL_PROTO": "LL"}, "smoke_check": True})


def test_each_variant_against_the_baseline_with_its_noise() -> None:
    from gpuops.tune.sweep import against_baseline

    trials = [_trial(BASELINE, 82.0, spread=2.0), _trial("ngram-8", 95.0, spread=2.0),
              _trial("ngram-4", 84.0, spread=3.0), _trial("eagle", 60.0, spread=2.0),
              _trial("dead", None, status="apply_failed")]
    assert against_baseline(trials) == {
        BASELINE: {"verdict": "reference", "ratio": 1.0},
        "ngram-8": {"verdict": "faster", "ratio": round(95 / 82, 4)},
        "ngram-4": {"verdict": "within noise", "ratio": round(84 / 82, 4)},
        "eagle": {"verdict": "slower", "ratio": round(60 / 82, 4)},
    }
    assert against_baseline([_trial("a", 1.0)]) == {}  # no baseline measured: no verdict
    # with a run without speculation measured (the configured server speculates), that run is the
    # reference: the configured EAGLE-3 gets its verdict against it
    from gpuops.tune.sweep import SPEC_OFF

    field = [_trial(BASELINE, 60.0), _trial(SPEC_OFF, 82.0), _trial("steps=1", 70.0)]
    assert against_baseline(field) == {SPEC_OFF: {"verdict": "reference", "ratio": 1.0},
                                       BASELINE: {"verdict": "slower", "ratio": round(60 / 82, 4)},
                                       "steps=1": {"verdict": "slower", "ratio": round(70 / 82, 4)}}


def test_acceptance_is_read_where_the_server_reports_it() -> None:
    """The acceptance rate from SGLang's own /metrics gauge (recorded from a real 0.5.16), the
    accept length from /server_info first; neither for a server that ran no speculation."""
    import json
    from pathlib import Path

    from gpuops.remote.prom_text import run_deltas, summarise
    from gpuops.tune.runner import Speculation

    page = json.loads((Path(__file__).parents[1] / "fixtures/real/h200-x1/sglang-0.5.16/http/metrics.json")
                      .read_text())["text"]
    real = summarise(page)
    assert run_deltas(real, real)["spec_accept_rate"] == 0.0  # the series is there (0: no speculation ran)
    deltas = {"spec_verify_calls": 40.0, "spec_accept_length": 2.4, "spec_accept_rate": 0.35}
    on = {"accept_length": 2.5, "server_metrics": deltas, "speculative": {"in_effect": True}}
    assert Speculation.of(on) == Speculation(accept_length=2.5, accept_rate=0.35, speculative=True)
    assert Speculation.of(dict(on, accept_length=None)).accept_length == 2.4  # /metrics when /server_info lacks it
    off = {"accept_length": 1.0, "server_metrics": dict(deltas, spec_verify_calls=0.0),
           "speculative": {"in_effect": False}}
    assert Speculation.of(off) == Speculation(accept_length=None, accept_rate=None, speculative=False)
