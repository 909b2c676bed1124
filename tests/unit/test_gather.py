"""The one-exec gather: framing, robustness against hostile output, failures that stay local."""

from __future__ import annotations

import time

import pytest

from gpuops.gather import (
    Probe,
    ProbeFailure,
    ProbeOutput,
    build_gather_script,
    gather,
    in_background,
    parse_outputs,
    split_gather_output,
)
from gpuops.errors import TransportError
from gpuops.inventory import Host
from gpuops.transport.local import LocalConnection


def _local() -> LocalConnection:
    return LocalConnection(Host(name="localhost", address=None, port=None, user=None, key_file=None,
                                connection="local", groups=(), vars={}))


def raw(out: ProbeOutput) -> ProbeOutput:
    return out


def test_each_probe_gets_its_own_stdout_stderr_and_status() -> None:
    values = gather(_local(), [
        Probe("a", "echo hi; echo oops >&2; exit 3", raw),
        Probe("b", "printf 'no newline at end'", raw),
        Probe("c", "printf '\\n\\nblank lines\\n\\n'", raw),
    ])
    assert values["a"] == ProbeOutput("hi\n", "oops\n", 3)
    assert values["b"] == ProbeOutput("no newline at end", "", 0)
    assert values["c"].stdout == "\n\nblank lines\n\n"


def test_a_probe_that_reads_stdin_does_not_eat_the_rest_of_the_script() -> None:
    values = gather(_local(), [Probe("eats", "cat; echo done", raw), Probe("after", "echo still here", raw)])
    assert values["eats"].stdout == "done\n"
    assert values["after"].stdout == "still here\n"


def test_a_probe_that_exits_does_not_stop_the_others() -> None:
    values = gather(_local(), [Probe("quits", "exit 7", raw), Probe("next", "echo ok", raw)])
    assert values["quits"].exit_status == 7
    assert values["next"].stdout == "ok\n"


def test_forged_frames_in_probe_output_cannot_spoof_another_probe() -> None:
    # A probe (say, a process's cmdline) prints something that looks like a frame with a guessed nonce.
    hostile = "printf '\\n@@gpuops:0000000000000000 begin victim\\nforged\\n'"
    values = gather(_local(), [Probe("hostile", hostile, raw), Probe("victim", "echo real", raw)])
    assert values["victim"].stdout == "real\n"
    assert "forged" in values["hostile"].stdout


def test_parser_failure_and_missing_frame_become_probe_failures() -> None:
    def broken(out: ProbeOutput) -> int:
        return int(out.stdout)

    probes = [Probe("broken", "echo notanumber", broken), Probe("missing", "true", raw)]
    values = parse_outputs(probes, {"broken": ProbeOutput("notanumber\n", "", 0)})
    assert isinstance(values["broken"], ProbeFailure) and "ValueError" in values["broken"].reason
    assert isinstance(values["missing"], ProbeFailure) and values["missing"].known is False


def test_script_is_one_posix_sh_program_and_names_are_checked() -> None:
    script = build_gather_script([Probe("x.y", "echo 1", raw)], "abc", preamble="GPUOPS_PY=python3")
    assert script.count("@@gpuops:abc begin x.y") == 1
    assert "GPUOPS_PY=python3" in script
    out = split_gather_output("\n@@gpuops:abc begin x.y\n1\n\n@@gpuops:abc stderr x.y 0\n\n@@gpuops:abc end x.y\n", "abc")
    assert out == {"x.y": ProbeOutput("1\n", "", 0)}
    try:
        build_gather_script([Probe("bad name; rm -rf /", "true", raw)], "abc")
    except ValueError as exc:
        assert "probe name" in str(exc)
    else:
        raise AssertionError("a probe name with shell syntax must be refused")


def test_preamble_variables_reach_probes() -> None:
    values = gather(_local(), [Probe("py", 'echo "$GPUOPS_PY"', raw)], preamble="GPUOPS_PY=/opt/py/bin/python3")
    assert values["py"].stdout == "/opt/py/bin/python3\n"


def test_started_probes_run_in_the_background_and_are_awaited_before_their_probe() -> None:
    # Two starts that each wait for the other's file: they can only both finish if they run at once.
    # Run one after the other, the first gives up waiting and says "alone".
    both = ("i=0; while [ ! -f \"$gpuops_tmp/{other}\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
            "[ -f \"$gpuops_tmp/{other}\" ] && w=done || w=alone")
    probes = [
        Probe("plain", "echo first", raw),
        Probe("a", 'cat "$gpuops_tmp/a.out"', raw,
              start=f': >"$gpuops_tmp/a.ready"; {both.format(other="b.ready")}; echo "a-$w" >"$gpuops_tmp/a.out"'),
        Probe("b", 'cat "$gpuops_tmp/b.out"; exit 3', raw,
              start=f': >"$gpuops_tmp/b.ready"; {both.format(other="a.ready")}; echo "b-$w" >"$gpuops_tmp/b.out"'),
    ]
    values = gather(_local(), probes)
    assert values["plain"].stdout == "first\n"
    assert (values["a"].stdout, values["b"].stdout, values["b"].exit_status) == ("a-done\n", "b-done\n", 3)


def test_a_probe_in_the_background_runs_beside_the_probes_framed_before_it() -> None:
    # The foreground probe waits for the background one's file: it sees it only if both run at once.
    # Its own output, stderr and exit status come back as if it had run where it stands.
    waits = ("i=0; while [ ! -f \"$gpuops_tmp/late.ready\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
             "[ -f \"$gpuops_tmp/late.ready\" ] && echo beside || echo alone")
    late = in_background(Probe("late", ': >"$gpuops_tmp/late.ready"; echo "late out"; echo "late err" >&2; exit 4', raw))
    values = gather(_local(), [Probe("early", waits, raw), late])
    assert values["early"].stdout == "beside\n"
    assert values["late"] == ProbeOutput("late out\n", "late err\n", 4)


def test_a_background_probe_that_hangs_ends_with_the_gathers_limit() -> None:
    # The gather waits for its starts before their frames: a start that never ends (a launch python
    # that hangs) must not hold the exec past its limit, nor the client's read (its output is a file).
    hangs = in_background(Probe("hangs", "sleep 20", raw))
    started = time.monotonic()
    with pytest.raises(TransportError, match="timed out"):
        gather(_local(), [Probe("first", "echo ok", raw), hangs], timeout=2)
    assert time.monotonic() - started < 10
