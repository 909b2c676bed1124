"""What every suite's client module shares, and the defaults of one that has nothing of its own (or of
a stored result whose suite is no longer registered): what a module provides is ``suites.SuiteReader``;
a module imports from here the defaults it does not change. Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.bench.compare import format_value
from gpuops.bench.frames import RemoteRun
from gpuops.bench.record import Headline, JSONObject, ResultDocument, Summary, mapping, number, objects
from gpuops.bench.simulated import mark
from gpuops.bench.suites import (BenchTable, Distributions, ExportLevel, Figures, Plot, ReportTable, RunParts,
                                 SuiteOptions)
from gpuops.errors import GpuopsError
from gpuops.remote.sglang_argv import flag_name, parse_flags


def request_figures(summary: Summary) -> Figures:
    """The per-request figures of a suite that sends generation requests (decode, serving)."""
    out: Figures = {}
    out[("output tokens/s (per stream)", "tok/s", "higher")] = number(summary, "output_tokens_per_s")
    out[("TTFT p50", "ms", "lower")] = number(summary, "ttft_ms", "p50")
    for q in ("p50", "p90", "p99"):
        out[(f"ITL {q}", "ms", "lower")] = number(summary, "itl_ms", q)
    out[("accept length", "tokens", "higher")] = number(summary, "accept_length")
    return out


def headline(summary: Summary, result: ResultDocument) -> Headline:
    """Keys a suite adds to the per-host line of ``gpuops bench --json`` (none by default)."""
    return {}


def figures(summary: Summary, result: ResultDocument) -> Figures:
    """The figures ``results compare`` lines up (none for a suite it cannot read)."""
    return {}


def summarize(run: RemoteRun, options: SuiteOptions) -> RunParts:
    """The summary of one run of the suite (nothing for a suite without its own)."""
    return RunParts({})


def finish(run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str]) -> list[str]:
    """Errors to add once the run is summarised (a run that measured nothing says so)."""
    return []


def accept_length(run: RemoteRun) -> float | None:
    """The server's speculative-decoding accept length, from after the run or else before it."""
    for source in (run.server_after or {}, mapping((run.server or {}).get("server_info"))):
        for state in objects(source.get("internal_states")):
            spec = number(state, "avg_spec_accept_length")
            if spec is not None:
                return spec
    return None


def finish_requests(run: RemoteRun, summary: Summary, rows: Sequence[JSONObject], errors: Sequence[str]) -> list[str]:
    """For suites that send requests: the accept length where the summary lacks it, and an error
    when no request completed."""
    spec = accept_length(run)
    if spec is not None and summary.get("accept_length") is None:
        summary["accept_length"] = spec
    return ["no request completed"] if not summary.get("completed") and not errors else []


def within_run(result: ResultDocument) -> Distributions:
    """The distributions inside one run that intervals are drawn from (none by default)."""
    return {}


def across_repeats(summaries: Sequence[Mapping[str, object]]) -> Distributions:
    """One value per repeat of each headline figure (the levels' are added by ``repeats``)."""
    return {}


def merge_repeats(merged: ResultDocument, results: Sequence[ResultDocument]) -> Summary:
    """The summary of ``--repeat N`` results merged into ``merged`` (its raw rows pooled, each
    tagged with its ``repeat``): by default the last repeat's."""
    return (merged.get("summary") or {}).copy()


def check_options(options: SuiteOptions) -> None:
    """Refuse (``GpuopsError``, one line) options only this suite cannot run with; none by default."""


def tool_runs(options: SuiteOptions) -> tuple[str, str, list[list[str]]]:
    """``--tool sglang``: (SGLang's benchmark module, its output flag, one argv tail per run)."""

    raise GpuopsError(f"bench: --tool sglang does not run the {options.suite} suite")


def tool_has(user: Sequence[str], flag: str) -> bool:
    """Whether the user's own ``--tool-args`` give ``flag`` (theirs win over gpuops' defaults)."""

    return flag_name(flag) in parse_flags(list(user))[0]


def cell(value: object) -> str:
    """A figure as a table shows it (``-`` for none)."""

    return format_value(value) if isinstance(value, (int, float)) or value is None else str(value)


def sim_cell(value: object, simulated: bool) -> str:
    """A figure, marked (sim) when it comes from a stand-in server (gpuops.bench.simulated)."""

    return mark(cell(value), simulated)


def bench_tables(hosts: Mapping[str, Headline]) -> list[BenchTable]:
    """The tables ``gpuops bench`` prints from the per-host headlines: (title or None for
    ``bench <suite>``, headers, rows); a further table is printed only when it has rows. By
    default one row of per-request figures a host."""
    headers = ["host", "ok", "tok/s", "TTFT p50 ms", "ITL p50", "ITL p90", "ITL p99", "accept", "result", "error"]
    rows = []
    for name, line in hosts.items():
        itl = line.get("itl_ms") or {}
        ok = "yes" if line.get("ok") else ("partial" if line.get("partial") and line.get("result_id") else "NO")
        figures = (line.get("output_tokens_per_s"), line.get("ttft_ms"), itl.get("p50"), itl.get("p90"),
                   itl.get("p99"), line.get("accept_length"))
        rows.append([name, ok, *(sim_cell(x, bool(line.get("simulated"))) for x in figures),
                     line.get("result_id") or "-", line.get("error") or ""])
    return [(None, headers, rows)]


PLOTS: tuple[Plot, ...] = ()


def report_tables(results: Sequence[ResultDocument]) -> list[ReportTable]:
    """The report's tables of the suite's own results: (heading, title, headers, rows); none by default."""
    return []


def levels(result: ResultDocument) -> list[ExportLevel]:
    """(identity columns, figures) of every measured level for ``results export``: one, the summary."""
    return [({"level": "all"}, result.get("summary") or {})]
