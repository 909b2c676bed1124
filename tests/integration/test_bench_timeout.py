"""`gpuops bench --remote --timeout`: a host that stalls fails alone, named, within its time, as with
apply's --timeout; the other hosts' results come home (real sshd, the lab)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FAST = {"GPUOPS_STANDIN_TOKENS_PER_S": "2000", "GPUOPS_STANDIN_TTFT_MS": "5"}
BENCH = ["--num-requests", "1", "--warmup", "0", "--input-len", "8", "--output-len", "8"]


def test_a_stalled_host_fails_alone_named_within_timeout(lab_factory, run_gpuops, tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=2, server_env=FAST)
    stalled = lab.host("h02")
    server = int((stalled.state_dir / "sglang.pid").read_text())
    os.kill(server, signal.SIGSTOP)  # it still accepts connections (the kernel does) but never answers
    try:
        # Without --timeout the client would wait for its request (--request-timeout, 600 s); the
        # subprocess limit is only the generous upper bound that turns a hang into a failure.
        done = run_gpuops("bench", "decode", "--remote", "-i", str(lab.inventory_path), "--timeout", "15", "--json",
                          "--results-dir", str(tmp_path / "results"), *BENCH, timeout=150)
    finally:
        os.kill(server, signal.SIGCONT)
    assert done.returncode == 1, done.stdout + done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert hosts["h01"]["ok"] is True and hosts["h01"]["error"] is None, hosts["h01"]
    assert hosts["h02"]["ok"] is False and "timed out" in hosts["h02"]["error"], hosts["h02"]
    assert hosts["h02"]["result_file"] is None


def test_bench_takes_timeout_like_the_other_host_commands(run_gpuops) -> None:
    for args in (["bench", "decode", "--help"], ["bench", "--help"], ["apply", "--help"]):
        text = run_gpuops(*args).stdout
        assert "--timeout SECONDS" in text and "--connect-timeout SECONDS" in text, args
    refused = run_gpuops("bench", "decode", "--remote", "--timeout", "0")
    assert refused.returncode == 2 and "--timeout" in refused.stderr
