"""Real collectives in a real torch profiler trace, made at test time on the CPU: two gloo processes
all-reduce four times in each of three ``step[DECODE bs=1]`` spans (SGLang's pass annotation), and
rank 0's Chrome trace, read as gpuops reads a host's traces, says 4 all-reduce calls per pass, each
timed by gloo's own record of it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuops.remote.profile_summary import summarize_trace

pytestmark = pytest.mark.integration

PASSES, CALLS = 3, 4
WORKERS = textwrap.dedent(f"""
    import os, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch.profiler import ProfilerActivity, profile, record_function

    def worker(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        x = torch.ones(4096)
        dist.all_reduce(x)  # connected before the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range({PASSES}):
                with record_function("step[DECODE bs=1]"):
                    for _ in range({CALLS}):
                        dist.all_reduce(x)
        if rank == 0:
            prof.export_chrome_trace(out)
        dist.destroy_process_group()

    if __name__ == "__main__":
        sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
        mp.spawn(worker, args=(port, sys.argv[1]), nprocs=2)
""")


def test_a_real_gloo_all_reduce_is_found_counted_per_pass_and_timed(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="no python with torch")
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    trace = tmp_path / "gloo-TP-0.trace.json"
    done = subprocess.run([sys.executable, str(script), str(trace)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = summarize_trace(str(trace), steps=PASSES)
    stage = summary["stages"]["DECODE"]
    allreduce = stage["groups"]["allreduce"]
    assert stage["passes"] == PASSES and allreduce["calls_per_forward"] == CALLS
    assert stage["collectives"][0]["kind"] == "gloo (CPU)"
    # by another route: gloo's own records of each all-reduce, inside each span, summed
    events = json.load(open(trace))["traceEvents"]
    spans = [e for e in events if e.get("name") == "step[DECODE bs=1]"]
    runs = [e for e in events if e.get("name") == "gloo:all_reduce"]
    per_pass = [sum(r["dur"] for r in runs if s["ts"] <= r["ts"] <= s["ts"] + s["dur"]) / 1000.0 for s in spans]
    assert allreduce["ms_per_forward"] == pytest.approx(statistics.mean(per_pass), abs=1e-3)
