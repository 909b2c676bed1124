"""The ``fusion`` suite on the client: fused against unfused latency per size and mode (eager or CUDA
graph), the saving per forward pass, one export row per (size, mode), its plot and tables."""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import FusionTableRow, Headline, JSONObject, ResultDocument, Summary, figure, number
from gpuops.bench.suite_base import across_repeats, cell, tool_runs
from gpuops.bench.suites import (BenchTable, Distributions, ExportLevel, Figures, ReportTable, RunParts,
                                 SuiteOptions)
from gpuops.bench.compare import format_value
from gpuops.bench.repeats import median_rows, result_intervals
from gpuops.bench.report import error_bars, figure_png, result_label
from gpuops.bench.simulated import is_simulated, mark
from gpuops.errors import GpuopsError

__all__ = ["PLOTS", "across_repeats", "bench_tables", "check_options", "figures", "finish", "fusion_summary",
           "headline", "levels", "merge_repeats", "report_tables", "summarize", "tool_runs", "within_run"]

def headline(summary: Summary, result: ResultDocument) -> Headline:
    return {"headline_tokens": summary.get("headline_tokens"), "fused_us": summary.get("fused_us"),
            "unfused_us": summary.get("unfused_us"), "fused_step_ms": summary.get("fused_step_ms"),
            "unfused_step_ms": summary.get("unfused_step_ms"), "saving_step_ms": summary.get("saving_step_ms"),
            "all_correct": summary.get("all_correct"), "world_size": summary.get("world_size"),
            "hidden_size": summary.get("hidden_size")}


def figures(summary: Summary, result: ResultDocument) -> Figures:
    out: Figures = {}
    for row in summary.get("table") or []:
        mode = "graph" if row.get("cuda_graph") else "eager"
        out[(f"fused x{row['tokens']} tokens ({mode})", "us", "lower")] = number(row, "fused_us")
        out[(f"unfused x{row['tokens']} tokens ({mode})", "us", "lower")] = number(row, "unfused_nccl_us")
    out[("fused per forward pass", "ms", "lower")] = number(summary, "fused_step_ms")
    return out


def levels(result: ResultDocument) -> list[ExportLevel]:
    rows = (result.get("summary") or {}).get("table") or []
    return [({"level": f"x{r.get('tokens')} {'graph' if r.get('cuda_graph') else 'eager'}",
              "tokens": r.get("tokens"), "cuda_graph": r.get("cuda_graph")}, r) for r in rows]


def within_run(result: ResultDocument) -> Distributions:
    """Every trial of the fused and the unfused path, per size and mode."""
    dist: Distributions = {}
    for row in result.get("fusion") or []:
        if not row.get("ok"):
            continue
        mode = "graph" if row.get("cuda_graph") else "eager"
        for path in ("fused", "unfused_nccl"):
            trials = row.get(f"{path}_us_trials")
            if isinstance(trials, list) and trials:
                name = f"{path.replace('_nccl', '')} x{row.get('tokens')} tokens ({mode})"
                values = (number(x) for x in trials)  # a stored NaN is read as missing
                dist.setdefault(name, ("trials", []))[1].extend(x for x in values if x is not None)
    return dist


def merge_repeats(merged: ResultDocument, results: Sequence[ResultDocument]) -> Summary:
    return fusion_summary(median_rows(merged.get("fusion") or [], fusion=True))


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    summary = fusion_summary(list(run.fusion))
    return RunParts(summary, errors=list(summary.get("reasons") or []))


def finish(run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str]) -> list[str]:
    return ["no fusion measurement came back"] if not run.fusion and not errors else []


def _table_row(row: JSONObject) -> FusionTableRow | None:
    """A measured row as the summary's table keeps it; None for one whose size is no integer (a
    row the host could not have measured)."""
    tokens = row.get("tokens")
    if not isinstance(tokens, int):
        return None
    return {"tokens": tokens, "cuda_graph": row.get("cuda_graph"), "fused_us": row.get("fused_us"),
            "unfused_nccl_us": row.get("unfused_nccl_us"), "unfused_ipc_us": row.get("unfused_ipc_us"),
            "nccl_allreduce_us": row.get("nccl_allreduce_us"), "saving_us": row.get("saving_us"),
            "speedup": row.get("speedup"), "saving_step_ms": row.get("saving_step_ms"),
            "fused_step_ms": row.get("fused_step_ms"), "unfused_nccl_step_ms": row.get("unfused_nccl_step_ms"),
            "rel_err_worst_rank": row.get("rel_err_worst_rank"), "correct": row.get("correct")}


def fusion_summary(rows: list[JSONObject]) -> Summary:
    """Fused vs unfused per token count and mode; the headline is the decode case (fewest tokens,
    CUDA graph, as SGLang replays decode) and its cost over one forward pass."""
    measured = [r for r in rows if r.get("fused_us") is not None]
    reasons = sorted({str(r["error"]) for r in rows if not r.get("ok") and r.get("error")})
    first = rows[0] if rows else {}
    table = [row for row in (_table_row(r) for r in measured) if row is not None]
    summary: Summary = {
        "world_size": first.get("world_size"), "hidden_size": first.get("hidden_size"),
        "allreduces_per_step": first.get("allreduces_per_step"), "gpu": first.get("gpu"),
        "flashinfer_version": first.get("flashinfer_version"), "tolerance": first.get("tolerance"),
        "all_correct": bool(measured) and all(r.get("correct") for r in measured),
        "reasons": reasons,
        "table": table,
    }
    graphed = [r for r in table if r.get("cuda_graph")] or table
    if graphed:
        head = min(graphed, key=lambda r: r["tokens"])
        summary.update({"headline_tokens": head["tokens"], "headline_cuda_graph": head.get("cuda_graph"),
                        "fused_us": head.get("fused_us"), "unfused_us": head.get("unfused_nccl_us"),
                        "fused_step_ms": head.get("fused_step_ms"), "unfused_step_ms": head.get("unfused_nccl_step_ms"),
                        "saving_step_ms": head.get("saving_step_ms")})
    return summary


def plot_fused_vs_unfused(results: Sequence[ResultDocument]) -> bytes | None:
    import matplotlib.pyplot as plt

    runs = [r for r in results if (r.get("summary") or {}).get("table")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in runs:
        intervals = result_intervals(result)
        for graph in (True, False):
            table = sorted((row for row in (result.get("summary") or {}).get("table") or []
                            if bool(row.get("cuda_graph")) == graph and isinstance(row.get("tokens"), int)),
                           key=lambda row: row["tokens"])
            if not table:
                continue
            mode = "graph" if graph else "eager"
            xs = [row["tokens"] for row in table]
            for path, key, style in (("fused", "fused_us", "-"), ("unfused", "unfused_nccl_us", "--")):
                ys = [figure(row.get(key)) for row in table]
                found = [intervals.get(f"{path} x{row['tokens']} tokens ({mode})") for row in table]
                prefix = "" if len(runs) == 1 else f"{result_label(result)} "
                ax.errorbar(xs, [y if y is not None else float("nan") for y in ys], yerr=error_bars(ys, found),
                            marker="o", linestyle=style, capsize=3, label=f"{prefix}{path} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per all-reduce")
    ax.set_ylabel("us per call (slowest rank)")
    ax.set_title("All-reduce + residual + RMSNorm: fused vs unfused")
    ax.legend(fontsize=7)
    return figure_png(fig, runs)


def _tables(results: Sequence[ResultDocument]) -> list[tuple[str, list[str], list[list[str]]]]:
    tables = []
    for result in results:
        summary = result.get("summary") or {}
        sim = is_simulated(result)
        headers = ["tokens", "mode", "fused us", "unfused us (NCCL + norm)", "IPC all-reduce + norm us",
                   "saving us", "per pass fused ms", "per pass unfused ms", "correct"]
        rows = [[str(r.get("tokens")), "graph" if r.get("cuda_graph") else "eager",
                 *(mark(format_value(figure(value)), sim) for value in (
                     r.get("fused_us"), r.get("unfused_nccl_us"), r.get("unfused_ipc_us"), r.get("saving_us"),
                     r.get("fused_step_ms"), r.get("unfused_nccl_step_ms"))),
                 "yes" if r.get("correct") else "NO"] for r in summary.get("table") or []]
        title = (f"{result_label(result)}: world size {summary.get('world_size')}, hidden {summary.get('hidden_size')}, "
                 f"x{summary.get('allreduces_per_step')} per pass, tolerance {summary.get('tolerance')}")
        if not rows:
            rows = [["-", "-", *([""] * 6), "; ".join(summary.get("reasons") or result.get("errors") or [])]]
        tables.append((title, headers, rows))
    return tables


def report_tables(results: Sequence[ResultDocument]) -> list[ReportTable]:
    return [("Fused vs unfused", title, headers, rows) for title, headers, rows in _tables(results)]


PLOTS = (("fusion", "Fused vs unfused all-reduce + RMSNorm", plot_fused_vs_unfused),)


_YES_NO: dict[object, str] = {True: "yes", False: "NO"}


def bench_tables(hosts: Mapping[str, Headline]) -> list[BenchTable]:
    """One row per host: the headline size's fused and unfused cost."""
    headers = ["host", "ok", "tokens", "fused us", "unfused us", "per step fused ms", "per step unfused ms",
               "saving per step ms", "correct", "error"]
    rows = [[name, "yes" if line.get("ok") else "NO", cell(line.get("headline_tokens")), cell(line.get("fused_us")),
             cell(line.get("unfused_us")), cell(line.get("fused_step_ms")), cell(line.get("unfused_step_ms")),
             cell(line.get("saving_step_ms")), _YES_NO.get(line.get("all_correct"), "-"),
             line.get("error") or ""] for name, line in hosts.items()]
    return [(None, headers, rows)]


def check_options(options: SuiteOptions) -> None:
    """FlashInfer's fused kernel runs on NVIDIA GPUs only."""

    if options.allreduce.backend != "nccl":
        raise GpuopsError("bench: the fusion suite runs on NVIDIA GPUs (--backend nccl)")
