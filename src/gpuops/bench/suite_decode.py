"""The ``decode`` suite on the client (one stream at a time): its summary of our requests' samples
or of SGLang's one-batch tool, per-request figures, intervals over requests and tokens, repeats
merged by median; headline, export rows and tables are ``suite_base``'s. Pure."""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import JSONObject, ResultDocument, Summary, figure, mapping
from gpuops.bench.result_file import is_summary
from gpuops.bench.suites import Distributions, Figures, RunParts, SuiteOptions
from gpuops.bench.suite_base import (bench_tables, check_options, headline, levels, report_tables, request_figures,
                                     tool_has)
from gpuops.bench.suite_base import finish_requests as finish
from gpuops.bench.repeats import SERVING_FIGURES, dig, result_intervals, sample_figures_of
from gpuops.bench.report import difference_hint, error_bars, figure_png, result_label
from gpuops.bench.sglang_tool import one_batch_summary
from gpuops.bench.simulated import is_simulated, mark
from gpuops.remote.bench_stats import sample_figures, summarize_samples

__all__ = ["PLOTS", "across_repeats", "bench_tables", "check_options", "figures", "finish", "headline",
           "levels", "merge_repeats", "report_tables", "summarize", "tool_runs", "within_run"]


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    """Our own requests' samples, or the SGLang tool's one batch (``--tool sglang``)."""
    if options.tool:
        return RunParts(one_batch_summary(run.tool[-1]) if run.tool else {})

    return RunParts(summarize_samples(run.samples, None, dict(options.slo) or None))


def figures(summary: Summary, result: ResultDocument) -> Figures:
    return request_figures(summary)


def within_run(result: ResultDocument) -> Distributions:
    if result.get("tool"):  # the SGLang tool's batch: no per-request samples of ours
        return {}
    found = sample_figures_of(result.get("samples") or [])
    return {
        "output tokens/s (per stream)": ("requests", [f["tokens_per_s"] for f in found if f["tokens_per_s"]]),
        "TTFT p50": ("requests", [f["ttft_s"] * 1000.0 for f in found]),
        "ITL p50": ("tokens", [x * 1000.0 for f in found for x in f["itls_s"]]),
    }


def across_repeats(summaries: Sequence[Mapping[str, object]]) -> Distributions:
    return {name: ("repeats", [v for v in (dig(s, path) for s in summaries) if v is not None])
            for name, path in SERVING_FIGURES}


def merge_repeats(merged: ResultDocument, results: Sequence[ResultDocument]) -> Summary:
    summaries: list[Summary] = [r.get("summary") or {} for r in results]
    summary: JSONObject = dict(summaries[-1])
    for _name, path in SERVING_FIGURES:
        values = [v for v in (dig(s, path) for s in summaries) if v is not None]
        if values:
            target = summary
            for key in path[:-1]:
                target[key] = inner = dict(mapping(target.get(key)))
                target = inner
            target[path[-1]] = statistics.median(values)
    summary["completed"] = sum(figure(s.get("completed")) or 0 for s in summaries)
    summary["failed"] = sum(figure(s.get("failed")) or 0 for s in summaries)
    if not is_summary(summary):  # medians of checked summaries: a bug, not a file
        raise ValueError(f"decode: the merged summary does not read as one: {summary!r:.200}")
    return summary


def plot_token_rate(results: Sequence[ResultDocument]) -> bytes | None:
    import matplotlib.pyplot as plt

    rows = [(r, figure((r.get("summary") or {}).get("output_tokens_per_s"))) for r in results]
    measured = [(r, v) for r, v in rows if v is not None]
    if not measured:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(measured)), 3.8))
    labels = [f"{result_label(r)}\n{difference_hint(measured[0][0], r)}" for r, _ in measured]
    values = [v for _, v in measured]
    yerr = error_bars(values, [result_intervals(r).get("output tokens/s (per stream)") for r, _ in measured])
    bars = ax.bar(range(len(measured)), values, color="#4477aa", yerr=yerr, capsize=4)
    for bar, value, (result, _) in zip(bars, values, measured):
        ax.annotate(mark(f"{value:.1f}", is_simulated(result)), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(measured)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("output tokens/s (one stream)")
    ax.set_title("Decode rate per configuration")
    return figure_png(fig, [r for r, _ in measured])


def plot_itl_distribution(results: Sequence[ResultDocument]) -> bytes | None:
    import matplotlib.pyplot as plt

    series = []
    shown = []
    for result in results:
        itls: list[float] = []
        for sample in result.get("samples") or []:
            if sample.get("ok") and sample.get("chunks"):
                itls.extend(x * 1000.0 for x in sample_figures(sample)["itls_s"])
        if itls:
            series.append((result_label(result), itls))
            shown.append(result)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(series)), 3.6))
    ax.boxplot([s for _, s in series], showfliers=True)
    ax.set_xticks(range(1, len(series) + 1))
    ax.set_xticklabels([n for n, _ in series], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("inter-token latency (ms per token)")
    ax.set_title("Inter-token latency distribution (decode)")
    return figure_png(fig, shown)


PLOTS = (("tokens_per_s", "Decode rate per configuration", plot_token_rate),
         ("itl_distribution", "Latency distributions", plot_itl_distribution))


def tool_runs(options: SuiteOptions) -> tuple[str, str, list[list[str]]]:
    """One ``sglang.bench_one_batch_server`` run: batch 1, gpuops' lengths and seed unless given."""
    user = list(options.tool_args)
    base = [] if tool_has(user, "--model") or tool_has(user, "--model-path") else ["--model", "None"]
    # random-ids: ids drawn inside the tokenizer's vocabulary, no download (remote/bench_tool.py)
    for flag, value in (("--batch-size", "1"), ("--dataset-name", "random-ids"), ("--input-len", str(options.input_len)),
                        ("--output-len", str(options.output_len)), ("--seed", str(options.seed))):
        if not tool_has(user, flag):
            base += [flag, value]
    return "sglang.bench_one_batch_server", "--result-filename", [base + user]
