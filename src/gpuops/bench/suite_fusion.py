"""The ``fusion`` suite on the client: fused against unfused latency per size and mode (eager or CUDA
graph), the saving per forward pass, one export row per (size, mode), its plot and tables."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuops.bench.suite_base import Distributions, Figures, RunParts, across_repeats, cell, number, tool_runs
from gpuops.bench.compare import format_value
from gpuops.bench.repeats import median_rows, result_intervals
from gpuops.bench.report import error_bars, figure_png, result_label
from gpuops.bench.simulated import is_simulated, mark
from gpuops.errors import GpuopsError

__all__ = ["PLOTS", "across_repeats", "bench_tables", "check_options", "figures", "finish", "fusion_summary",
           "headline", "levels", "merge_repeats", "report_tables", "summarize", "tool_runs", "within_run"]

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
                name = f"{path.replace('_nccl', '')} x{row.get('tokens')} tokens ({mode})"
                values = (number(x) for x in trials)  # a stored NaN is read as missing
                dist.setdefault(name, ("trials", []))[1].extend(x for x in values if x is not None)
    return dist


def merge_repeats(merged: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return fusion_summary(median_rows(merged.get("fusion") or [], fusion=True))


def summarize(run: Any, options: Any) -> RunParts:
    summary = fusion_summary(list(run.fusion))
    return RunParts(summary, errors=list(summary["reasons"]))


def finish(run: Any, summary: dict[str, Any], rows: Sequence[Mapping[str, Any]], errors: Sequence[str]) -> list[str]:
    return ["no fusion measurement came back"] if not run.fusion and not errors else []


def fusion_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fused vs unfused per token count and mode; the headline is the decode case (fewest tokens,
    CUDA graph, as SGLang replays decode) and its cost over one forward pass."""
    measured = [r for r in rows if r.get("fused_us") is not None]
    reasons = sorted({r["error"] for r in rows if not r.get("ok") and r.get("error")})
    first = rows[0] if rows else {}
    summary: dict[str, Any] = {
        "world_size": first.get("world_size"), "hidden_size": first.get("hidden_size"),
        "allreduces_per_step": first.get("allreduces_per_step"), "gpu": first.get("gpu"),
        "flashinfer_version": first.get("flashinfer_version"), "tolerance": first.get("tolerance"),
        "all_correct": bool(measured) and all(r.get("correct") for r in measured),
        "reasons": reasons,
        "table": [{k: r.get(k) for k in ("tokens", "cuda_graph", "fused_us", "unfused_nccl_us", "unfused_ipc_us",
                                          "nccl_allreduce_us", "saving_us", "speedup", "saving_step_ms",
                                          "fused_step_ms", "unfused_nccl_step_ms", "rel_err_worst_rank", "correct")}
                  for r in measured],
    }
    graphed = [r for r in measured if r.get("cuda_graph")] or measured
    if graphed:
        head = min(graphed, key=lambda r: r["tokens"])
        summary.update({"headline_tokens": head["tokens"], "headline_cuda_graph": head.get("cuda_graph"),
                        "fused_us": head["fused_us"], "unfused_us": head.get("unfused_nccl_us"),
                        "fused_step_ms": head.get("fused_step_ms"), "unfused_step_ms": head.get("unfused_nccl_step_ms"),
                        "saving_step_ms": head.get("saving_step_ms")})
    return summary


def plot_fused_vs_unfused(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    runs = [r for r in results if (r.get("summary") or {}).get("table")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in runs:
        intervals = result_intervals(result)
        for graph in (True, False):
            table = sorted((row for row in result["summary"]["table"]
                            if bool(row.get("cuda_graph")) == graph and isinstance(row.get("tokens"), int)),
                           key=lambda row: row["tokens"])
            if not table:
                continue
            mode = "graph" if graph else "eager"
            xs = [row["tokens"] for row in table]
            for path, key, style in (("fused", "fused_us", "-"), ("unfused", "unfused_nccl_us", "--")):
                ys = [row.get(key) for row in table]
                found = [intervals.get(f"{path} x{row['tokens']} tokens ({mode})") for row in table]
                prefix = "" if len(runs) == 1 else f"{result_label(result)} "
                ax.errorbar(xs, ys, yerr=error_bars(ys, found), marker="o", linestyle=style, capsize=3,
                            label=f"{prefix}{path} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per all-reduce")
    ax.set_ylabel("us per call (slowest rank)")
    ax.set_title("All-reduce + residual + RMSNorm: fused vs unfused")
    ax.legend(fontsize=7)
    return figure_png(fig, runs)


def _tables(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    tables = []
    for result in results:
        summary = result.get("summary") or {}
        sim = is_simulated(result)
        headers = ["tokens", "mode", "fused us", "unfused us (NCCL + norm)", "IPC all-reduce + norm us",
                   "saving us", "per pass fused ms", "per pass unfused ms", "correct"]
        rows = [[str(r.get("tokens")), "graph" if r.get("cuda_graph") else "eager",
                 *(mark(format_value(r.get(k)), sim) for k in ("fused_us", "unfused_nccl_us", "unfused_ipc_us",
                                                               "saving_us", "fused_step_ms", "unfused_nccl_step_ms")),
                 "yes" if r.get("correct") else "NO"] for r in summary.get("table") or []]
        title = (f"{result_label(result)}: world size {summary.get('world_size')}, hidden {summary.get('hidden_size')}, "
                 f"x{summary.get('allreduces_per_step')} per pass, tolerance {summary.get('tolerance')}")
        if not rows:
            rows = [["-", "-", *([""] * 6), "; ".join(summary.get("reasons") or result.get("errors") or [])]]
        tables.append((title, headers, rows))
    return tables


def report_tables(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    return [("Fused vs unfused", title, headers, rows) for title, headers, rows in _tables(results)]


PLOTS = (("fusion", "Fused vs unfused all-reduce + RMSNorm", plot_fused_vs_unfused),)


_YES_NO: dict[Any, str] = {True: "yes", False: "NO"}


def bench_tables(hosts: Mapping[str, Mapping[str, Any]]) -> list[tuple[str | None, list[str], list[list[str]]]]:
    """One row per host: the headline size's fused and unfused cost."""
    headers = ["host", "ok", "tokens", "fused us", "unfused us", "per step fused ms", "per step unfused ms",
               "saving per step ms", "correct", "error"]
    rows = [[name, "yes" if line.get("ok") else "NO", cell(line.get("headline_tokens")), cell(line.get("fused_us")),
             cell(line.get("unfused_us")), cell(line.get("fused_step_ms")), cell(line.get("unfused_step_ms")),
             cell(line.get("saving_step_ms")), _YES_NO.get(line.get("all_correct"), "-"),
             line.get("error") or ""] for name, line in hosts.items()]
    return [(None, headers, rows)]


def check_options(options: Any) -> None:
    """FlashInfer's fused kernel runs on NVIDIA GPUs only."""

    if options.allreduce.backend != "nccl":
        raise GpuopsError("bench: the fusion suite runs on NVIDIA GPUs (--backend nccl)")
