"""Repeats and intervals of a result (pure): ``bench --repeat N`` merged into one document.

Metric names are the ones ``results compare`` shows (each suite's reader, ``suite_<name>.py``), so
a comparison finds each figure's interval under its own name; what is pooled or merged per suite is
the reader's too. See ``stats`` for the rule that uses them.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from gpuops.bench.stats import intervals_json
from gpuops.bench.suites import is_torchrun, reader
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


def level_label(level: Mapping[str, Any]) -> str:
    """``c=16`` for a closed-loop level, ``rate=20`` for a request-rate level (its cap aside)."""
    rate = level.get("request_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        return f"rate={rate:g}"
    return f"c={level.get('concurrency')}"


def dig(mapping: Any, path: Sequence[str]) -> float | None:
    for key in path:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return float(mapping) if isinstance(mapping, (int, float)) and not isinstance(mapping, bool) else None


def sample_figures_of(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for sample in samples:
        if sample.get("ok") and sample.get("chunks"):
            try:
                out.append(sample_figures(sample))
            except (IndexError, TypeError, ValueError):
                continue
    return out


def within_run(result: Mapping[str, Any]) -> dict[str, tuple[str, list[float]]]:
    """The distributions inside one run (per request, per token, per trial), as its suite's reader
    finds them."""
    return reader(result.get("suite")).within_run(result)


def across_repeats(summaries: Sequence[Mapping[str, Any]], level_sets: Sequence[Sequence[Mapping[str, Any]]],
                   suite: str) -> dict[str, tuple[str, list[float]]]:
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


def result_intervals(result: Mapping[str, Any]) -> dict[str, Any]:
    """The stored intervals, or (older results) those its own data give."""
    stored = result.get("intervals")
    if isinstance(stored, Mapping):
        return dict(stored)
    return intervals_json(within_run(result))


def median_levels(level_sets: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per concurrency level: every numeric figure's median over the repeats (nested dicts too)."""
    by_c: dict[Any, list[Mapping[str, Any]]] = {}
    for levels in level_sets:
        for level in levels:
            by_c.setdefault(level_label(level), []).append(level)

    def med(values: list[Any]) -> Any:
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(values):
            return statistics.median(nums)
        if values and all(isinstance(v, Mapping) for v in values):
            keys = {k for v in values for k in v}
            return {k: med([v.get(k) for v in values]) for k in keys}
        return values[-1] if values else None

    out = []
    for levels in by_c.values():
        keys = {k for lv in levels for k in lv}
        merged = {k: med([lv.get(k) for lv in levels]) for k in keys}
        merged["concurrency"] = levels[0].get("concurrency")
        merged["request_rate"] = levels[0].get("request_rate")
        merged["repeats"] = len(levels)
        out.append(merged)
    return sorted(out, key=lambda lv: (lv.get("concurrency") or 0, lv.get("request_rate") or 0))


def merge_repeats(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """N results of one host and run (``--repeat N``) -> one document.

    Raw data is pooled (samples, all-reduce rows, each tagged with its ``repeat``); headline figures
    are medians over the repeats; ``repeats`` keeps every repeat's summary; ``intervals`` are over
    repeats for decode/serving figures and over all trials for all-reduce/fusion latencies.
    """
    if not results:
        raise ValueError("merge_repeats: no results")
    first = results[0]
    merged = dict(results[-1])
    merged["id"] = first["id"]
    merged["created"] = first["created"]
    merged["errors"] = [f"repeat {i + 1}: {e}" if len(results) > 1 else e
                        for i, r in enumerate(results) for e in r.get("errors") or []]
    merged["ok"] = all(r.get("ok") for r in results)
    merged["partial"] = any(r.get("partial") for r in results) or len(results) < int(
        (first.get("options") or {}).get("repeat") or len(results))
    merged["notes"] = [n for r in results for n in r.get("notes") or []]

    def tagged(key: str) -> list[dict[str, Any]]:
        return [dict(item, repeat=i) for i, r in enumerate(results) for item in r.get(key) or []]

    merged["samples"] = tagged("samples")
    merged["allreduce"] = tagged("allreduce")
    merged["fusion"] = tagged("fusion")
    summaries = [r.get("summary") or {} for r in results]
    level_sets = [r.get("levels") or [] for r in results]
    suite = str(first.get("suite"))
    merged["repeats"] = [{"summary": s, "levels": lv} for s, lv in zip(summaries, level_sets)]
    merged["summary"] = reader(suite).merge_repeats(merged, results)
    dist = within_run(merged) if is_torchrun(suite) else across_repeats(summaries, level_sets, suite)
    merged["intervals"] = intervals_json(dist)
    merged["summary"]["repeat"] = len(results)
    return merged


def median_rows(rows: Sequence[Mapping[str, Any]], fusion: bool = False) -> list[dict[str, Any]]:
    """One row per (variant, tokens[, mode]) with each numeric figure's median over the repeats."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        key = (str(sorted((row.get("variant") or {}).items())), row.get("tokens"), row.get("cuda_graph"))
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
                values: list[Any] = [r.get(name) for r in good if isinstance(r.get(name), (int, float))]
                if values:
                    merged[name] = statistics.median(values)
        if fusion:
            merged["correct"] = all(r.get("correct") for r in group)
        out.append(merged)
    return out
