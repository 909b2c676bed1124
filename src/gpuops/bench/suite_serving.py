"""The ``serving`` suite on the client: levels of concurrency (or request rates) from our client or
``sglang.bench_serving``, per-request figures plus one set per level, the peak, one export row per
level, its plot and its two tables. Pure."""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import Headline, JSONObject, ResultDocument, Summary, at, figure, number, percentiles
from gpuops.bench.suite_base import (across_repeats, cell, check_options, report_tables, request_figures, sim_cell,
                                     tool_has, within_run)
from gpuops.bench.suites import BenchTable, ExportLevel, Figures, RunParts, SuiteOptions
from gpuops.bench.suite_base import finish_requests as finish
from gpuops.remote.sglang_argv import flag_value
from gpuops.bench.repeats import level_label, median_levels, result_intervals
from gpuops.bench.report import error_bars, figure_png, result_label
from gpuops.bench.sglang_tool import serving_level, serving_samples

__all__ = ["PLOTS", "across_repeats", "bench_tables", "check_options", "figures", "finish", "headline",
           "levels", "merge_repeats", "report_tables", "serving_summary", "summarize", "tool_runs", "within_run"]

def headline(summary: Summary, result: ResultDocument) -> Headline:
    line: Headline = {"peak_total_output_tokens_per_s": summary.get("peak_total_output_tokens_per_s"),
                      "peak_concurrency": summary.get("peak_concurrency"),
                      "peak_request_throughput": summary.get("peak_request_throughput"),
                      "peak_request_rate": summary.get("peak_request_rate"),
                      "peak_goodput_request_per_s": summary.get("peak_goodput_request_per_s"),
                      "peak_goodput_concurrency": summary.get("peak_goodput_concurrency"),
                      "failed": summary.get("failed")}
    line["levels"] = [{"concurrency": lv.get("concurrency"),
                       "request_rate": lv.get("request_rate"),
                       "request_throughput": lv.get("request_throughput"),
                       "total_output_tokens_per_s": lv.get("total_output_tokens_per_s"),
                       "output_tokens_per_s": lv.get("output_tokens_per_s"),
                       "ttft_ms_p50": at(lv, "ttft_ms", "p50"),
                       "itl_ms_p50": at(lv, "itl_ms", "p50"),
                       "tpot_ms_p50": at(lv, "tpot_ms", "p50"),
                       "e2e_latency_ms_p50": at(lv, "e2e_latency_ms", "p50"),
                       "failed": lv.get("failed"),
                       "goodput_request_per_s": lv.get("goodput_request_per_s")}
                      for lv in result.get("levels") or []]
    return line


def figures(summary: Summary, result: ResultDocument) -> Figures:
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


def levels(result: ResultDocument) -> list[ExportLevel]:
    return [({"level": level_label(lv), "concurrency": lv.get("concurrency"),
              "request_rate": lv.get("request_rate")}, lv) for lv in result.get("levels") or []]


def merge_repeats(merged: ResultDocument, results: Sequence[ResultDocument]) -> Summary:
    """Every level's figures as medians over the repeats (the merged document's ``levels``)."""
    levels = median_levels([r.get("levels") or [] for r in results])
    merged["levels"] = levels
    return serving_summary(levels)


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    """The levels our client measured, or one per ``sglang.bench_serving`` run (``--tool sglang``)."""
    if not options.tool:
        levels = list(run.levels)
        return RunParts(serving_summary(levels), levels=levels)

    asked = [_num_prompts(args) for args in tool_runs(options)[2]]

    def expected(record: JSONObject) -> int | None:
        """How many prompts the run that wrote ``record`` asked for (its ``_run_index``), if known."""
        index = record.get("_run_index")
        return asked[index] if isinstance(index, int) and index < len(asked) else None

    levels = [serving_level(r, expected(r)) for r in run.tool]
    return RunParts(serving_summary(levels), levels=levels, samples=[s for r in run.tool for s in serving_samples(r)])


def _num_prompts(args: list[str]) -> int | None:
    """``--num-prompts N`` of one ``sglang.bench_serving`` command line (the one argv parser)."""
    value = flag_value(args, "--num-prompts")
    return int(value) if value is not None and value.isdigit() else None


def serving_summary(levels: list[JSONObject]) -> Summary:
    """The headline of a serving run is its peak throughput (and its peak goodput under the SLO
    when one was given), not the lowest level's per-stream rate, which is kept alongside."""
    if not levels:
        return {"levels": 0}
    ordered = sorted(levels, key=lambda lv: (number(lv, "concurrency") or 0, number(lv, "request_rate") or 0))
    lowest = ordered[0]
    peak = max(levels, key=lambda lv: number(lv, "total_output_tokens_per_s") or 0)
    good = [lv for lv in levels if isinstance(lv.get("goodput_request_per_s"), (int, float))]
    best_good = max(good, key=lambda lv: number(lv, "goodput_request_per_s") or 0) if good else None
    return {
        "peak_request_throughput": peak.get("request_throughput"),
        "peak_request_rate": peak.get("request_rate"),
        "peak_goodput_request_per_s": best_good.get("goodput_request_per_s") if best_good else None,
        "peak_goodput_concurrency": best_good.get("concurrency") if best_good else None,
        "peak_goodput_total_output_tokens_per_s": best_good.get("total_output_tokens_per_s") if best_good else None,
        "slo": (best_good or {}).get("slo"),
        "levels": len(levels),
        "output_tokens_per_s": figure(lowest.get("output_tokens_per_s")),
        "ttft_ms": percentiles(lowest.get("ttft_ms")),
        "itl_ms": percentiles(lowest.get("itl_ms")),
        "peak_total_output_tokens_per_s": peak.get("total_output_tokens_per_s"),
        "peak_concurrency": peak.get("concurrency"),
        "completed": sum(figure(lv.get("completed")) or 0 for lv in levels),
        "failed": sum(figure(lv.get("failed")) or 0 for lv in levels) if all(
            lv.get("failed") is not None for lv in levels) else None,
    }


def plot_serving(results: Sequence[ResultDocument]) -> bytes | None:
    import matplotlib.pyplot as plt

    serving = [r for r in results if r.get("levels")]
    if not serving:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    left, ttft_ax, right, curve = axes
    for result in serving:
        levels = sorted((lv for lv in result.get("levels") or [] if lv.get("concurrency")),
                        key=lambda lv: number(lv, "concurrency") or 0)
        if not levels:
            continue
        intervals = result_intervals(result)
        xs = [number(lv, "concurrency") for lv in levels]
        for ax, name, path in ((left, "total output tokens/s", ("total_output_tokens_per_s",)),
                               (ttft_ax, "TTFT p50", ("ttft_ms", "p50")), (right, "ITL p50", ("itl_ms", "p50"))):
            ys = [figure(at(lv, *path)) for lv in levels]
            yerr = error_bars(ys, [intervals.get(f"{level_label(lv)} {name}") for lv in levels])
            ax.errorbar(xs, [y if y is not None else float("nan") for y in ys], yerr=yerr, marker="o", capsize=3,
                        label=result_label(result))
        per_stream = [figure(lv.get("output_tokens_per_s")) for lv in levels]
        total = [figure(lv.get("total_output_tokens_per_s")) for lv in levels]
        curve.plot(per_stream, total, marker="o", label=result_label(result))
        for lv, x, y in zip(levels, per_stream, total):
            if x is not None and y is not None:
                curve.annotate(f"c={lv.get('concurrency')}", (x, y), fontsize=6)
    for ax, title, ylabel in ((left, "Throughput vs concurrency", "total output tokens/s"),
                              (ttft_ax, "TTFT p50 vs concurrency", "ms"),
                              (right, "ITL p50 vs concurrency", "ms per token")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
    curve.set_xlabel("per-user output tokens/s")
    curve.set_ylabel("aggregate output tokens/s")
    curve.set_title("Aggregate vs per-user throughput")
    curve.legend(fontsize=7)
    return figure_png(fig, serving)


PLOTS = (("serving", "Serving sweep", plot_serving),)


def bench_tables(hosts: Mapping[str, Headline]) -> list[BenchTable]:
    # the headline of a serving run is its peak; the lowest level's per-stream figures follow
    headers = ["host", "ok", "peak total tok/s", "at", "peak req/s", "peak goodput req/s", "tok/s per stream",
               "TTFT p50 ms", "ITL p50", "ITL p90", "ITL p99", "accept", "failed", "result", "error"]
    rows = []
    for name, line in hosts.items():
        ok = "yes" if line.get("ok") else ("partial" if line.get("partial") and line.get("result_id") else "NO")
        sim = bool(line.get("simulated"))
        itl = line.get("itl_ms") or {}
        figures = (line.get("output_tokens_per_s"), line.get("ttft_ms"), itl.get("p50"), itl.get("p90"),
                   itl.get("p99"), line.get("accept_length"))
        rows.append([name, ok, sim_cell(line.get("peak_total_output_tokens_per_s"), sim),
                     f"c={line.get('peak_concurrency')}" if line.get("peak_concurrency") is not None else "-",
                     sim_cell(line.get("peak_request_throughput"), sim),
                     sim_cell(line.get("peak_goodput_request_per_s"), sim),
                     *(sim_cell(x, sim) for x in figures), cell(line.get("failed")),
                     line.get("result_id") or "-", line.get("error") or ""])
    level_rows = [[name, ("" if lv["concurrency"] is None else str(lv["concurrency"])) if lv.get("request_rate") is None
                   else f"rate {cell(lv['request_rate'])} (cap {lv['concurrency'] or '-'})",
                   *(sim_cell(lv.get(k), bool(line.get("simulated"))) for k in (
                       "request_throughput", "total_output_tokens_per_s", "output_tokens_per_s", "ttft_ms_p50",
                       "tpot_ms_p50", "itl_ms_p50", "e2e_latency_ms_p50")),
                   cell(lv.get("failed")), sim_cell(lv.get("goodput_request_per_s"), bool(line.get("simulated")))]
                  for name, line in hosts.items() for lv in line.get("levels") or []]
    level_headers = ["host", "concurrency", "req/s", "total tok/s", "tok/s per stream", "TTFT p50 ms",
                     "TPOT p50 ms", "ITL p50 ms", "E2E p50 ms", "failed", "goodput req/s"]
    return [(None, headers, rows), ("serving sweep", level_headers, level_rows)]


def tool_runs(options: SuiteOptions) -> tuple[str, str, list[list[str]]]:
    """One ``sglang.bench_serving`` run per concurrency level (or request rate)."""
    user = list(options.tool_args)
    runs = []
    levels: list[tuple[int | None, float | None]] = (
        [(options.max_concurrency, r) for r in options.request_rates] if options.request_rates
        else [(c, None) for c in options.concurrency])
    for concurrency, rate in levels:
        args: list[str] = []
        count = options.requests_per_level or max(4, 2 * (concurrency or 8))
        # random-ids: ids drawn inside the tokenizer's vocabulary, no download (remote/bench_tool.py)
        pairs = [("--backend", "sglang"), ("--dataset-name", "random-ids"),
                 ("--random-input-len", str(options.input_len)),
                 ("--random-output-len", str(options.output_len)),
                 ("--random-range-ratio", str(options.random_range_ratio)),
                 ("--num-prompts", str(count)), ("--seed", str(options.seed))]
        if concurrency:
            pairs.append(("--max-concurrency", str(concurrency)))
        if rate is not None:
            pairs.append(("--request-rate", str(rate)))
        for flag, value in pairs:
            if not tool_has(user, flag):
                args += [flag, value]
        runs.append(args + user + (["--disable-tqdm"] if not tool_has(user, "--disable-tqdm") else []))
    return "sglang.bench_serving", "--output-file", runs
