"""What every suite's reader shares: how a stored result of a suite is read on the client (its
headline, its figures for ``results compare``, its rows for ``results export``), with the defaults a
suite without anything of its own (or a stored result of a suite no longer registered) gets.

A suite's reader is the module ``bench/suite_<name>.py`` (``suites.reader(name)``), defining
``headline(summary, result)``, ``figures(summary, result)``, ``levels(result)`` (export rows),
``within_run(result)`` and ``across_repeats(summaries)`` (the distributions intervals are drawn
from) and ``merge_repeats(merged, results)`` (the summary of ``--repeat N``); this module holds the
defaults (import those a suite does not change). Pure.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

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


def levels(result: Mapping[str, Any]) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    """(identity columns, figures) of every measured level for ``results export``: one, the summary."""
    return [({"level": "all"}, result.get("summary") or {})]
