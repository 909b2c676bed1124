"""What every suite's client module shares, and the defaults of one that has nothing of its own (or of
a stored result whose suite is no longer registered).

A suite's client module is ``bench/suite_<name>.py`` (``suites.reader(name)``). For a new run:
``check_options(options)``, ``tool_runs(options)`` (``--tool sglang``), ``summarize(run, options)``
and ``finish(run, summary, rows, errors)``. For a stored result: ``headline(summary, result)``,
``figures(summary, result)`` (``results compare``), ``levels(result)`` (``results export``),
``within_run(result)`` and ``across_repeats(summaries)`` (the distributions intervals are drawn
from), ``merge_repeats(merged, results)`` (``--repeat N``). For output: ``bench_tables(hosts)``
(``gpuops bench``), ``PLOTS`` and ``report_tables(results)`` (the HTML report). A module imports
from here the defaults it does not change. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from gpuops.bench.compare import format_value
from gpuops.bench.simulated import mark
from gpuops.errors import GpuopsError
from gpuops.remote.sglang_argv import flag_name, parse_flags

if TYPE_CHECKING:
    from gpuops.bench.frames import RemoteRun
    from gpuops.bench.options import BenchOptions

# (figure name, unit, which way is better) -> value; the names are the ones ``results compare``
# shows and under which ``repeats`` stores each figure's interval.
Figures = dict[tuple[str, str, str], "float | None"]


def number(mapping: Any, *path: str) -> float | None:
    """The number at ``path`` in nested mappings; None when missing or not a number."""
    value: Any = mapping
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def request_figures(summary: Mapping[str, Any]) -> Figures:
    """The per-request figures of a suite that sends generation requests (decode, serving)."""
    out: Figures = {}
    out[("output tokens/s (per stream)", "tok/s", "higher")] = number(summary, "output_tokens_per_s")
    out[("TTFT p50", "ms", "lower")] = number(summary, "ttft_ms", "p50")
    for q in ("p50", "p90", "p99"):
        out[(f"ITL {q}", "ms", "lower")] = number(summary, "itl_ms", q)
    out[("accept length", "tokens", "higher")] = number(summary, "accept_length")
    return out


def headline(summary: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """Keys a suite adds to the per-host line of ``gpuops bench --json`` (none by default)."""
    return {}


def figures(summary: Mapping[str, Any], result: Mapping[str, Any]) -> Figures:
    """The figures ``results compare`` lines up (none for a suite it cannot read)."""
    return {}


@dataclass
class RunParts:
    """What a suite makes of one run's output (``bench/results.build_result`` adds the rest)."""

    summary: dict[str, Any]
    levels: list[dict[str, Any]] = field(default_factory=list)     # serving: one per level
    rows: list[dict[str, Any]] = field(default_factory=list)       # allreduce: one per variant and size
    samples: list[dict[str, Any]] | None = None                    # None: the run's own request samples
    errors: list[str] = field(default_factory=list)


def summarize(run: "RemoteRun", options: "BenchOptions") -> RunParts:
    """The summary of one run of the suite (nothing for a suite without its own)."""
    return RunParts({})


def finish(run: "RemoteRun", summary: dict[str, Any], rows: Sequence[Mapping[str, Any]],
           errors: Sequence[str]) -> list[str]:
    """Errors to add once the run is summarised (a run that measured nothing says so)."""
    return []


def accept_length(run: "RemoteRun") -> float | None:
    """The server's speculative-decoding accept length, from after the run or else before it."""
    for source in (run.server_after or {}, (run.server or {}).get("server_info") or {}):
        for state in source.get("internal_states") or []:
            if isinstance(state, dict) and isinstance(state.get("avg_spec_accept_length"), (int, float)):
                return float(state["avg_spec_accept_length"])
    return None


def finish_requests(run: "RemoteRun", summary: dict[str, Any], rows: Sequence[Mapping[str, Any]],
                    errors: Sequence[str]) -> list[str]:
    """For suites that send requests: the accept length where the summary lacks it, and an error
    when no request completed."""
    spec = accept_length(run)
    if spec is not None and summary.get("accept_length") is None:
        summary["accept_length"] = spec
    return ["no request completed"] if not summary.get("completed") and not errors else []


# A figure's values: (what they are over: "requests" | "tokens" | "trials" | "repeats", values).
Distributions = dict[str, tuple[str, list[float]]]


def within_run(result: Mapping[str, Any]) -> Distributions:
    """The distributions inside one run that intervals are drawn from (none by default)."""
    return {}


def across_repeats(summaries: Sequence[Mapping[str, Any]]) -> Distributions:
    """One value per repeat of each headline figure (the levels' are added by ``repeats``)."""
    return {}


def merge_repeats(merged: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of ``--repeat N`` results merged into ``merged`` (its raw rows pooled, each
    tagged with its ``repeat``): by default the last repeat's."""
    return dict(merged.get("summary") or {})


def check_options(options: "BenchOptions") -> None:
    """Refuse (``GpuopsError``, one line) options only this suite cannot run with; none by default."""


def tool_runs(options: "BenchOptions") -> tuple[str, str, list[list[str]]]:
    """``--tool sglang``: (SGLang's benchmark module, its output flag, one argv tail per run)."""

    raise GpuopsError(f"bench: --tool sglang does not run the {options.suite} suite")


def tool_has(user: Sequence[str], flag: str) -> bool:
    """Whether the user's own ``--tool-args`` give ``flag`` (theirs win over gpuops' defaults)."""

    return flag_name(flag) in parse_flags(list(user))[0]


def cell(value: Any) -> str:
    """A figure as a table shows it (``-`` for none)."""

    return format_value(value) if isinstance(value, (int, float)) or value is None else str(value)


def sim_cell(value: Any, simulated: bool) -> str:
    """A figure, marked (sim) when it comes from a stand-in server (gpuops.bench.simulated)."""

    return mark(cell(value), simulated)


def bench_tables(hosts: Mapping[str, Mapping[str, Any]]) -> list[tuple[str | None, list[str], list[list[str]]]]:
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


# The report's plots: (name, title, maker); a maker gets the suite's own results, returns PNG bytes or None.
PLOTS: tuple[tuple[str, str, Any], ...] = ()


def report_tables(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """The report's tables of the suite's own results: (heading, title, headers, rows); none by default."""
    return []


def levels(result: Mapping[str, Any]) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    """(identity columns, figures) of every measured level for ``results export``: one, the summary."""
    return [({"level": "all"}, result.get("summary") or {})]
