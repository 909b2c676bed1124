"""Repeats and intervals of a result (pure): ``bench --repeat N`` merged into one document.

Metric names are the ones ``results compare`` shows (each suite's reader, ``suite_<name>.py``), so
a comparison finds each figure's interval under its own name; what is pooled or merged per suite is
the reader's too. See ``stats`` for the rule that uses them.
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence, TypedDict

from gpuops.bench.record import JSONObject, RepeatRecord, ResultDocument, Summary, mapping, number
from gpuops.bench.stats import intervals_json
from gpuops.bench.suites import Distributions, is_torchrun, reader
from gpuops.remote.bench_stats import sample_figures

# the headline figures of decode/serving runs and where they sit in a summary
SERVING_FIGURES = (
    ("output tokens/s (per stream)", ("output_tokens_per_s",)),
    ("TTFT p50", ("ttft_ms", "p50")),
    ("ITL p50", ("itl_ms", "p50")),
    ("ITL p90", ("itl_ms", "p90")),
    ("ITL p99", ("itl_ms", "p99")),
)
LEVEL_FIGURES = (
    ("total output tokens/s", ("total_output_tokens_per_s",)),
    ("requests/s", ("request_throughput",)),
    ("TTFT p50", ("ttft_ms", "p50")),
    ("ITL p50", ("itl_ms", "p50")),
)


class SampleFigures(TypedDict):
    """One completed request's figures, from its token arrivals (``remote/bench_stats.sample_figures``)."""

    ttft_s: float
    decode_tokens: int
    decode_s: float
    tokens_per_s: float | None
    itls_s: list[float]


def level_label(level: Mapping[str, object]) -> str:
    """``c=16`` for a closed-loop level, ``rate=20`` for a request-rate level (its cap aside)."""
    rate = level.get("request_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        return f"rate={rate:g}"
    return f"c={level.get('concurrency')}"


def dig(value: object, path: Sequence[str]) -> float | None:
    """The number at ``path`` in nested JSON objects (``record.number``, the path as one sequence)."""
    return number(value, *path)


def sample_figures_of(samples: Sequence[Mapping[str, object]]) -> list[SampleFigures]:
    out = []
    for sample in samples:
        if sample.get("ok") and sample.get("chunks"):
            try:
                out.append(sample_figures(sample))
            except (IndexError, TypeError, ValueError):
                continue
    return out


def within_run(result: ResultDocument) -> Distributions:
    """The distributions inside one run (per request, per token, per trial), as its suite's reader
    finds them."""
    return reader(result.get("suite")).within_run(result)


def across_repeats(summaries: Sequence[Mapping[str, object]], level_sets: Sequence[Sequence[Mapping[str, object]]],
                   suite: str) -> Distributions:
    """One value per repeat for every headline figure (the suite reader's) and every level's."""
    dist = dict(reader(suite).across_repeats(summaries))
    for levels in level_sets:
        for level in levels:
            label = level_label(level)
            for name, path in LEVEL_FIGURES:
                value = dig(level, path)
                if value is not None:
                    dist.setdefault(f"{label} {name}", ("repeats", []))[1].append(value)
    return dist


def result_intervals(result: ResultDocument) -> dict[str, Mapping[str, object] | None]:
    """The stored intervals, or (older results) those its own data give; each as stored (read it with
    ``stats.Interval.from_json``)."""
    stored = result.get("intervals")
    if isinstance(stored, Mapping):
        return dict(stored)
    return dict(intervals_json(within_run(result)))


def median_levels(level_sets: Sequence[Sequence[Mapping[str, object]]]) -> list[JSONObject]:
    """Per concurrency level: every numeric figure's median over the repeats (nested dicts too)."""
    by_c: dict[str, list[Mapping[str, object]]] = {}
    for levels in level_sets:
        for level in levels:
            by_c.setdefault(level_label(level), []).append(level)

    def med(values: list[object]) -> object:
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            return statistics.median(nums)
        maps = [v for v in values if isinstance(v, Mapping)]
        if values and len(maps) == len(values):
            keys = dict.fromkeys(k for v in maps for k in v)  # in the order the repeats have them
            return {k: med([v.get(k) for v in maps]) for k in keys}
        return values[-1] if values else None

    out = []
    for levels in by_c.values():
        keys = dict.fromkeys(k for lv in levels for k in lv)  # as written, so a merge reads the same every time
        merged = {k: med([lv.get(k) for lv in levels]) for k in keys}
        merged["concurrency"] = levels[0].get("concurrency")
        merged["request_rate"] = levels[0].get("request_rate")
        merged["repeats"] = len(levels)
        out.append(merged)
    return sorted(out, key=lambda lv: (number(lv, "concurrency") or 0, number(lv, "request_rate") or 0))


def merge_repeats(results: Sequence[ResultDocument]) -> ResultDocument:
    """N results of one host and run (``--repeat N``) -> one document.

    Raw data is pooled (samples, all-reduce rows, each tagged with its ``repeat``); headline figures
    are medians over the repeats; ``repeats`` keeps every repeat's summary; ``intervals`` are over
    repeats for decode/serving figures and over all trials for all-reduce/fusion latencies.
    """
    if not results:
        raise ValueError("merge_repeats: no results")
    first = results[0]
    merged = results[-1].copy()
    merged["id"] = first["id"]
    merged["created"] = first["created"]
    merged["errors"] = [f"repeat {i + 1}: {e}" if len(results) > 1 else e
                        for i, r in enumerate(results) for e in r.get("errors") or []]
    merged["ok"] = all(r.get("ok") for r in results)
    asked = mapping(first.get("options")).get("repeat")
    merged["partial"] = any(r.get("partial") for r in results) or len(results) < (
        int(asked) if isinstance(asked, (int, float, str)) and asked else len(results))
    merged["notes"] = [n for r in results for n in r.get("notes") or []]

    def tagged(rows: list[list[JSONObject] | None]) -> list[JSONObject]:
        return [dict(item, repeat=i) for i, part in enumerate(rows) for item in part or []]

    merged["samples"] = tagged([r.get("samples") for r in results])
    merged["allreduce"] = tagged([r.get("allreduce") for r in results])
    merged["fusion"] = tagged([r.get("fusion") for r in results])
    summaries: list[Summary] = [r.get("summary") or {} for r in results]
    level_sets = [r.get("levels") or [] for r in results]
    suite = str(first.get("suite"))
    merged["repeats"] = [RepeatRecord(summary=s, levels=lv) for s, lv in zip(summaries, level_sets)]
    summary = reader(suite).merge_repeats(merged, results)
    merged["summary"] = summary
    dist = within_run(merged) if is_torchrun(suite) else across_repeats(summaries, level_sets, suite)
    merged["intervals"] = intervals_json(dist)
    summary["repeat"] = len(results)
    return merged


def median_rows(rows: Sequence[Mapping[str, object]], fusion: bool = False) -> list[JSONObject]:
    """One row per (variant, tokens[, mode]) with each numeric figure's median over the repeats."""
    groups: dict[tuple[object, ...], list[Mapping[str, object]]] = {}
    for row in rows:
        key = (str(sorted(mapping(row.get("variant")).items())), row.get("tokens"), row.get("cuda_graph"))
        groups.setdefault(key, []).append(row)
    out = []
    for group in groups.values():
        merged = dict(group[-1])
        good = [r for r in group if r.get("ok")]
        merged["ok"] = len(good) == len(group)
        if not merged["ok"]:
            merged["error"] = next((r.get("error") for r in group if not r.get("ok")), None)
        for name, value in group[-1].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in ("tokens", "repeat"):
                values = [found for found in (r.get(name) for r in good) if isinstance(found, (int, float))]
                if values:
                    merged[name] = statistics.median(values)
        if fusion:
            merged["correct"] = all(r.get("correct") for r in group)
        out.append(merged)
    return out
