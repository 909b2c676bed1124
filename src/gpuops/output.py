"""Human and JSON output shared by the commands.

Human output uses rich tables and colour on a terminal and plain aligned text otherwise (pipes,
files, CI logs), so it stays greppable. rich is imported only when a console is really made, so
`gpuops ... --json` and `--help` never pay for it. ``--json`` prints exactly one document.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def is_tty(stream: IO[str] | None = None) -> bool:
    """Whether human output should be rich (tables, live progress): a terminal, GPUOPS_PLAIN not
    set and TERM not dumb. NO_COLOR keeps the tables and drops only the colour (``use_color``)."""
    stream = stream or sys.stdout
    if os.environ.get("GPUOPS_PLAIN") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def use_color(stream: IO[str] | None = None) -> bool:
    """The one decision on colour: a rich terminal (``is_tty``) and NO_COLOR not set."""
    return is_tty(stream) and not os.environ.get("NO_COLOR")


def make_console(stream: IO[str] | None = None, force_terminal: bool | None = None) -> Console:
    """A rich Console for ``stream`` (deferred import). On a non-TTY it prints no colour codes."""
    from rich.console import Console

    stream = stream or sys.stdout
    terminal = is_tty(stream) if force_terminal is None else force_terminal
    return Console(
        file=stream,
        force_terminal=terminal,
        no_color=not terminal or bool(os.environ.get("NO_COLOR")),
        highlight=False,
        soft_wrap=not terminal,
        width=None if terminal else 200,
    )


def to_json(document: Any) -> str:
    """The one JSON encoding of every ``--json`` document: indented, keys in insertion order."""
    return json.dumps(document, indent=2, default=_default, ensure_ascii=False)


def print_json(document: Any, stream: IO[str] | None = None) -> None:
    (stream or sys.stdout).write(to_json(document) + "\n")


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "__fspath__"):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Plain aligned text: columns padded to their widest cell, two spaces apart."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append(indent + "  ".join(padded).rstrip())
    return "\n".join(lines)


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> Any:
    """The same table for a terminal (deferred rich import)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(str(header))
    for row in rows:
        table.add_row(*("" if c is None else str(c) for c in row))
    return table
