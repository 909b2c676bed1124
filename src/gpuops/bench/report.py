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
<name>" stamp on the image itself: ``figure_png`` takes the results a plot shows and stamps through
``gpuops.bench.simulated.stamp_figure``; table cells of simulated figures carry ``(sim)``.

Which plots and tables a suite has is its own (``PLOTS`` and ``report_tables`` in its client module
``bench/suite_<name>.py``, found through the registry); this module lays them out and holds the
helpers they share (``result_label``, ``difference_hint``, ``figure_png``, ``error_bars``).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from gpuops.bench.compare import compare_results, format_delta, format_value
from gpuops.bench.fingerprint import config_differences
from gpuops.bench.record import ResultDocument, figure
from gpuops.bench.simulated import figure_basis, footnote, is_simulated, labels_of, mark, model_figures, stamp_figure
from gpuops.bench.stats import Interval
from gpuops.errors import GpuopsError
from gpuops.output import safe_text
from gpuops.bench.suites import SUITES, ReportTable, SuiteReader, reader

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def result_label(result: ResultDocument) -> str:
    return mark(f"{result.get('host')} {str(result.get('id'))[:6]}", is_simulated(result))


def _config_line(result: ResultDocument) -> str:
    config = result.get("configuration") or {}
    args = config.get("server_args") or {}
    bits = []
    for key in ("tp_size", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                "speculative_num_draft_tokens", "enable_flashinfer_allreduce_fusion",
                "flashinfer_allreduce_fusion_backend"):
        if args.get(key) not in (None, False):
            bits.append(f"{key}={args[key]}")
    env = config.get("env") or {}
    bits += [f"{k}={v}" for k, v in env.items() if k.startswith("NCCL_")]
    gates = config.get("patched_gates")
    if gates:
        bits.append(f"patched: {', '.join(gates)}")
    if config.get("sglang_version"):
        bits.append(f"sglang {config['sglang_version']}")
    return "; ".join(bits) or "-"


def difference_hint(baseline: ResultDocument, result: ResultDocument) -> str:
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


def figure_png(fig: Figure, shown: Sequence[ResultDocument]) -> bytes:
    """The figure as PNG bytes; ``shown``: the results it draws (a simulated one stamps it)."""
    stamp_figure(fig, shown)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buffer.getvalue()


def error_bars(values: Sequence[object], intervals: Sequence[Mapping[str, object] | None]) -> list[list[float]] | None:
    """matplotlib's asymmetric error bars from stored intervals (0 where a value or its interval is none)."""
    if not any(intervals):
        return None
    low, high = [], []
    for value, stored in zip(values, intervals):
        interval = Interval.from_json(stored)
        if not isinstance(value, (int, float)) or interval is None:
            low.append(0.0)
            high.append(0.0)
        else:
            low.append(max(0.0, value - interval.low))
            high.append(max(0.0, interval.high - value))
    return [low, high]


def _by_suite(results: Sequence[ResultDocument]) -> list[tuple[SuiteReader, list[ResultDocument]]]:
    """Each registered suite's client module with its own results, in the registry's order."""

    return [(reader(name), [r for r in results if r.get("suite") == name]) for name in SUITES]


def build_plots(results: Sequence[ResultDocument]) -> dict[str, bytes]:
    """Every suite's plots (its ``PLOTS``) of its own results; decode and serving never share one."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    plots = {}
    for suite, mine in _by_suite(results):
        for name, _, maker in suite.PLOTS:
            png = maker(mine)
            if png:
                plots[name] = png
    return plots


def _plot_titles() -> dict[str, str]:
    return {name: title for suite in SUITES for name, title, _ in reader(suite).PLOTS}


def _suite_tables(results: Sequence[ResultDocument]) -> list[ReportTable]:
    """(heading, title, headers, rows) of every suite's own tables (``report_tables``)."""
    return [table for suite, mine in _by_suite(results) for table in suite.report_tables(mine)]


def _results_table(results: Sequence[ResultDocument]) -> tuple[list[str], list[list[str]]]:
    headers = ["id", "host", "suite", "created", "tok/s", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms",
               "accept", "fingerprint", "configuration"]
    rows = []
    for r in results:
        s = r.get("summary") or {}
        ttft = s.get("ttft_ms") or {}
        itl = s.get("itl_ms") or {}
        sim = is_simulated(r)
        figures = (s.get("output_tokens_per_s"), ttft.get("p50"), itl.get("p50"), itl.get("p99"),
                   figure(s.get("accept_length")))
        rows.append([str(r.get("id")), str(r.get("host")), str(r.get("suite")) + (" (partial)" if r.get("partial") else ""),
                     str(r.get("created")), *(mark(format_value(x), sim) for x in figures),
                     str(r.get("fingerprint"))[:10], _config_line(r)])
    return headers, rows


def _comparison_rows(results: Sequence[ResultDocument]) -> tuple[list[str], list[list[str]]] | None:
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


def render_markdown(results: Sequence[ResultDocument], plot_names: Sequence[str], html_name: str) -> str:
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
    for heading, title, t_headers, t_rows in _suite_tables(results):
        lines += ["", f"## {heading}: {title}", "", "| " + " | ".join(t_headers) + " |",
                  "|" + "---|" * len(t_headers)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t_rows]
    lines += ["", "Plots: " + (", ".join(plot_names) or "none"), ""]
    return "\n".join(lines)


def render_html(results: Sequence[ResultDocument], plots: Mapping[str, bytes]) -> str:
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
    for heading, title, t_headers, t_rows in _suite_tables(results):
        parts.append(f"<h2>{esc(heading)}</h2><p>{esc(title)}</p><table><tr>"
                     + "".join(f"<th>{esc(h)}</th>" for h in t_headers) + "</tr>")
        for row in t_rows:
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    titles = _plot_titles()
    for name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<h2>{esc(titles.get(name, name))}</h2>"
                     f"<img id='plot-{esc(name)}' alt='{esc(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(results: Sequence[ResultDocument], html_path: Path) -> tuple[Path, Path]:
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
        html_path.write_text(safe_text(render_html(results, plots)), encoding="utf-8")
        # markdown is read in a terminal as often as rendered: host text in it is shown escaped
        md_path.write_text(safe_text(render_markdown(results, list(plots), html_path.name)), encoding="utf-8")
    except OSError as exc:
        raise GpuopsError(f"report: cannot write {html_path}: {exc.strerror}") from None
    return html_path, md_path
