"""The host keeps a confirmation gpuops sent even when the channel closed right after it: the
worker reads its inbox before it judges the lease (remote/apply_lease.py)."""

from __future__ import annotations

import os
import time

import pytest

from gpuops.remote.apply_common import LeaseLapsed
from gpuops.remote.apply_lease import Lease, note_beat


def _call_dir(tmp_path, inbox: str):
    note_beat(str(tmp_path / "lease"))
    old = time.time() - 120
    os.utime(tmp_path / "lease", (old, old))  # an old file time: not what the lease reads
    (tmp_path / "client_gone").write_bytes(b"")  # and the channel closed
    (tmp_path / "inbox.jsonl").write_text(inbox)
    return str(tmp_path)


def test_a_commit_in_the_inbox_is_taken_although_the_client_is_gone(tmp_path):
    lease = Lease(_call_dir(tmp_path, '{"commit": true}\n'), 30)
    assert lease.wait_message("commit", "while waiting for gpuops to confirm") == {"commit": True}


def test_without_a_commit_a_gone_client_still_means_roll_back(tmp_path):
    lease = Lease(_call_dir(tmp_path, '{"verdict": true}\n'), 30)
    with pytest.raises(LeaseLapsed, match="the connection to gpuops was lost"):
        lease.wait_message("commit", "while waiting for gpuops to confirm")
