"""Noise-aware figures (pure): medians with 95% bootstrap intervals, and when a difference is real.

Every result carries ``intervals``: for each headline metric, the median and a 95% percentile
bootstrap confidence interval of that median, over the measurements the metric is made of:

- ``repeats``: with ``bench --repeat N``, one value per repeat (the honest unit of noise: server,
  network and GPU state all vary between runs);
- ``requests`` / ``tokens`` / ``trials``: without repeats, the values inside one run (per-request
  decode rate and TTFT, per-token ITL, per-trial all-reduce latency). These say how steady one run
  was, not how repeatable the whole run is; the ``over`` field names which one an interval is.

The rule everywhere (``results compare``, ``tune``): a difference is **significant** only when the
two intervals do not overlap. Non-overlap of two 95% intervals is a conservative test (it misses some
real differences, it rarely calls noise a win), which is the side a tuning tool should err on.
A metric with fewer than two values has no interval and is never significant, and neither is a
difference of medians under 1% (``MIN_EFFECT``), however tight the intervals.
"""

from __future__ import annotations

import functools
import random
import statistics
from typing import Iterable, Mapping, Sequence, TypedDict
from gpuops.frozen import frozen

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_EFFECT = 0.01  # differences under 1% are never called significant (not worth a restart)


class IntervalJSON(TypedDict):
    """An ``Interval`` as a result stores it (under ``intervals``, by the figure's name)."""

    median: float
    low: float
    high: float
    n: int
    over: str
    confidence: float


@frozen
class Interval:
    """A median and its 95% bootstrap interval, over ``n`` values of what ``over`` names (``bootstrap``)."""

    median: float
    low: float
    high: float
    n: int
    over: str  # repeats | requests | tokens | trials

    def as_json(self) -> IntervalJSON:
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n, "over": self.over,
                "confidence": CONFIDENCE}

    @staticmethod
    def from_json(data: object) -> Interval | None:
        """The interval a stored one says (as read from a file: anything), None when it is none."""
        if not isinstance(data, Mapping):
            return None
        median, low, high, n = data.get("median"), data.get("low"), data.get("high"), data.get("n")
        try:
            return Interval(_float(median), _float(low), _float(high), _int(n), str(data.get("over", "")))
        except (TypeError, ValueError):
            return None


def _float(value: object) -> float:
    """``float(value)`` of a stored figure (a number, or text such as ``"1.5"``); TypeError for anything else."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def _int(value: object) -> int:
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"not a count: {value!r}")


def bootstrap(values: Sequence[float], over: str, resamples: int = RESAMPLES, seed: int = 0) -> Interval | None:
    """Median and its 95% percentile-bootstrap interval; None for fewer than two values.

    Seeded, so the same values always give the same interval (results stay reproducible); and so
    kept per process by the values: a report asks for a result's intervals once per table and plot
    that shows it, and a result stored without intervals has them bootstrapped from its data on
    each ask (20 asks for 7 results: 3.7 CPU-s of a 6.4 s report of benchmarks/results/h200-x2).
    """
    return _bootstrap(tuple(float(v) for v in values if v is not None), over, resamples, seed)


@functools.lru_cache(maxsize=4096)
def _bootstrap(data: tuple[float, ...], over: str, resamples: int, seed: int) -> Interval | None:
    if len(data) < 2:
        return None
    rng = random.Random(seed)
    n = len(data)
    medians = sorted(statistics.median(rng.choices(data, k=n)) for _ in range(resamples))
    tail = (1.0 - CONFIDENCE) / 2.0
    low = medians[int(tail * (resamples - 1))]
    high = medians[int((1.0 - tail) * (resamples - 1) + 0.5)]
    return Interval(statistics.median(data), low, high, n, over)


def overlap(a: Interval, b: Interval) -> bool:
    return a.low <= b.high and b.low <= a.high


def significant(a: Interval | None, b: Interval | None) -> bool:
    """The rule: both intervals exist, they do not overlap, and the medians differ by more than
    ``MIN_EFFECT`` (two runs of one configuration can give tight intervals a hair apart)."""
    if a is None or b is None or overlap(a, b):
        return False
    scale = max(abs(a.median), abs(b.median))
    return scale > 0 and abs(b.median - a.median) / scale > MIN_EFFECT


def verdict(base: Interval | None, other: Interval | None, better: str) -> str:
    """'better' | 'worse' | 'within noise' | 'no interval' for ``other`` against ``base``."""
    if base is None or other is None:
        return "no interval"
    if not significant(base, other):
        return "within noise"
    return "better" if (other.median > base.median) == (better == "higher") else "worse"


def intervals_json(distributions: Mapping[str, tuple[str, Iterable[float]]]) -> dict[str, IntervalJSON]:
    """``{metric: (over, values)}`` -> ``{metric: interval json}`` (metrics without one left out)."""
    out: dict[str, IntervalJSON] = {}
    for name, (over, values) in distributions.items():
        interval = bootstrap(list(values), over)
        if interval is not None:
            out[name] = interval.as_json()
    return out
