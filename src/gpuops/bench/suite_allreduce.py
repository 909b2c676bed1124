"""The ``allreduce`` suite on the client: latency per NCCL variant and message size, the best
variant's cost per forward pass, one export row per (variant, size, repeat), its plot and tables."""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import (Headline, JSONObject, Percentiles, ResultDocument, Summary, VariantSummary, figure, mapping,
                                 number)
from gpuops.bench.suite_base import across_repeats, cell, check_options, tool_runs
from gpuops.bench.suites import (BenchTable, Distributions, ExportLevel, Figures, ReportTable, RunParts,
                                 SuiteOptions)
from gpuops.bench.compare import format_value
from gpuops.bench.repeats import median_rows, result_intervals
from gpuops.bench.report import error_bars, figure_png, result_label
from gpuops.bench.simulated import is_simulated, mark

__all__ = ["PLOTS", "across_repeats", "allreduce_summary", "bench_tables", "check_options", "figures",
           "finish", "headline", "levels", "merge_repeats", "report_tables", "summarize", "tool_runs",
           "variant_label", "within_run"]


def headline(summary: Summary, result: ResultDocument) -> Headline:
    return {
        "best_variant": summary.get("best_variant"),
        "step_cost_ms": summary.get("step_cost_ms"),
        "variants": [{"label": v["label"], "ok": v.get("ok"), "latency_us": v.get("latency_us"),
                      "busbw_gbps": v.get("busbw_gbps"), "error": v.get("error")}
                     for v in summary.get("variants") or []],
    }


def figures(summary: Summary, result: ResultDocument) -> Figures:
    out: Figures = {}
    for variant in summary.get("variants") or []:
        for tokens, latency in sorted((variant.get("latency_us") or {}).items(), key=lambda kv: _size_order(kv[0])):
            out[(f"{variant.get('label')} x{tokens} tokens latency", "us", "lower")] = number(latency)
    out[("best variant step cost", "ms", "lower")] = number(summary, "step_cost_ms")
    return out


def _size_order(tokens: str) -> tuple[int, str]:
    """Sizes in numeric order; a key that is no number (a damaged file) after them, never an error."""
    return (int(tokens), "") if tokens.isdigit() else (1 << 62, tokens)


def _variant(value: object) -> str | None:
    if isinstance(value, Mapping):
        return " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "default"
    return None


def levels(result: ResultDocument) -> list[ExportLevel]:
    return [({"level": f"{_variant(r.get('variant'))} x{r.get('tokens')}", "variant": _variant(r.get("variant")),
              "tokens": r.get("tokens"), "cuda_graph": r.get("cuda_graph"), "repeat_index": r.get("repeat")}, r)
            for r in result.get("allreduce") or []]


def within_run(result: ResultDocument) -> Distributions:
    """Every trial's latency, pooled per (variant, size)."""
    pooled: dict[str, list[float]] = {}
    for row in result.get("allreduce") or []:
        given = row.get("latency_us_trials")
        if row.get("ok") and isinstance(given, list) and given:
            name = f"{variant_label(mapping(row.get('variant')))} x{row.get('tokens')} tokens latency"
            trials = (number(x) for x in given)  # a stored NaN is read as missing
            pooled.setdefault(name, []).extend(x for x in trials if x is not None)
    return {k: ("trials", v) for k, v in pooled.items()}


def merge_repeats(merged: ResultDocument, results: Sequence[ResultDocument]) -> Summary:
    """Medians of the pooled rows; a variant that failed in any repeat stays marked failed."""

    summary = allreduce_summary(median_rows(merged.get("allreduce") or []), [])
    failed = [e for r in results for e in (r.get("summary") or {}).get("variants") or [] if not e.get("ok")]
    for bad in failed:
        for variant in summary.get("variants") or []:
            if variant.get("label") == bad.get("label"):
                variant["ok"] = False
                variant.setdefault("error", bad.get("error"))
    return summary


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    rows = list(run.allreduce)
    return RunParts(allreduce_summary(rows, run.errors), rows=rows)


def finish(run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str]) -> list[str]:
    return ["no all-reduce measurement came back"] if not any(r.get("ok") for r in rows) and not errors else []


def variant_label(variant: Mapping[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(variant.items())) or "default"


KERNEL_TITLES = {"pcie_ipc": "FlashInfer PCIe IPC", "custom": "SGLang custom all-reduce"}


def kernel_label(kernel: object) -> str:
    """A variant's label prefix: nothing for NCCL (the suite's own), the kernel's name else."""
    title = KERNEL_TITLES.get(str(kernel))
    return f"{title}: " if title else ""


class _Variant:
    """One variant's figures while the rows are gathered (``VariantSummary`` once done)."""

    def __init__(self, record: VariantSummary) -> None:
        self.record = record
        self.latency_us: Percentiles = {}
        self.busbw_gbps: JSONObject = {}
        self.step_cost_ms: JSONObject = {}
        record["latency_us"] = self.latency_us
        record["busbw_gbps"] = self.busbw_gbps
        record["step_cost_ms"] = self.step_cost_ms


def allreduce_summary(rows: list[JSONObject], errors: list[JSONObject]) -> Summary:
    variants: dict[str, _Variant] = {}
    for row in rows:
        label = kernel_label(row.get("kernel")) + variant_label(mapping(row.get("variant")))
        if label not in variants:
            variants[label] = _Variant({"label": label, "variant": row.get("variant") or {}, "ok": True,
                                        "kernel": str(row.get("kernel") or "nccl")})
        entry = variants[label]
        if row.get("ok"):
            key = str(row["tokens"])
            entry.latency_us[key] = figure(row["latency_us"])
            entry.busbw_gbps[key] = row["busbw_gbps"]
            entry.step_cost_ms[key] = row["step_cost_ms"]
        else:
            entry.record["ok"] = False
            entry.record["error"] = row.get("error")
    for err in errors:
        if "variant" in err:
            label = variant_label(mapping(err.get("variant")))
            if label not in variants:
                variants[label] = _Variant({"label": label, "variant": err.get("variant") or {}})
            entry = variants[label]
            entry.record["ok"] = False
            entry.record.setdefault("error", err.get("message"))
            if err.get("timed_out"):
                entry.record["timed_out"] = True
    ranked = [v for v in variants.values() if v.record.get("ok") and v.latency_us]
    smallest = None
    if ranked:
        smallest = min(int(k) for v in ranked for k in v.latency_us)
        ranked = [v for v in ranked if str(smallest) in v.latency_us]
        ranked.sort(key=lambda v: v.latency_us[str(smallest)] or 0.0)
    first = rows[0] if rows else {}
    return {
        "variants": [v.record for v in variants.values()],
        "best_variant": ranked[0].record["label"] if ranked else None,
        "ranked_at_tokens": smallest,
        "world_size": first.get("world_size"),
        "hidden_size": first.get("hidden_size"),
        "backend": first.get("backend"),
        "cuda_graph": first.get("cuda_graph"),
        "allreduces_per_step": first.get("allreduces_per_step"),
        "step_cost_ms": ranked[0].step_cost_ms.get(str(smallest)) if ranked else None,
    }


def plot_latency(results: Sequence[ResultDocument]) -> bytes | None:
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.get("allreduce")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in runs:
        intervals = result_intervals(result)
        lines: dict[str, dict[object, tuple[float, float]]] = {}
        for row in result.get("allreduce") or []:
            size, latency = figure(row.get("bytes")), figure(row.get("latency_us"))
            if row.get("ok") and size is not None and latency is not None:
                label = " ".join(f"{k}={v}" for k, v in sorted(mapping(row.get("variant")).items())) or "default"
                lines.setdefault(label, {})[row["tokens"]] = (size, latency)
        for label, by_tokens in lines.items():
            points = sorted((b, lat, t) for t, (b, lat) in by_tokens.items())
            name = label if len(runs) == 1 else f"{result_label(result)} {label}"
            ys = [p[1] for p in points]
            found = [intervals.get(f"{label} x{p[2]} tokens latency") for p in points]
            if any(found):  # the interval's median is the figure its bar brackets
                ys = [number(f, "median") or y if f else y for f, y in zip(found, ys)]
            ax.errorbar([p[0] / 1024 for p in points], ys, yerr=error_bars(ys, found), marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (KiB)")
    ax.set_ylabel("latency per all-reduce (us)")
    ax.set_title("All-reduce latency vs message size")
    ax.legend(fontsize=7)
    return figure_png(fig, runs)


def _tables(results: Sequence[ResultDocument]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per all-reduce result: latency (us) per size, bus bandwidth at the largest, cost per step, best."""

    tables = []
    for result in results:
        summary = result.get("summary") or {}
        variants = summary.get("variants") or []
        if not variants:
            continue
        sizes = sorted({int(t) for v in variants for t in (v.get("latency_us") or {}) if t.isdigit()})
        if not sizes:
            continue
        sim = is_simulated(result)
        headers = (["variant"] + [f"{t} tok us" for t in sizes]
                   + [f"busbw GB/s @{sizes[-1]}", f"per step ms @{sizes[0]}", ""])
        rows = []
        for v in variants:
            lat, bw, step = v.get("latency_us") or {}, v.get("busbw_gbps") or {}, v.get("step_cost_ms") or {}
            note = "best" if v.get("label") == summary.get("best_variant") else str(v.get("error") or "")
            rows.append([str(v.get("label"))] + [mark(format_value(lat.get(str(t))), sim) for t in sizes]
                        + [mark(format_value(figure(bw.get(str(sizes[-1])))), sim),
                           mark(format_value(figure(step.get(str(sizes[0])))), sim), note])
        title = (f"{result_label(result)}: world size {summary.get('world_size')}, "
                 f"{'CUDA graph' if summary.get('cuda_graph') else 'eager'}, hidden {summary.get('hidden_size')}, "
                 f"x{summary.get('allreduces_per_step')} all-reduces per step")
        tables.append((title, headers, rows))
    return tables


def report_tables(results: Sequence[ResultDocument]) -> list[ReportTable]:
    return [("All-reduce", title, headers, rows) for title, headers, rows in _tables(results)]


PLOTS = (("allreduce_latency", "All-reduce latency vs size per NCCL variant", plot_latency),)


def bench_tables(hosts: Mapping[str, Headline]) -> list[BenchTable]:
    """One row per host and NCCL variant."""
    headers = ["host", "variant", "ok", "latency us by tokens", "busbw GB/s by tokens", "error"]
    rows = []
    for name, line in hosts.items():
        for v in line.get("variants") or []:
            lat = " ".join(f"{k}:{cell(x)}" for k, x in mapping(v.get("latency_us")).items())
            bw = " ".join(f"{k}:{cell(x)}" for k, x in mapping(v.get("busbw_gbps")).items())
            rows.append([name, str(v["label"]), "yes" if v.get("ok") else "NO", lat, bw, str(v.get("error") or "")])
        if not line.get("variants"):
            rows.append([name, "-", "NO", "", "", line.get("error") or ""])
    return [(None, headers, rows)]
