"""Colour is decided once (gpuops.output.use_color): a terminal, GPUOPS_PLAIN and TERM=dumb turn rich
output off altogether, NO_COLOR keeps the tables and drops only the colour."""

from __future__ import annotations

import io
import os
import pty

import pytest

from gpuops.output import is_tty, make_console, use_color


@pytest.fixture
def terminal():
    """A real pseudo-terminal, so isatty() is the kernel's answer and not a stub's."""
    leader, follower = pty.openpty()
    stream = os.fdopen(follower, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("NO_COLOR", "GPUOPS_PLAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_a_terminal_gets_colour_and_a_pipe_does_not(terminal):
    assert is_tty(terminal) and use_color(terminal)
    assert not is_tty(io.StringIO()) and not use_color(io.StringIO())


def test_no_color_keeps_the_terminal_and_drops_the_colour(terminal, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert is_tty(terminal) and not use_color(terminal)
    assert make_console(terminal).no_color


@pytest.mark.parametrize("name,value", [("GPUOPS_PLAIN", "1"), ("TERM", "dumb")])
def test_plain_output_turns_off_both(terminal, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not is_tty(terminal) and not use_color(terminal)
