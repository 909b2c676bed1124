"""How a stored ``serving`` result reads: per-request figures plus one set per concurrency level
(or request rate), the peak, and one export row per level. Pure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuops.bench.suite_base import Figures, across_repeats, number, request_figures, within_run

__all__ = ["across_repeats", "figures", "headline", "levels", "merge_repeats", "within_run"]

_PEAK_KEYS = ("peak_total_output_tokens_per_s", "peak_concurrency", "peak_request_throughput",
              "peak_request_rate", "peak_goodput_request_per_s", "peak_goodput_concurrency", "failed")


def headline(summary: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = {key: summary.get(key) for key in _PEAK_KEYS}
    line["levels"] = [{"concurrency": lv.get("concurrency"),
                       "request_rate": lv.get("request_rate"),
                       "request_throughput": lv.get("request_throughput"),
                       "total_output_tokens_per_s": lv.get("total_output_tokens_per_s"),
                       "output_tokens_per_s": lv.get("output_tokens_per_s"),
                       "ttft_ms_p50": (lv.get("ttft_ms") or {}).get("p50"),
                       "itl_ms_p50": (lv.get("itl_ms") or {}).get("p50"),
                       "tpot_ms_p50": (lv.get("tpot_ms") or {}).get("p50"),
                       "e2e_latency_ms_p50": (lv.get("e2e_latency_ms") or {}).get("p50"),
                       "failed": lv.get("failed"),
                       "goodput_request_per_s": lv.get("goodput_request_per_s")}
                      for lv in result.get("levels") or []]
    return line


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    from gpuops.bench.repeats import level_label

    out = request_figures(summary)
    for level in result.get("levels") or []:
        c = level_label(level)
        out[(f"{c} total output tokens/s", "tok/s", "higher")] = number(level, "total_output_tokens_per_s")
        out[(f"{c} requests/s", "req/s", "higher")] = number(level, "request_throughput")
        out[(f"{c} TTFT p50", "ms", "lower")] = number(level, "ttft_ms", "p50")
        out[(f"{c} ITL p50", "ms", "lower")] = number(level, "itl_ms", "p50")
        out[(f"{c} goodput", "req/s", "higher")] = number(level, "goodput_request_per_s")
    out[("peak total output tokens/s", "tok/s", "higher")] = number(summary, "peak_total_output_tokens_per_s")
    return out


def levels(result: Mapping[str, Any]) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    from gpuops.bench.repeats import level_label

    return [({"level": level_label(lv), "concurrency": lv.get("concurrency"),
              "request_rate": lv.get("request_rate")}, lv) for lv in result.get("levels") or []]


def merge_repeats(merged: dict[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every level's figures as medians over the repeats (the merged document's ``levels``)."""
    from gpuops.bench.repeats import median_levels
    from gpuops.bench.results import serving_summary

    merged["levels"] = median_levels([r.get("levels") or [] for r in results])
    return serving_summary(merged["levels"])
