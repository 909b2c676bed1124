"""A commit the host acknowledges: a slow first answer or a frozen client never throws a healthy
change away while telling the operator the opposite.

The restarted stand-in takes longer than the lease to give its first answer (a real server
compiling kernels on first use); gpuops' smoke check waits on it while its heartbeat keeps the
lease, then confirms, and reports exactly what the host journaled. The lease is short here
(``gpuops_lease=5``) so that "longer than the lease" stays cheap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

FIRST_ANSWER_S = 12
CHANGE = ("-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}}', "-e", "smoke_check=true", "-e", "gpuops_lease=5",
          "-e", "gpuops_stop_grace=5")


def _warm(lab) -> None:
    """Spend the lab server's own slow first answer now (its request is left to finish alone)."""
    host = lab.host("h01")

    def ask() -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{host.server_port}/generate",
                                         data=b'{"text": "x", "sampling_params": {"max_new_tokens": 1}}')
        try:
            urllib.request.urlopen(request, timeout=FIRST_ANSWER_S + 5).read()
        except OSError:
            pass

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(FIRST_ANSWER_S + 6)


def _journal(lab, run_id: str) -> list[str]:
    path = lab.host("h01").state_dir / "journal.jsonl"
    return [r["event"] for r in map(json.loads, path.read_text().splitlines()) if r.get("run_id") == run_id]


@pytest.fixture
def slow_lab(lab_factory):
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(names=("h01",), server_env={"GPUOPS_STANDIN_FIRST_ANSWER_S": str(FIRST_ANSWER_S)}))
    _warm(lab)
    return lab


def test_a_first_answer_slower_than_the_lease_commits_and_says_so(slow_lab, run_gpuops) -> None:
    started = time.monotonic()
    done = run_gpuops("apply", "nccl-env", "-i", str(slow_lab.inventory_path), "--json", *CHANGE, timeout=300)
    took = time.monotonic() - started
    report = json.loads(done.stdout)["hosts"]["h01"]
    assert took > FIRST_ANSWER_S, "the smoke check did wait for the first answer"
    assert report["status"] == "finished" and report["ok"], report
    assert done.returncode == 0, done.stderr
    assert _journal(slow_lab, report["run_id"])[-1] == "finished"
    assert "most likely" not in done.stdout + done.stderr


def test_a_smoke_limit_below_the_first_answer_rolls_back_and_says_so(slow_lab, run_gpuops) -> None:
    done = run_gpuops("apply", "nccl-env", "-i", str(slow_lab.inventory_path), "--json", *CHANGE,
                      "-e", "gpuops_smoke_timeout=3", timeout=300)
    report = json.loads(done.stdout)["hosts"]["h01"]
    assert report["status"] == "rolled_back" and not report["ok"], report
    assert "gpuops_smoke_timeout=3" in report["error"], report["error"]
    assert done.returncode == 1
    assert _journal(slow_lab, report["run_id"])[-1] == "rolled_back"


def test_a_client_frozen_past_the_lease_at_the_confirm_step_is_told_the_host_rolled_back(
        slow_lab, gpuops_home, run_gpuops) -> None:
    """SIGSTOP while the smoke check waits (the heartbeat thread stops too): the host rolls back when
    the lease lapses; the client, once it runs again, reports the host's outcome, not a guess."""
    from gpuops.lab.sglang_cache import cache_root

    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "GPUOPS_LAB_DIR")}
    env.update(HOME=str(gpuops_home), GPUOPS_CACHE=str(cache_root().parent))
    proc = subprocess.Popen([sys.executable, "-m", "gpuops.cli", "apply", "nccl-env", "-i",
                             str(slow_lab.inventory_path), "--json", *CHANGE], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = slow_lab.host("h01").state_dir
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the worker has sent "verified": the client is in its smoke check
        if any('"verified"' in p.read_text() for p in progress.rglob("progress.jsonl")):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the run never reached the confirm step")
    proc.send_signal(signal.SIGSTOP)
    time.sleep(12)  # past the 5 s lease
    proc.send_signal(signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=200)
    report = json.loads(stdout)["hosts"]["h01"]
    events = _journal(slow_lab, report["run_id"])
    assert events[-1] == "rolled_back", events
    assert report["status"] == "rolled_back" and proc.returncode == 1, (report, stderr)
    assert "most likely" not in stdout + stderr
