"""The lease is judged on the host's monotonic clock, never the wall clock against a file time
(issue 42): a state dir on NFS or a clock step puts the host's clock and the file system's apart,
and +1 h lapsed every lease at once while -1 h turned it off.

The relay (``apply_helper.Relay``) stamps the lease for each message from gpuops; the worker's
``Lease`` reads the stamp against its own ``time.monotonic()``. The file's mtime is moved by an hour
either way (``os.utime``) and must change nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuops.remote.apply_helper import Relay
from gpuops.remote.apply_lease import Lease

HOUR = 3600.0
REMOTE = Path(__file__).resolve().parents[2] / "src" / "gpuops" / "remote"


def _skew(path: Path, seconds: float) -> None:
    when = time.time() + seconds
    os.utime(path, (when, when))


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["file-time-+1h", "file-time--1h"])
def test_a_fresh_heartbeat_holds_the_lease_whatever_the_file_time(tmp_path, skew: float) -> None:
    relay = Relay(str(tmp_path))
    lease = Lease(str(tmp_path), 30)
    for _ in range(3):  # each message from gpuops, then the file system's clock an hour off
        relay.touch_lease()
        _skew(tmp_path / "lease", skew)
        assert lease.lapsed() is None
        lease.check("at health")  # raises when lapsed


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["file-time-+1h", "file-time--1h"])
def test_without_heartbeats_the_lease_lapses_whatever_the_file_time(tmp_path, skew: float) -> None:
    """The other half: a file time an hour ahead (the host's clock stepped back) must not turn the
    lease off. The wait is bounded by the lease (0.3 s) with room, not timed."""
    relay = Relay(str(tmp_path))
    lease = Lease(str(tmp_path), 0.3)
    relay.touch_lease()
    give_up = time.monotonic() + 30
    while lease.lapsed() is None:
        _skew(tmp_path / "lease", skew)
        assert time.monotonic() < give_up, "the lease never lapsed without heartbeats"
        time.sleep(0.05)
    assert "gpuops stopped confirming" in (lease.lapsed() or "")


def test_a_beat_read_while_the_worker_was_busy_counts_from_when_the_relay_heard_it(tmp_path) -> None:
    """The stamp is the moment the relay heard gpuops, not the moment the worker looked: a worker
    busy past the lease still sees that gpuops went quiet long ago."""
    relay = Relay(str(tmp_path))
    lease = Lease(str(tmp_path), 0.3)
    relay.touch_lease()
    heard = time.monotonic()
    while time.monotonic() - heard < 0.5:  # the worker was busy meanwhile, reading nothing
        time.sleep(0.05)
    assert lease.lapsed() is not None


def test_a_torn_or_missing_stamp_keeps_the_last_one_read(tmp_path) -> None:
    relay = Relay(str(tmp_path))
    lease = Lease(str(tmp_path), 30)
    relay.touch_lease()
    assert lease.lapsed() is None
    (tmp_path / "lease").write_bytes(b"12")  # caught half-written: not a stamp
    (tmp_path / "lease").write_bytes(b"not a stamp")
    assert lease.lapsed() is None
    os.unlink(tmp_path / "lease")
    assert lease.lapsed() is None


def test_no_lease_file_before_any_beat_is_a_lapsed_lease(tmp_path) -> None:
    assert "gpuops stopped confirming" in (Lease(str(tmp_path), 30).lapsed() or "")


def test_no_file_time_is_read_anywhere_in_the_transaction() -> None:
    """Every host module of the apply transaction (``apply_*``): no mtime is read, so none can be
    compared with a clock."""
    for path in sorted(REMOTE.glob("apply_*.py")):
        text = path.read_text()
        for needle in ("st_mtime", "getmtime", "st_ctime", "st_atime"):
            assert needle not in text, f"{path.name} reads a file time ({needle})"
