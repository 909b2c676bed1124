"""The "95%" interval is a 95% percentile bootstrap of the median, checked against independent
computations for fixed data and seed (the old test, low <= median <= high, let a quartile
interval through)."""

from __future__ import annotations

import random

import numpy as np

from gpuops.bench.stats import RESAMPLES, bootstrap

# 41 fixed, skewed values (a latency-like spread: most near 10, a tail to 40)
DATA = [10 + ((i * 37) % 23) / 4 + (15 if i % 9 == 0 else 0) + (i % 5) * 0.3 for i in range(41)]


def test_the_interval_is_the_2_5_and_97_5_percentiles_of_the_same_resampled_medians():
    """The same resamples (seed 0, ``random.Random.choices``), medians and percentiles by numpy."""
    rng = random.Random(0)
    medians = np.array([np.median(rng.choices(DATA, k=len(DATA))) for _ in range(RESAMPLES)])
    interval = bootstrap(DATA, "requests", seed=0)
    assert interval is not None
    assert interval.median == float(np.median(DATA))
    assert interval.low == float(np.quantile(medians, 0.025, method="lower"))
    assert interval.high == float(np.quantile(medians, 0.975, method="nearest"))


def test_the_interval_agrees_with_a_bootstrap_drawn_by_another_generator():
    """numpy's own generator, ten times the resamples: the ends agree within a small tolerance, and
    a quartile interval (25%/75%) would be far narrower than either."""
    gen = np.random.default_rng(12345)
    medians = np.median(gen.choice(np.array(DATA), size=(20000, len(DATA)), replace=True), axis=1)
    low, high = np.quantile(medians, [0.025, 0.975])
    q1, q3 = np.quantile(medians, [0.25, 0.75])
    interval = bootstrap(DATA, "requests", seed=7)
    assert interval is not None
    width = high - low
    assert abs(interval.low - low) <= 0.15 * width and abs(interval.high - high) <= 0.15 * width, (
        interval, low, high)
    assert interval.high - interval.low > 1.5 * (q3 - q1), "a quartile interval is not a 95% interval"
