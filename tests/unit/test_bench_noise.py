"""Noise-aware figures: bootstrap intervals, the significance rule, --repeat, compare and its verdicts.

The stand-in server streams at an exact rate, so "two identical hosts" and "one twice as fast" are
known facts the comparison must get right.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.bench.stats import Interval, bootstrap, significant, verdict
from gpuops.lab.standin_process import start_standin
from labtools import gpuops_cli as gpuops


def test_bootstrap_is_seeded_brackets_the_median_and_needs_two_values() -> None:
    values = [10.0, 11.0, 9.5, 10.4, 10.1, 30.0, 9.9]
    a, b = bootstrap(values, "requests"), bootstrap(list(values), "requests")
    assert a == b  # same values, same interval: results are reproducible
    assert a.low <= a.median <= a.high and a.median == 10.1 and a.n == 7 and a.over == "requests"
    assert a.high < 30.0  # the median's interval is not dragged to the outlier
    assert bootstrap([5.0], "repeats") is None and bootstrap([], "repeats") is None


def test_significant_only_when_intervals_part_and_the_effect_is_real() -> None:
    base = Interval(100.0, 98.0, 102.0, 5, "repeats")
    assert not significant(base, Interval(101.0, 99.0, 103.0, 5, "repeats"))  # overlap
    assert not significant(base, Interval(104.0, 101.5, 107.0, 5, "repeats"))  # 4% apart, but overlapping
    assert significant(base, Interval(200.0, 198.0, 202.0, 5, "repeats"))
    assert not significant(base, None) and not significant(None, base)
    tight = Interval(100.0, 100.0, 100.0, 5, "requests")
    assert not significant(tight, Interval(100.4, 100.4, 100.4, 5, "requests"))  # apart but < 1%
    assert verdict(base, Interval(200.0, 198.0, 202.0, 5, "repeats"), "higher") == "better"
    assert verdict(base, Interval(200.0, 198.0, 202.0, 5, "repeats"), "lower") == "worse"
    assert verdict(base, Interval(101.0, 99.0, 103.0, 5, "repeats"), "higher") == "within noise"
    assert verdict(base, None, "higher") == "no interval"


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory) -> tuple[Path, list[str]]:
    """Decode results with --repeat 3 from stand-ins at 100, 100 and 200 tok/s."""
    root = tmp_path_factory.mktemp("noise")
    ids = []
    for rate in ("100", "100", "200"):
        env = {"GPUOPS_STANDIN_TOKENS_PER_S": rate, "GPUOPS_STANDIN_TTFT_MS": "5"}
        with start_standin(root / "logs", ("--model-path", "/models/m", "--tp", "2"), env) as server:
            done = gpuops("bench", "--suite", "decode", "--url", server.url, "--output-len", "30",
                          "--num-requests", "3", "--warmup", "1", "--repeat", "3", "--json", cwd=root)
        assert done.returncode == 0, done.stderr
        ids.append(json.loads(done.stdout)["hosts"]["localhost"]["result_id"])
    return root, ids


def test_repeats_give_one_result_with_medians_and_intervals(three_hosts) -> None:
    root, ids = three_hosts
    files = sorted((root / "results").glob("*.json"))
    assert len(files) == 3  # one merged result per host and run, not one per repeat
    stored = json.loads(next(f for f in files if ids[0] in f.name).read_text())
    assert stored["options"]["repeat"] == 3 and len(stored["repeats"]) == 3
    assert stored["summary"]["repeat"] == 3 and stored["summary"]["completed"] == 9
    assert sorted({s["repeat"] for s in stored["samples"]}) == [0, 1, 2]
    rate = stored["intervals"]["output tokens/s (per stream)"]
    assert rate["over"] == "repeats" and rate["n"] == 3 and rate["confidence"] == 0.95
    assert rate["low"] <= rate["median"] <= rate["high"]
    assert rate["median"] == pytest.approx(100.0, rel=0.05)
    per_repeat = [r["summary"]["output_tokens_per_s"] for r in stored["repeats"]]
    assert stored["summary"]["output_tokens_per_s"] == pytest.approx(sorted(per_repeat)[1])


def test_compare_calls_identical_hosts_within_noise_and_2x_significant(three_hosts) -> None:
    root, (a, b, fast) = three_hosts
    same = json.loads(gpuops("results", "compare", a, b, "--json", cwd=root).stdout)
    rate = next(m for m in same["metrics"] if m["name"] == "output tokens/s (per stream)")
    assert rate["significant"] == [None, False] and rate["verdict"][1] == "within noise"
    assert all(i is not None for i in rate["intervals"])
    double = json.loads(gpuops("results", "compare", a, fast, "--json", cwd=root).stdout)
    rate = next(m for m in double["metrics"] if m["name"] == "output tokens/s (per stream)")
    assert rate["significant"] == [None, True] and rate["verdict"][1] == "better"
    assert rate["delta_pct"][1] == pytest.approx(100.0, abs=10)
    itl = next(m for m in double["metrics"] if m["name"] == "ITL p50")
    assert itl["significant"][1] and itl["verdict"][1] == "better"  # half the inter-token latency
    text = gpuops("results", "compare", a, b, cwd=root).stdout
    line = next(x for x in text.splitlines() if x.startswith("output tokens/s"))
    assert "within noise" in line and "better" not in line and "worse" not in line
