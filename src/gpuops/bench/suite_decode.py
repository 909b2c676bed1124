"""How a stored ``decode`` result reads (one stream at a time): per-request figures, intervals over
requests and tokens, repeats merged by median; the headline and export rows are the defaults. Pure."""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from gpuops.bench.suite_base import Distributions, Figures, RunParts, headline, levels, request_figures
from gpuops.bench.suite_base import finish_requests as finish

__all__ = ["across_repeats", "figures", "finish", "headline", "levels", "merge_repeats", "summarize", "within_run"]


def summarize(run: Any, options: Any) -> RunParts:
    """Our own requests' samples, or the SGLang tool's one batch (``--tool sglang``)."""
    if options.tool:
        from gpuops.bench.sglang_tool import one_batch_summary

        return RunParts(one_batch_summary(run.tool[-1]) if run.tool else {})
    from gpuops.remote.bench_stats import summarize_samples

    return RunParts(summarize_samples(run.samples, None, dict(options.slo) or None))


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    return request_figures(summary)


def within_run(result: Mapping[str, Any]) -> Distributions:
    from gpuops.bench.repeats import sample_figures_of

    if result.get("tool"):  # the SGLang tool's batch: no per-request samples of ours
        return {}
    found = sample_figures_of(result.get("samples") or [])
    return {
        "output tokens/s (per stream)": ("requests", [f["tokens_per_s"] for f in found if f["tokens_per_s"]]),
        "TTFT p50": ("requests", [f["ttft_s"] * 1000.0 for f in found]),
        "ITL p50": ("tokens", [x * 1000.0 for f in found for x in f["itls_s"]]),
    }


def across_repeats(summaries: Sequence[Mapping[str, Any]]) -> Distributions:
    from gpuops.bench.repeats import SERVING_FIGURES, dig

    return {name: ("repeats", [v for v in (dig(s, path) for s in summaries) if v is not None])
            for name, path in SERVING_FIGURES}


def merge_repeats(merged: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    from gpuops.bench.repeats import SERVING_FIGURES, dig

    summaries = [r.get("summary") or {} for r in results]
    summary = dict(summaries[-1])
    for name, path in SERVING_FIGURES:
        values = [v for v in (dig(s, path) for s in summaries) if v is not None]
        if values:
            target = summary
            for key in path[:-1]:
                target[key] = dict(target.get(key) or {})
                target = target[key]
            target[path[-1]] = statistics.median(values)
    summary["completed"] = sum(s.get("completed") or 0 for s in summaries)
    summary["failed"] = sum(s.get("failed") or 0 for s in summaries)
    return summary
