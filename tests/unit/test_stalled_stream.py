"""A transaction channel to a host that stopped reading (its SSH session stalled: sshd stopped)
never holds gpuops past its limit (issue 42). Real processes stand for the stalled host: a command
that never reads its stdin, so a send of more than the pipe holds blocks for good, as a send on
paramiko's transport to a stopped sshd does (its write lock held, retried forever).

Before: ``Stream.close`` waited for the send lock such a send holds, for good; and
``run_transaction`` sent the helper's body from its own thread with no deadline over it, so
``apply --timeout`` never got to look at the clock.
"""

from __future__ import annotations

import threading
import time

from gpuops.apply.txn import run_transaction
from gpuops.inventory.model import Host
from gpuops.transport.local import LocalConnection
from gpuops.transport.stream import CLOSE_WAIT_S, ProcessStream

STALLED = "exec sleep 600"  # never reads its stdin
BIG = b"x" * (4 * 1024 * 1024)  # far more than a pipe holds


def _host() -> Host:
    return Host(name="stalled", address=None, port=None, user=None, key_file=None, connection="local", groups=("all",))


def test_close_returns_although_a_send_is_blocked_for_good() -> None:
    stream = ProcessStream(["/bin/sh", "-c", STALLED], "stalled")
    sender = threading.Thread(target=stream.send, args=(BIG,), daemon=True)
    sender.start()
    time.sleep(0.2)  # the send is blocked on the full pipe, holding the send lock
    closer = threading.Thread(target=stream.close, daemon=True)
    closer.start()
    closer.join(CLOSE_WAIT_S * 3 + 5)
    assert not closer.is_alive(), "close() waited for a send that never ends"
    sender.join(10)
    assert not sender.is_alive(), "the blocked send did not end once the stream was aborted"
    assert stream.proc.wait(10) is not None  # the process behind it is gone
    assert stream.send(b"more") is False


def test_a_transaction_whose_host_never_reads_ends_at_its_deadline() -> None:
    conn = LocalConnection(_host())
    outcome: list[dict] = []
    limit = 3.0
    runner = threading.Thread(target=lambda: outcome.append(run_transaction(
        conn, STALLED, BIG, lease_s=30, deadline=time.monotonic() + limit, run_id="r1")), daemon=True)
    runner.start()
    runner.join(limit + CLOSE_WAIT_S * 3 + 10)
    assert not runner.is_alive(), "the transaction outlived its deadline by far"
    assert outcome[0]["status"] == "unknown", outcome
    assert "did not finish within --timeout" in outcome[0]["error"], outcome
