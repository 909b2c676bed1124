"""Human and JSON output shared by the commands.

Human output uses rich tables and colour on a terminal and plain aligned text otherwise (pipes,
files, CI logs), so it stays greppable. rich is imported only when a console is really made, so
`gpuops ... --json` and `--help` never pay for it. ``--json`` prints exactly one document.
"""

from __future__ import annotations

import io
import json
import os
import re
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
    """A rich Console for ``stream`` (deferred import). On a non-TTY it prints no colour codes.

    On a terminal it writes its colour to the stream under the guard (``trusted_stream``), so
    every string it is given passes through ``safe_text`` first (``_SafeConsole``) and tables
    are built from sanitised cells (``rich_table``)."""
    from rich.console import Console

    stream = stream or sys.stdout
    terminal = is_tty(stream) if force_terminal is None else force_terminal
    return _safe_console_class(Console)(
        file=trusted_stream(stream) if terminal else stream,
        force_terminal=terminal,
        no_color=not terminal or bool(os.environ.get("NO_COLOR")),
        highlight=False,
        soft_wrap=not terminal,
        width=None if terminal else 200,
    )


def _safe_console_class(base: type) -> type:
    class _SafeConsole(base):  # type: ignore[misc, valid-type]
        """A Console whose ``print`` sanitises every string it is given (host text among them)."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            super().print(*(safe_text(o) if isinstance(o, str) else o for o in objects), **kwargs)

    return _SafeConsole


def to_json(document: Any) -> str:
    """The one JSON encoding of every ``--json`` document: indented, keys in insertion order.

    Host text keeps its value: json.dumps encodes C0 controls itself; DEL, C1, bidirectional
    overrides and lone surrogates (which it would leave raw with ``ensure_ascii=False``) are
    written as ``\\uXXXX`` escapes too, so the document is safe on a terminal and still exact."""
    return json.dumps(document, indent=2, default=_default, ensure_ascii=False).translate(_JSON_ESCAPES)


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
    cells = [[safe_text(h, newlines=False) for h in headers]] + [
        ["" if c is None else safe_text(c, newlines=False) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append(indent + "  ".join(padded).rstrip())
    return "\n".join(lines)


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> Any:
    """The same table for a terminal (deferred rich import): cells are ``Text``, never markup, and
    pass through ``safe_text`` (a rich console on a terminal writes around the stream guard)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=None if title is None else Text(safe_text(title, newlines=False)), title_justify="left",
                  show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(Text(safe_text(header, newlines=False)))
    for row in rows:
        table.add_row(*(Text("" if c is None else safe_text(c, newlines=False)) for c in row))
    return table


# -- host text is data ---------------------------------------------------------------------------
# Everything a host sends (probe output, server reports, result fields, error tails, file names)
# may carry terminal control sequences: ESC ] 0;title BEL retitles the operator's terminal, ESC [2J
# clears it, ESC [31m spoofs colour, and C1 CSI (U+009B) does the same in one character. Human
# output shows such characters as escapes (``\x1b``); ``--json`` keeps the value (json.dumps
# encodes controls as ``\u001b``). Bidirectional overrides are shown too: they reorder what the
# operator reads without being visible.
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape: show the byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(code: int, newlines: bool) -> bool:
    if code < 0x20:
        return not (code == 0x09 or (newlines and code == 0x0A))
    return 0x7F <= code <= 0x9F or code in _BIDI or 0xD800 <= code <= 0xDFFF


_TABLES: dict[bool, dict[int, str]] = {
    newlines: {c: _escape(chr(c)) for c in (*range(0x20), *range(0x7F, 0xA0), *_BIDI, *range(0xDC80, 0xDD00))
               if _unsafe(c, newlines)}
    for newlines in (True, False)
}


_SURROGATES = re.compile("[\ud800-\udfff]")
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *_BIDI, *range(0xD800, 0xE000))}


def echo_trusted(text: str, err: bool = False) -> None:
    """One line of gpuops' own colour, written around the stream guard: ``text`` must already
    have passed through ``safe_text`` (``apply/render.py`` does it for every line)."""
    stream = trusted_stream(sys.stderr if err else sys.stdout)
    stream.write(text + "\n")
    stream.flush()


SCREEN_WIDTH = 120  # what a default report line fits in (the detail behind -v may run longer)


def brief(text: str, width: int = SCREEN_WIDTH) -> str:
    """``text`` in at most ``width`` characters: as it is when it fits; else without its
    parenthesised asides (innermost first, the text around them kept), then cut with ``...``."""
    out = text
    while len(out) > width:
        shorter = re.sub(r" \([^()]*\)", "", out, count=1)
        if shorter == out:
            break
        out = shorter
    return out if len(out) <= width else out[:max(width - 3, 0)].rstrip() + "..."


def safe_text(text: object, *, newlines: bool = True) -> str:
    """``text`` made safe for a terminal, a log or a text file: every C0/C1 control character (and
    so every escape sequence, whose ESC it starts with), DEL, lone surrogates and bidirectional
    overrides shown as ``\\x1b``/``\\u202e`` escapes. Tab stays; newline stays unless ``newlines``
    is False (a table cell, one line of a report). The one sanitiser of human output: the standard
    streams apply it to everything written (``guard_standard_streams``); what bypasses them (rich
    on a terminal, gpuops' own colour) applies it to each piece of text first."""
    value = text if isinstance(text, str) else str(text)
    out = value.translate(_TABLES[newlines])
    # what translate cannot see: surrogates outside the escape range (never produced by a decode).
    # A regex, not a per-character loop: an inspect document is ~190 KB, and the loop cost 7.5 ms of it.
    return _SURROGATES.sub(lambda m: _escape(m.group()), out)


class SafeTextStream(io.TextIOBase):
    """A text stream that writes ``safe_text`` of everything to ``trusted``, the stream under it.

    Installed over sys.stdout and sys.stderr for every command (``guard_standard_streams``), so
    nothing a host sent reaches the operator's terminal raw whichever code printed it. Only
    gpuops' own colour (rich on a terminal, apply's styled lines) writes to ``trusted``, and it
    passes its text through ``safe_text`` first. No ``buffer``: bytes cannot go around it."""

    def __init__(self, trusted: IO[str]) -> None:
        super().__init__()
        self.trusted = trusted

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes a stream with write(b""): this one is text only
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.trusted.write(safe_text(text))
        return len(text)

    def flush(self) -> None:
        self.trusted.flush()

    def isatty(self) -> bool:
        return is_tty_stream(self.trusted)

    def fileno(self) -> int:
        return self.trusted.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.trusted, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.trusted, "errors", None)


def is_tty_stream(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def guard_standard_streams() -> None:
    """Put a ``SafeTextStream`` over sys.stdout and sys.stderr (once; the CLI does it first)."""
    if not isinstance(sys.stdout, SafeTextStream):
        sys.stdout = SafeTextStream(sys.stdout)
    if not isinstance(sys.stderr, SafeTextStream):
        sys.stderr = SafeTextStream(sys.stderr)


def trusted_stream(stream: IO[str]) -> IO[str]:
    """The stream under a ``SafeTextStream`` (for text already passed through ``safe_text``)."""
    return stream.trusted if isinstance(stream, SafeTextStream) else stream
