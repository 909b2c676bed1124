"""How a stored ``allreduce`` result reads: latency per NCCL variant and message size, the best
variant's cost per forward pass, one export row per (variant, size, repeat). Pure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuops.bench.suite_base import Distributions, Figures, across_repeats, number

__all__ = ["across_repeats", "figures", "headline", "levels", "merge_repeats", "within_run"]


def headline(summary: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "best_variant": summary.get("best_variant"),
        "step_cost_ms": summary.get("step_cost_ms"),
        "variants": [{"label": v["label"], "ok": v.get("ok"), "latency_us": v.get("latency_us"),
                      "busbw_gbps": v.get("busbw_gbps"), "error": v.get("error")}
                     for v in summary.get("variants") or []],
    }


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    out: Figures = {}
    for variant in summary.get("variants") or []:
        for tokens, latency in sorted((variant.get("latency_us") or {}).items(), key=lambda kv: int(kv[0])):
            out[(f"{variant['label']} x{tokens} tokens latency", "us", "lower")] = float(latency)
    out[("best variant step cost", "ms", "lower")] = number(summary, "step_cost_ms")
    return out


def _variant(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "default"
    return None


def levels(result: Mapping[str, Any]) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    return [({"level": f"{_variant(r.get('variant'))} x{r.get('tokens')}", "variant": _variant(r.get("variant")),
              "tokens": r.get("tokens"), "cuda_graph": r.get("cuda_graph"), "repeat_index": r.get("repeat")}, r)
            for r in result.get("allreduce") or []]


def within_run(result: Mapping[str, Any]) -> Distributions:
    """Every trial's latency, pooled per (variant, size)."""
    from gpuops.bench.results import variant_label

    pooled: dict[str, list[float]] = {}
    for row in result.get("allreduce") or []:
        if row.get("ok") and row.get("latency_us_trials"):
            name = f"{variant_label(row.get('variant') or {})} x{row['tokens']} tokens latency"
            pooled.setdefault(name, []).extend(float(x) for x in row["latency_us_trials"])
    return {k: ("trials", v) for k, v in pooled.items()}


def merge_repeats(merged: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians of the pooled rows; a variant that failed in any repeat stays marked failed."""
    from gpuops.bench.repeats import median_rows
    from gpuops.bench.results import allreduce_summary

    summary = allreduce_summary(median_rows(merged.get("allreduce") or []), [])
    failed = [e for r in results for e in (r.get("summary") or {}).get("variants") or [] if not e.get("ok")]
    for bad in failed:
        for variant in summary["variants"]:
            if variant["label"] == bad["label"]:
                variant["ok"] = False
                variant.setdefault("error", bad.get("error"))
    return summary
