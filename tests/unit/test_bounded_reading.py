"""Bounded reading: nothing a host sends can take the operator's machine to unbounded memory.

Real processes (``/bin/sh``) stand in for the host here; the same limits over real sshd (both
transports) are in tests/integration/test_bounded_output.py.
"""

from __future__ import annotations

import time

import pytest

from gpuops.gather import Probe, ProbeFailure, ProbeOutput, gather
from gpuops.inventory import Host
from gpuops.transport.limits import EXEC_OUTPUT_LIMIT, MiB, OutputOverLimit, run_bounded
from gpuops.transport.local import LocalConnection


def _host() -> Host:
    return Host(name="h01", address=None, port=None, user=None, key_file=None, connection="local", groups=(), vars={})


def _raw(out: ProbeOutput) -> ProbeOutput:
    return out


def _printing(name: str, size: int, limit: int | None = None) -> Probe[ProbeOutput]:
    script = f"head -c {size} /dev/zero | tr '\\0' x; echo; echo on stderr >&2; exit 3"
    return Probe(name, script, _raw) if limit is None else Probe(name, script, _raw, output_limit=limit)


def test_a_probe_over_its_limit_fails_alone_and_the_others_parse():
    conn = LocalConnection(_host())
    values = gather(conn, [_printing("big", 10 * 1000 * 1000), _printing("small", 10),
                           _printing("declared", 5 * MiB, limit=8 * MiB)])
    assert isinstance(values["big"], ProbeFailure) and values["big"].reason == "output over 4 MiB (probe big)"
    small = values["small"]
    assert isinstance(small, ProbeOutput)
    assert (small.stdout, small.stderr.strip(), small.exit_status) == ("x" * 10 + "\n", "on stderr", 3)
    assert isinstance(values["declared"], ProbeOutput) and len(values["declared"].stdout) == 5 * MiB + 1


def test_the_host_cuts_a_runaway_probe_so_the_exec_stays_small():
    """An endless probe ends (head closes its pipe) and sends one byte past its limit, not more."""
    conn = LocalConnection(_host())
    started = time.monotonic()
    values = gather(conn, [Probe("endless", "yes", _raw), _printing("after", 3)], timeout=60)
    assert time.monotonic() - started < 30
    assert isinstance(values["endless"], ProbeFailure) and "output over 4 MiB" in values["endless"].reason
    assert isinstance(values["after"], ProbeOutput) and values["after"].stdout == "xxx\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_command_over_the_exec_limit_is_stopped(stream):
    redirect = "" if stream == "stdout" else " >&2"
    started = time.monotonic()
    with pytest.raises(OutputOverLimit, match="output over 1 MiB"):
        run_bounded(["/bin/sh", "-c", f"yes{redirect}"], b"", timeout=60, limit=1 * MiB)
    assert time.monotonic() - started < 20, "the endless command was stopped, not waited for"


def test_run_bounded_is_subprocess_run_below_the_limit():
    out, err, status = run_bounded(["/bin/sh", "-c", "cat; echo e >&2; exit 4"], b"in" * 100000, timeout=30)
    assert (out, err, status) == (b"in" * 100000, b"e\n", 4)


def test_the_local_transport_fails_the_host_past_64_mib():
    from gpuops.errors import TransportError

    conn = LocalConnection(_host())
    with pytest.raises(TransportError, match=r"h01: output over 64 MiB from one command"):
        conn.run(f"head -c {EXEC_OUTPUT_LIMIT + 1} /dev/zero", timeout=60)
    assert conn.run(f"head -c {EXEC_OUTPUT_LIMIT} /dev/zero", timeout=60).stdout == b"\0" * EXEC_OUTPUT_LIMIT


def test_a_stream_line_without_end_ends_the_stream():
    from gpuops.transport.limits import STREAM_LINE_LIMIT
    from gpuops.transport.stream import ProcessStream

    stream = ProcessStream(["/bin/sh", "-c", "echo first; yes | tr -d '\\n'"], "h01")
    try:
        assert stream.readline(10) == b"first\n"
        assert stream.readline(30) == b"", "the stream ends instead of holding a line without end"
        assert f"output over {STREAM_LINE_LIMIT // MiB} MiB" in stream.stderr_text()
    finally:
        stream.close()
