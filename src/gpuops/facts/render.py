"""Human report of one host's facts, from the JSON document (so both views always agree).

Writes through a rich Console; tables are rich tables on a terminal and plain aligned text
otherwise, so a piped report stays readable and greppable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from gpuops.facts.gpu import GPU_HEADERS, gpu_heading, gpu_rows
from gpuops.facts.server_json import server_lines
from gpuops.facts.software import software_lines
from gpuops.facts.to_json import FactsJSON
from gpuops.facts.topology import interconnect_line, numa_line
from gpuops.output import format_table, rich_table

if TYPE_CHECKING:
    from rich.console import Console


def _say(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False)


def _table(console: Console, headers: list[str], rows: list[list[object]]) -> None:
    if console.is_terminal:
        console.print(rich_table(headers, rows))
    else:
        _say(console, format_table(headers, rows, indent="  "))


def _whole(text: str) -> str:
    return text


def render_host_facts(console: Console, facts: FactsJSON, fit: Callable[[str], str] = _whole) -> None:
    """The facts part of one host's report (the caller prints the header and the gates); ``fit``
    shortens each line of text (``output.brief``: one screen a host), tables and headings stay whole."""
    if facts["gpu_status"]["known"]:
        _say(console, gpu_heading(facts), style="bold")
        _table(console, GPU_HEADERS, gpu_rows(facts))
        if facts["gpu_status"].get("note"):
            _say(console, fit(f"  note: {facts['gpu_status']['note']}"), style="yellow")
    else:
        _say(console, gpu_heading(facts), style="yellow")
    ic = facts["interconnect"]
    _say(console, fit(f"interconnect: {interconnect_line(ic)}"))
    numa = numa_line(ic)
    if numa:
        _say(console, fit(f"NUMA: {numa}"))
    for i, line in enumerate(software_lines(facts["software"])):
        _say(console, fit(("software: " if i == 0 else "  ") + line))
    for i, line in enumerate(server_lines(facts["server"], facts["model"])):
        _say(console, fit(("server: " if i == 0 else "  ") + line))
    for warning in facts["warnings"]:
        _say(console, fit(f"warning: {warning}"), style="yellow")
