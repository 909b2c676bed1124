"""How a stored ``fusion`` result reads: fused against unfused latency per size and mode (eager or
CUDA graph), the saving per forward pass, one export row per (size, mode). Pure."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuops.bench.suite_base import Distributions, Figures, across_repeats, number

__all__ = ["across_repeats", "figures", "headline", "levels", "merge_repeats", "within_run"]

_HEADLINE_KEYS = ("headline_tokens", "fused_us", "unfused_us", "fused_step_ms", "unfused_step_ms",
                  "saving_step_ms", "all_correct", "world_size", "hidden_size")


def headline(summary: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    return {key: summary.get(key) for key in _HEADLINE_KEYS}


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    out: Figures = {}
    for row in summary.get("table") or []:
        mode = "graph" if row.get("cuda_graph") else "eager"
        out[(f"fused x{row['tokens']} tokens ({mode})", "us", "lower")] = number(row, "fused_us")
        out[(f"unfused x{row['tokens']} tokens ({mode})", "us", "lower")] = number(row, "unfused_nccl_us")
    out[("fused per forward pass", "ms", "lower")] = number(summary, "fused_step_ms")
    return out


def levels(result: Mapping[str, Any]) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    rows = (result.get("summary") or {}).get("table") or []
    return [({"level": f"x{r.get('tokens')} {'graph' if r.get('cuda_graph') else 'eager'}",
              "tokens": r.get("tokens"), "cuda_graph": r.get("cuda_graph")}, r) for r in rows]


def within_run(result: Mapping[str, Any]) -> Distributions:
    """Every trial of the fused and the unfused path, per size and mode."""
    dist: Distributions = {}
    for row in result.get("fusion") or []:
        if not row.get("ok"):
            continue
        mode = "graph" if row.get("cuda_graph") else "eager"
        for path in ("fused", "unfused_nccl"):
            trials = row.get(f"{path}_us_trials")
            if trials:
                name = f"{path.replace('_nccl', '')} x{row['tokens']} tokens ({mode})"
                dist.setdefault(name, ("trials", []))[1].extend(float(x) for x in trials)
    return dist


def merge_repeats(merged: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    from gpuops.bench.repeats import median_rows
    from gpuops.bench.results import fusion_summary

    return fusion_summary(median_rows(merged.get("fusion") or [], fusion=True))
