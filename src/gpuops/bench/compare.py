"""Side-by-side comparison of stored results (pure): key figures, deltas, configuration differences.

The first result is the baseline; every other column shows its value and the change against it
(in percent). The configuration part says whether the runs measured the same configuration
(fingerprint) and, when not, which flags, environment variables, SGLang version or patched gates
differ. A column from the lab's stand-in server is simulated (``simulated``: its model's label): its
figures and every verdict against it are marked ``(sim)`` (``gpuops.bench.simulated``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, TypedDict

from gpuops.bench.fingerprint import ConfigDifference, config_differences
from gpuops.bench.record import ResultDocument
from gpuops.bench.repeats import result_intervals
from gpuops.bench.simulated import model_label
from gpuops.bench.stats import Interval, significant, verdict
from gpuops.bench.suites import Figures, reader
from gpuops.errors import GpuopsError
from gpuops.frozen import frozen


@frozen
class Metric:
    """One key figure across the compared results, the baseline first: its value in each, with its 95% interval
    where the result has one."""

    name: str
    unit: str
    better: str  # "higher" | "lower"
    values: tuple[float | None, ...]
    intervals: tuple[Interval | None, ...] = ()

    def interval(self, index: int) -> Interval | None:
        return self.intervals[index] if index < len(self.intervals) else None

    def significant(self) -> tuple[bool | None, ...]:
        """Per column against the baseline: True only when the two 95% intervals do not overlap."""
        return (None,) + tuple(significant(self.interval(0), self.interval(i)) for i in range(1, len(self.values)))

    def verdicts(self) -> tuple[str | None, ...]:
        return (None,) + tuple(verdict(self.interval(0), self.interval(i), self.better)
                               for i in range(1, len(self.values)))

    def deltas_pct(self) -> tuple[float | None, ...]:
        base = self.values[0]
        out: list[float | None] = [None]
        for value in self.values[1:]:
            out.append(None if base in (None, 0) or value is None else (value - base) / base * 100.0)
        return tuple(out)

    def improved(self) -> tuple[bool | None, ...]:
        """better (True) / worse (False) only where the difference is significant; None: within noise."""
        marks: list[bool | None] = [None]
        for delta, real in zip(self.deltas_pct()[1:], self.significant()[1:]):
            marks.append(None if delta is None or not real or abs(delta) < 1e-9
                         else (delta > 0) == (self.better == "higher"))
        return tuple(marks)


class ConfigDiffs(TypedDict):
    """How one result's configuration differs from the baseline's."""

    id: str | None
    against: str | None
    differences: list[ConfigDifference]


@dataclass
class Comparison:
    """Stored results side by side, the first as the baseline (``compare_results``): each key figure per result,
    how each configuration differs from the baseline's, and which columns are simulated."""

    ids: list[str]
    hosts: list[str]
    suites: list[str]
    fingerprints: list[str | None]
    metrics: list[Metric] = field(default_factory=list)
    config_diffs: list[ConfigDiffs] = field(default_factory=list)  # one per non-baseline result
    simulated: list[str | None] = field(default_factory=list)  # per result: stand-in model label, None if measured

    def column_simulated(self, index: int) -> bool:
        """Whether column ``index``'s figure, or its difference from the baseline, involves a simulation."""
        marks = self.simulated or [None] * len(self.ids)
        return marks[index] is not None or (index > 0 and marks[0] is not None)

    @property
    def same_configuration(self) -> bool:
        return len(set(self.fingerprints)) == 1

    def as_json(self) -> dict[str, object]:
        return {
            "ids": self.ids, "hosts": self.hosts, "suites": self.suites, "fingerprints": self.fingerprints,
            "same_configuration": self.same_configuration,
            "metrics": [{"name": m.name, "unit": m.unit, "better": m.better, "values": list(m.values),
                         "delta_pct": list(m.deltas_pct()), "significant": list(m.significant()),
                         "verdict": list(m.verdicts()),
                         "intervals": [i.as_json() if i else None for i in (m.interval(k) for k in range(len(m.values)))]}
                        for m in self.metrics],
            "rule": "significant only when the two 95% bootstrap intervals do not overlap and the medians differ by more than 1%",
            "configuration_differences": self.config_diffs,
            "simulated": [label is not None for label in self.simulated],
            "speed_models": list(self.simulated),
        }


def _figures(result: ResultDocument) -> Figures:
    """(name, unit, better) -> value for one result, as its suite's reader gives them."""
    return reader(result.get("suite")).figures(result.get("summary") or {}, result)


def compare_results(results: Sequence[ResultDocument]) -> Comparison:
    if len(results) < 2:
        raise GpuopsError("results compare: give at least two result ids")
    figures = [_figures(r) for r in results]
    names: list[tuple[str, str, str]] = []
    for fig in figures:
        for key in fig:
            if key not in names:
                names.append(key)
    intervals = [result_intervals(r) for r in results]
    metrics = [Metric(n, u, b, tuple(f.get((n, u, b)) for f in figures),
                      tuple(Interval.from_json(i.get(n)) for i in intervals)) for n, u, b in names]
    metrics = [m for m in metrics if any(v is not None for v in m.values)]
    base_config = results[0].get("configuration") or {}
    diffs = [ConfigDiffs(id=r.get("id"), against=results[0].get("id"),
                         differences=config_differences(base_config, r.get("configuration") or {}))
             for r in results[1:]]
    return Comparison(
        ids=[str(r.get("id")) for r in results],
        hosts=[str(r.get("host")) for r in results],
        suites=[str(r.get("suite")) for r in results],
        fingerprints=[r.get("fingerprint") for r in results],
        metrics=metrics,
        config_diffs=diffs,
        simulated=[model_label(r) for r in results],
    )


def format_value(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_delta(delta: float | None) -> str:
    return "" if delta is None else f"{delta:+.1f}%"
