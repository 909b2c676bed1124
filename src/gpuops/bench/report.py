"""A self-contained HTML report of stored results (plots as base64 PNGs) and a Markdown summary.

matplotlib is imported here only, with the Agg backend, so nothing else pays for it.
Plots: decode rate per configuration (decode runs only), latency distributions (per-token ITL of
decode runs), serving runs' throughput, TTFT and ITL against concurrency and aggregate against
per-user throughput, all-reduce latency against message size per NCCL variant, fused vs unfused
all-reduce + RMSNorm. Decode and serving results are never drawn in one chart. Error bars are the
95% bootstrap intervals each result carries (over repeats with ``--repeat``, else over requests or
trials). Tables: results, the comparison with its verdicts (within noise unless the intervals part),
all-reduce per variant (latency, bus bandwidth, per-step cost, best) and fused vs unfused.

Every plot drawn from a stand-in's (simulated) results carries the "SIMULATED — stand-in model
<name>" stamp on the image itself: ``_png`` takes the results a plot shows and stamps through
``gpuops.bench.simulated.stamp_figure``; table cells of simulated figures carry ``(sim)``.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpuops.bench.compare import compare_results, format_delta, format_value
from gpuops.bench.fingerprint import config_differences
from gpuops.bench.repeats import level_label, result_intervals
from gpuops.bench.simulated import figure_basis, footnote, is_simulated, labels_of, mark, model_figures, stamp_figure
from gpuops.errors import GpuopsError
from gpuops.remote.bench_stats import sample_figures


def _label(result: Mapping[str, Any]) -> str:
    return mark(f"{result.get('host')} {str(result.get('id'))[:6]}", is_simulated(result))


def _config_line(result: Mapping[str, Any]) -> str:
    config = result.get("configuration") or {}
    args = config.get("server_args") or {}
    bits = []
    for key in ("tp_size", "speculative_algorithm", "enable_flashinfer_allreduce_fusion",
                "flashinfer_allreduce_fusion_backend"):
        if args.get(key) not in (None, False):
            bits.append(f"{key}={args[key]}")
    env = config.get("env") or {}
    bits += [f"{k}={v}" for k, v in env.items() if k.startswith("NCCL_")]
    if config.get("patched_gates"):
        bits.append(f"patched: {', '.join(config['patched_gates'])}")
    if config.get("sglang_version"):
        bits.append(f"sglang {config['sglang_version']}")
    return "; ".join(bits) or "-"


def _difference_hint(baseline: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """What sets this configuration apart from the first one, in a few words (for plot labels)."""
    if result is baseline:
        return "baseline"
    diffs = config_differences(baseline.get("configuration") or {}, result.get("configuration") or {})
    if not diffs:
        return "same config"
    words = []
    for d in diffs:
        if d["section"] == "gates":
            word = f"patched {d['key'].split('/')[-1]}"
        else:
            word = f"{d['key'].replace('enable_', '')}={d['b']}"
        words.append(word[:44])
    return "\n".join(words[:2]) + (" ..." if len(words) > 2 else "")


def _png(fig: Any, shown: Sequence[Mapping[str, Any]]) -> bytes:
    """The figure as PNG bytes; ``shown``: the results it draws (a simulated one stamps it)."""
    stamp_figure(fig, shown)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buffer.getvalue()


def _yerr(values: Sequence[float | None], intervals: Sequence[Mapping[str, Any] | None]) -> list[list[float]] | None:
    """matplotlib's asymmetric error bars from stored intervals (0 where a value has none)."""
    if not any(intervals):
        return None
    low, high = [], []
    for value, interval in zip(values, intervals):
        if value is None or not interval:
            low.append(0.0)
            high.append(0.0)
        else:
            low.append(max(0.0, value - interval["low"]))
            high.append(max(0.0, interval["high"] - value))
    return [low, high]


def _token_rate_plot(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    rows = [(r, (r.get("summary") or {}).get("output_tokens_per_s")) for r in results if r.get("suite") == "decode"]
    rows = [(r, v) for r, v in rows if isinstance(v, (int, float))]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(rows)), 3.8))
    labels = [f"{_label(r)}\n{_difference_hint(rows[0][0], r)}" for r, _ in rows]
    values = [v for _, v in rows]
    yerr = _yerr(values, [result_intervals(r).get("output tokens/s (per stream)") for r, _ in rows])
    bars = ax.bar(range(len(rows)), values, color="#4477aa", yerr=yerr, capsize=4)
    for bar, value, (result, _) in zip(bars, values, rows):
        ax.annotate(mark(f"{value:.1f}", is_simulated(result)), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("output tokens/s (one stream)")
    ax.set_title("Decode rate per configuration")
    return _png(fig, [r for r, _ in rows])


def _itl_distribution_plot(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    series = []
    shown = []
    for result in results:
        if result.get("suite") != "decode":
            continue
        itls = []
        for sample in result.get("samples") or []:
            if sample.get("ok") and sample.get("chunks"):
                itls.extend(x * 1000.0 for x in sample_figures(sample)["itls_s"])
        if itls:
            series.append((_label(result), itls))
            shown.append(result)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(series)), 3.6))
    ax.boxplot([s for _, s in series], showfliers=True)
    ax.set_xticks(range(1, len(series) + 1))
    ax.set_xticklabels([n for n, _ in series], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("inter-token latency (ms per token)")
    ax.set_title("Inter-token latency distribution (decode)")
    return _png(fig, shown)


def _serving_plot(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    serving = [r for r in results if r.get("suite") == "serving" and r.get("levels")]
    if not serving:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    left, ttft_ax, right, curve = axes
    for result in serving:
        levels = sorted((lv for lv in result["levels"] if lv.get("concurrency")),
                        key=lambda lv: lv.get("concurrency") or 0)
        if not levels:
            continue
        intervals = result_intervals(result)
        xs = [lv.get("concurrency") for lv in levels]
        for ax, figure, path in ((left, "total output tokens/s", ("total_output_tokens_per_s",)),
                                 (ttft_ax, "TTFT p50", ("ttft_ms", "p50")), (right, "ITL p50", ("itl_ms", "p50"))):
            ys = [lv.get(path[0]) if len(path) == 1 else (lv.get(path[0]) or {}).get(path[1]) for lv in levels]
            yerr = _yerr(ys, [intervals.get(f"{level_label(lv)} {figure}") for lv in levels])
            ax.errorbar(xs, [y if y is not None else float("nan") for y in ys], yerr=yerr, marker="o", capsize=3,
                        label=_label(result))
        curve.plot([lv.get("output_tokens_per_s") for lv in levels],
                   [lv.get("total_output_tokens_per_s") for lv in levels], marker="o", label=_label(result))
        for lv in levels:
            if lv.get("output_tokens_per_s") is not None and lv.get("total_output_tokens_per_s") is not None:
                curve.annotate(f"c={lv.get('concurrency')}", (lv["output_tokens_per_s"], lv["total_output_tokens_per_s"]),
                               fontsize=6)
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
    return _png(fig, serving)


def _allreduce_plot(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.get("suite") == "allreduce" and r.get("allreduce")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in runs:
        intervals = result_intervals(result)
        lines: dict[str, dict[int, tuple[int, float]]] = {}
        for row in result["allreduce"]:
            if row.get("ok"):
                label = " ".join(f"{k}={v}" for k, v in sorted((row.get("variant") or {}).items())) or "default"
                lines.setdefault(label, {})[row["tokens"]] = (row["bytes"], row["latency_us"])
        for label, by_tokens in lines.items():
            points = sorted((b, lat, t) for t, (b, lat) in by_tokens.items())
            name = label if len(runs) == 1 else f"{_label(result)} {label}"
            ys = [p[1] for p in points]
            found = [intervals.get(f"{label} x{p[2]} tokens latency") for p in points]
            if any(found):  # the interval's median is the figure its bar brackets
                ys = [f["median"] if f else y for f, y in zip(found, ys)]
            ax.errorbar([p[0] / 1024 for p in points], ys, yerr=_yerr(ys, found), marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (KiB)")
    ax.set_ylabel("latency per all-reduce (us)")
    ax.set_title("All-reduce latency vs message size")
    ax.legend(fontsize=7)
    return _png(fig, runs)


def _fusion_plot(results: Sequence[Mapping[str, Any]]) -> bytes | None:
    import matplotlib.pyplot as plt

    runs = [r for r in results if r.get("suite") == "fusion" and (r.get("summary") or {}).get("table")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for result in runs:
        intervals = result_intervals(result)
        for graph in (True, False):
            table = sorted((row for row in result["summary"]["table"] if bool(row.get("cuda_graph")) == graph),
                           key=lambda row: row["tokens"])
            if not table:
                continue
            mode = "graph" if graph else "eager"
            xs = [row["tokens"] for row in table]
            for path, key, style in (("fused", "fused_us", "-"), ("unfused", "unfused_nccl_us", "--")):
                ys = [row.get(key) for row in table]
                found = [intervals.get(f"{path} x{row['tokens']} tokens ({mode})") for row in table]
                prefix = "" if len(runs) == 1 else f"{_label(result)} "
                ax.errorbar(xs, ys, yerr=_yerr(ys, found), marker="o", linestyle=style, capsize=3,
                            label=f"{prefix}{path} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per all-reduce")
    ax.set_ylabel("us per call (slowest rank)")
    ax.set_title("All-reduce + residual + RMSNorm: fused vs unfused")
    ax.legend(fontsize=7)
    return _png(fig, runs)


def build_plots(results: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    plots = {}
    for name, maker in (("tokens_per_s", _token_rate_plot), ("itl_distribution", _itl_distribution_plot),
                        ("serving", _serving_plot), ("allreduce_latency", _allreduce_plot),
                        ("fusion", _fusion_plot)):
        png = maker(results)
        if png:
            plots[name] = png
    return plots


def _results_table(results: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["id", "host", "suite", "created", "tok/s", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms",
               "accept", "fingerprint", "configuration"]
    rows = []
    for r in results:
        s = r.get("summary") or {}
        ttft = s.get("ttft_ms") if isinstance(s.get("ttft_ms"), dict) else {}
        itl = s.get("itl_ms") if isinstance(s.get("itl_ms"), dict) else {}
        sim = is_simulated(r)
        figures = (s.get("output_tokens_per_s"), (ttft or {}).get("p50"), (itl or {}).get("p50"),
                   (itl or {}).get("p99"), s.get("accept_length"))
        rows.append([str(r.get("id")), str(r.get("host")), str(r.get("suite")) + (" (partial)" if r.get("partial") else ""),
                     str(r.get("created")), *(mark(format_value(x), sim) for x in figures),
                     str(r.get("fingerprint"))[:10], _config_line(r)])
    return headers, rows


def _comparison_rows(results: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]] | None:
    if len(results) < 2:
        return None
    comparison = compare_results(results)
    sims = [label is not None for label in comparison.simulated]
    headers = ["metric"] + [mark(f"{h} {i[:6]}", s) for h, i, s in zip(comparison.hosts, comparison.ids, sims)]
    rows = []
    for metric in comparison.metrics:
        cells = [f"{metric.name} ({metric.unit})"]
        for index, (value, delta, word) in enumerate(zip(metric.values, metric.deltas_pct(), metric.verdicts())):
            word = "" if word in (None, "no interval") else word
            cells.append(f"{mark(format_value(value), sims[index])} {format_delta(delta)} {word}".strip())
        rows.append(cells)
    return headers, rows


def _allreduce_tables(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per all-reduce result: latency (us) per size, bus bandwidth at the largest, cost per step, best."""
    tables = []
    for result in results:
        summary = result.get("summary") or {}
        variants = summary.get("variants") or []
        if result.get("suite") != "allreduce" or not variants:
            continue
        sizes = sorted({int(t) for v in variants for t in (v.get("latency_us") or {})})
        if not sizes:
            continue
        sim = is_simulated(result)
        headers = (["variant"] + [f"{t} tok us" for t in sizes]
                   + [f"busbw GB/s @{sizes[-1]}", f"per step ms @{sizes[0]}", ""])
        rows = []
        for v in variants:
            lat, bw, step = v.get("latency_us") or {}, v.get("busbw_gbps") or {}, v.get("step_cost_ms") or {}
            note = "best" if v["label"] == summary.get("best_variant") else (v.get("error") or "")
            rows.append([v["label"]] + [mark(format_value(lat.get(str(t))), sim) for t in sizes]
                        + [mark(format_value(bw.get(str(sizes[-1]))), sim),
                           mark(format_value(step.get(str(sizes[0]))), sim), note])
        title = (f"{_label(result)}: world size {summary.get('world_size')}, "
                 f"{'CUDA graph' if summary.get('cuda_graph') else 'eager'}, hidden {summary.get('hidden_size')}, "
                 f"x{summary.get('allreduces_per_step')} all-reduces per step")
        tables.append((title, headers, rows))
    return tables


def _fusion_tables(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str], list[list[str]]]]:
    tables = []
    for result in results:
        summary = result.get("summary") or {}
        if result.get("suite") != "fusion":
            continue
        sim = is_simulated(result)
        headers = ["tokens", "mode", "fused us", "unfused us (NCCL + norm)", "IPC all-reduce + norm us",
                   "saving us", "per pass fused ms", "per pass unfused ms", "correct"]
        rows = [[str(r.get("tokens")), "graph" if r.get("cuda_graph") else "eager",
                 *(mark(format_value(r.get(k)), sim) for k in ("fused_us", "unfused_nccl_us", "unfused_ipc_us",
                                                               "saving_us", "fused_step_ms", "unfused_nccl_step_ms")),
                 "yes" if r.get("correct") else "NO"] for r in summary.get("table") or []]
        title = (f"{_label(result)}: world size {summary.get('world_size')}, hidden {summary.get('hidden_size')}, "
                 f"x{summary.get('allreduces_per_step')} per pass, tolerance {summary.get('tolerance')}")
        if not rows:
            rows = [["-", "-", *([""] * 6), "; ".join(summary.get("reasons") or result.get("errors") or [])]]
        tables.append((title, headers, rows))
    return tables


def render_markdown(results: Sequence[Mapping[str, Any]], plot_names: Sequence[str], html_name: str) -> str:
    headers, rows = _results_table(results)
    lines = ["# gpuops benchmark report", "",
             f"{len(results)} result(s); plots in [{html_name}]({html_name}).", ""]
    note = footnote(labels_of(results))
    if note:
        lines += [f"> SIMULATED. {note}.", ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    comparison = _comparison_rows(results)
    if comparison:
        c_headers, c_rows = comparison
        lines += ["", "## Comparison (first result is the baseline)", "",
                  "| " + " | ".join(c_headers) + " |", "|" + "---|" * len(c_headers)]
        lines += ["| " + " | ".join(row) + " |" for row in c_rows]
    for heading, tables in (("All-reduce", _allreduce_tables(results)), ("Fused vs unfused", _fusion_tables(results))):
        for title, t_headers, t_rows in tables:
            lines += ["", f"## {heading}: {title}", "", "| " + " | ".join(t_headers) + " |",
                      "|" + "---|" * len(t_headers)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t_rows]
    lines += ["", "Plots: " + (", ".join(plot_names) or "none"), ""]
    return "\n".join(lines)


def render_html(results: Sequence[Mapping[str, Any]], plots: Mapping[str, bytes]) -> str:
    esc = html.escape
    headers, rows = _results_table(results)
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>gpuops benchmark report</title>",
             "<style>body{font-family:sans-serif;margin:2em;}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#eee}"
             ".sim{color:#a60}</style></head><body>",
             "<h1>gpuops benchmark report</h1>"]
    note = footnote(labels_of(results))
    if note:
        parts.append(f"<p class='sim'><b>SIMULATED.</b> {esc(note)}.</p>")
        for label, figures in model_figures(results).items():
            if not figures:
                continue
            parts.append(f"<details><summary>What stand-in model {esc(label)} predicts from</summary><table>"
                         "<tr><th>figure</th><th>value</th><th>unit</th><th>basis</th><th>source</th><th>note</th></tr>")
            for f in figures:
                value = f.get("value")
                shown = format_value(value) if isinstance(value, float) else str(value)
                parts.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
                    f.get("name"), shown, f.get("unit", ""), figure_basis(f), f.get("source"), f.get("note", ""))) + "</tr>")
            parts.append("</table></details>")
    parts.append("<h2>Results</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    comparison = _comparison_rows(results)
    if comparison:
        c_headers, c_rows = comparison
        parts.append("<h2>Comparison</h2><p>The first result is the baseline.</p><table><tr>"
                     + "".join(f"<th>{esc(h)}</th>" for h in c_headers) + "</tr>")
        for row in c_rows:
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    for heading, tables in (("All-reduce", _allreduce_tables(results)), ("Fused vs unfused", _fusion_tables(results))):
        for title, t_headers, t_rows in tables:
            parts.append(f"<h2>{esc(heading)}</h2><p>{esc(title)}</p><table><tr>"
                         + "".join(f"<th>{esc(h)}</th>" for h in t_headers) + "</tr>")
            for row in t_rows:
                parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
            parts.append("</table>")
    titles = {"tokens_per_s": "Decode rate per configuration", "itl_distribution": "Latency distributions",
              "serving": "Serving sweep", "allreduce_latency": "All-reduce latency vs size per NCCL variant",
              "fusion": "Fused vs unfused all-reduce + RMSNorm"}
    for name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{esc(titles.get(name, name))}</h2>"
                     f"<img id='plot-{esc(name)}' alt='{esc(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(results: Sequence[Mapping[str, Any]], html_path: Path) -> tuple[Path, Path]:
    """Write the HTML report and a Markdown summary next to it (same name, .md)."""
    if not results:
        raise GpuopsError("report: no results to report")
    try:
        plots = build_plots(results)
    except ImportError:
        raise GpuopsError("report: matplotlib is not installed (pip install 'gpuops[plot]')") from None
    html_path = Path(html_path)
    md_path = html_path.with_suffix(".md")
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        html_path.write_text(render_html(results, plots), encoding="utf-8")
        md_path.write_text(render_markdown(results, list(plots), html_path.name), encoding="utf-8")
    except OSError as exc:
        raise GpuopsError(f"report: cannot write {html_path}: {exc.strerror}") from None
    return html_path, md_path
