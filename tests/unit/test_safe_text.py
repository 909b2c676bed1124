"""``output.safe_text``: the one sanitiser of human output, and the paths that write around the guard.

The standard streams pass everything through it (``SafeTextStream``); gpuops' own colour (rich on a
terminal, apply's styled lines) writes to the stream under the guard, so those paths sanitise each
piece of text themselves: each is checked here with a terminal's colour on.
"""

from __future__ import annotations

import io
import json

import click
import pytest

from gpuops.output import SafeTextStream, make_console, rich_table, safe_text, to_json, trusted_stream

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\x9b0m\u202e"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mEVIL\\x9b0m\\u202e"
RAW = ("\x1b]", "\x1b[2J", "\x07", "\x9b", "\x1b[31mEVIL", "\u202e")


def _no_raw(text: str) -> None:
    for bad in RAW:
        assert bad not in text, repr(text)


@pytest.mark.parametrize("char,shown", [("\x1b", "\\x1b"), ("\x9b", "\\x9b"), ("\x7f", "\\x7f"), ("\r", "\\x0d"),
                                        ("\x00", "\\x00"), ("\u202e", "\\u202e"), ("\udc9b", "\\x9b"),
                                        ("\ud800", "\\ud800"), ("\udfff", "\\udfff")])
def test_each_control_is_shown_as_an_escape(char, shown):
    assert safe_text(f"a{char}b") == f"a{shown}b"


def test_text_tab_and_newline_stay_and_a_cell_escapes_the_newline():
    assert safe_text("GPU 0\tNVIDIA H200 — ok\n") == "GPU 0\tNVIDIA H200 — ok\n"
    assert safe_text("a\nb", newlines=False) == "a\\x0ab"
    assert safe_text(HOSTILE) == SHOWN


def test_json_keeps_the_value_and_is_safe_on_a_terminal():
    document = {"name": HOSTILE, "bytes": "\udc9b"}
    encoded = to_json(document)
    _no_raw(encoded)
    assert "\udc9b" not in encoded
    assert json.loads(encoded) == document


def test_the_guarded_stream_escapes_everything_and_refuses_bytes():
    under = io.StringIO()
    guarded = SafeTextStream(under)
    guarded.write("gpu: " + HOSTILE + "\n")
    assert under.getvalue() == "gpu: " + SHOWN + "\n"
    click.echo("gpu: " + HOSTILE, file=guarded, color=True)  # click leaves the text as it is: the guard escapes
    assert under.getvalue() == ("gpu: " + SHOWN + "\n") * 2
    with pytest.raises(TypeError):
        guarded.write(b"\x1b[2J")  # type: ignore[arg-type]
    assert trusted_stream(guarded) is under


def test_a_terminal_console_sanitises_strings_and_table_cells():
    """On a terminal rich writes its colour around the guard: what it is given is sanitised first."""
    under = io.StringIO()
    console = make_console(SafeTextStream(under), force_terminal=True)
    console.print("name: " + HOSTILE, style="bold", markup=False, highlight=False)
    console.print(rich_table(["host", "gpu"], [["h01", HOSTILE], ["[red]h02", "x"]], title="t " + HOSTILE))
    written = under.getvalue()
    _no_raw(written)
    assert "\x1b[" in written, "the console did write its own colour"
    assert "EVIL" in written and "\\x1b[31mEVIL" in written.replace("\x1b[0m", "").replace("\x1b[1m", "")
    assert "[red]h02" in written, "a cell is text, not rich markup"


def test_apply_recap_in_colour_sanitises_every_host_field():
    from gpuops.apply.host_report import HostReport
    from gpuops.apply.render import render_history, render_reports

    report = HostReport(host="h01", ok=False, status="rolled_back", run_id="r1", error="health: " + HOSTILE,
                        log_tail="line " + HOSTILE + "\nnext", warnings=["w " + HOSTILE],
                        changes=[{"path": "/etc/" + HOSTILE, "action": "update", "kind": "file",
                                  "diff": "-old " + HOSTILE + "\n+new\n"}], restored=["/etc/" + HOSTILE])
    lines: list[str] = []
    render_reports({"h01": report}, "nccl-env", False, True, lines.append, color=True)
    written = "\n".join(lines)
    _no_raw(written)
    assert written.count("EVIL") >= 6 and "\x1b[31m" in written  # gpuops' own red is still there
    lines.clear()
    render_history({"h01": {"runs": [{"run_id": "r1", "role": HOSTILE, "outcome": "rolled_back", "changed": 0,
                                      "error": HOSTILE, "user": HOSTILE}]}}, lines.append)
    _no_raw("\n".join(lines))
