"""The lease alone: a client that stops answering (a laptop suspended, SIGSTOP) with its connection
still open. Nothing on the host sees a closed channel; only the lease lapsing can tell the worker,
which then rolls the host back by itself, while the client is still stopped.

(test_apply_faults.py kills things, which closes channels, and its stalled-host test passes
--timeout, whose host-side deadline rolls back too; this is the case only the lease covers.)
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from test_apply_faults import LEASE, calls, client, fingerprint, journal_events, lab_args, paused, server_view

pytestmark = pytest.mark.integration


def test_a_stopped_client_lets_the_lease_lapse_and_the_host_rolls_back_alone(lab_factory, gpuops_home) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None)
    host = lab.hosts[0]
    before, served = fingerprint(host.dir), server_view(host)
    pause_s = 90  # the worker waits this long at "health" unless the lease lapses first
    (host.state_dir / "lab-fault.json").write_text(json.dumps({"pause_at": "health", "seconds": pause_s}))
    earlier = calls(host)
    proc = client(lab, "nccl-env", *lab_args("nccl-env", 21), "--json", home=gpuops_home)
    paused(host, "health", proc, earlier)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        # Well before the pause would end on its own: only the lease (LEASE s) can end it this soon.
        deadline = time.monotonic() + pause_s / 2
        while journal_events(host)[-1][1] != "rolled_back":
            assert time.monotonic() < deadline, (f"no rollback within {pause_s / 2:.0f} s of a {LEASE} s lease",
                                                 journal_events(host))
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert fingerprint(host.dir) == before
    assert server_view(host) == served
