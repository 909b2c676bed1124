"""The all-reduce suite on CPUs (gloo, 2 ranks) through torchrun, the way it runs on a host.

Needs torch: the test python's own, else ``$GPUOPS_TORCH_PYTHON``, else the venv that
``~/.cache/gpuops/torch-venv`` holds; skipped (with the reason) when none has it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from gpuops.bench.options import AllreduceOptions, BenchOptions, expand_env_variants
from gpuops.bench.runner import BenchTarget, run_bench
from gpuops.bench.store import ResultsStore
from gpuops.inventory import Host
from gpuops.transport import ConnectOptions


def _has_torch(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# Run by the module's torch probe: gloo's presence first, then the PCIe IPC kernels' own checks
# (allreduce_bench.pcie_ipc_unavailable) with the host's torch, so that torch is imported once for
# both (an import of torch costs ~4 CPU-s).
PROBE = (
    "import sys, torch, torch.distributed as d\n"
    "assert d.is_gloo_available()\n"
    "print('gloo available')\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / 'src' / 'gpuops' / 'remote')!r})\n"
    "sys.argv = ['x']\n"
    "import allreduce_bench as b\n"
    "class D: type = 'cuda'\n"
    "print(b.pcie_ipc_unavailable(D(), 16, torch.bfloat16))\n"
    "print(b.pcie_ipc_unavailable(D(), 8, torch.float16))\n"
)


class TorchProbe(NamedTuple):
    python: str
    done: subprocess.CompletedProcess  # PROBE's run with that python


def probe_torch() -> TorchProbe | None:
    """The first candidate python whose torch has gloo, with PROBE's output from it."""
    candidates = [sys.executable, os.environ.get("GPUOPS_TORCH_PYTHON"),
                  str(Path.home() / ".cache" / "gpuops" / "torch-venv" / "bin" / "python")]
    for python in candidates:
        if not python or not Path(python).exists():
            continue
        try:
            done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.stdout.startswith("gloo available\n"):
            return TorchProbe(python, done)
    return None


def torch_python() -> str | None:
    """The python whose torch the all-reduce tests use (tests/integration/test_bench_remote too)."""
    probe = probe_torch()
    return probe.python if probe else None


@pytest.fixture(scope="module")
def torch_probe() -> TorchProbe:
    probe = probe_torch()
    if probe is None:
        pytest.skip("no python with torch (gloo) here: pip install torch, or set GPUOPS_TORCH_PYTHON")
    return probe


@pytest.fixture(scope="module")
def torch_py(torch_probe: TorchProbe) -> str:
    return torch_probe.python


def local_host(python: str) -> Host:
    from types import MappingProxyType

    return Host(name="cpu-host", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars=MappingProxyType({"sglang_python": python}))


GLOO_TOKENS = (1, 4, 8, 16, 64)


class GlooRun(NamedTuple):
    state: Any  # run_bench's HostState of the one host
    took: float  # seconds the launch took, start-up included


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory, torch_py: str) -> GlooRun:
    """One launch of the real worker (gloo, 2 ranks) that the tests below read: NCCL's (here gloo's)
    all-reduce at five sizes under an NCCL variant, then FlashInfer's PCIe IPC kernel and SGLang's
    custom all-reduce (--kernel nccl,pcie_ipc,custom), each skipped on CPUs. One launch for all of
    them, as a user's --kernel run is: each launch costs three imports of torch (torchrun, 2 ranks).
    Its duration is the hung-rank test's baseline."""
    from gpuops.bench.options import check_kernels

    options = BenchOptions(suite="allreduce", allreduce=AllreduceOptions(
        backend="gloo", world_size=2, hidden_size=7168, tokens=GLOO_TOKENS, iters=8, warmup=2, trials=3,
        env_variants=expand_env_variants(["NCCL_NVLS_ENABLE=0"]), kernels=check_kernels(["nccl,pcie_ipc", "custom"])))
    target = BenchTarget(local_host(torch_py), "http://127.0.0.1:9", sys.executable)
    started = time.monotonic()
    states = run_bench([target], options, ResultsStore(tmp_path_factory.mktemp("gloo")), ConnectOptions(),
                       remote=False)
    return GlooRun(states["cpu-host"], time.monotonic() - started)



def test_gloo_two_ranks_gives_sane_figures_at_every_size(gloo_run: GlooRun):
    state = gloo_run.state
    assert state.error is None, state.error
    rows = [r for r in state.result["allreduce"] if r["kernel"] == "nccl"]
    assert [r["tokens"] for r in rows] == list(GLOO_TOKENS)
    for row in rows:
        assert row["ok"] and row["world_size"] == 2 and row["backend"] == "gloo"
        assert row["bytes"] == 7168 * row["tokens"] * 2  # bf16 (or a 2-byte stand-in type)
        assert row["latency_us"] > 0 and row["busbw_gbps"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["bytes"] / (row["latency_us"] / 1e6) / 1e9, rel=1e-6)
        assert row["step_cost_ms"] == pytest.approx(row["latency_us"] * 122 / 1000)
        assert row["variant"] == {"NCCL_NVLS_ENABLE": "0"}
    summary = state.result["summary"]
    assert summary["best_variant"] == "NCCL_NVLS_ENABLE=0" and summary["world_size"] == 2
    assert state.file is not None and state.file.is_file()


def test_world_size_one_works(tmp_path: Path, torch_py: str):
    options = BenchOptions(suite="allreduce", allreduce=AllreduceOptions(
        backend="gloo", world_size=1, hidden_size=1024, tokens=(1, 8), iters=4, warmup=1, trials=2))
    target = BenchTarget(local_host(torch_py), "http://127.0.0.1:9", sys.executable)
    state = run_bench([target], options, ResultsStore(tmp_path), ConnectOptions(), remote=False)["cpu-host"]
    assert state.error is None, state.error
    rows = state.result["allreduce"]
    assert [r["tokens"] for r in rows] == [1, 8]
    assert all(r["ok"] and r["world_size"] == 1 and r["latency_us"] > 0 and r["busbw_gbps"] == 0 for r in rows)


def test_a_python_without_torch_fails_the_host_clearly(tmp_path: Path):
    # A fresh venv without site packages is torch-less on any machine: never a reason to skip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = str(tmp_path / "bare" / "bin" / "python")
    assert not _has_torch(bare)
    options = BenchOptions(suite="allreduce", allreduce=AllreduceOptions(backend="gloo", world_size=1, tokens=(1,)))
    target = BenchTarget(local_host(bare), "http://127.0.0.1:9", sys.executable)
    state = run_bench([target], options, ResultsStore(tmp_path), ConnectOptions(), remote=False)["cpu-host"]
    assert state.status == "failed"
    assert "torchrun exited" in state.error and "torch" in state.error


# A worker shaped like allreduce_bench.py that measures its first size, then, when the variant asks
# for it, leaves rank 1 asleep so rank 0 blocks in the next all-reduce: a hung collective.
BLOCKING_WORKER = r'''
import json, os, sys, time
import torch
import torch.distributed as dist

config = json.load(open(sys.argv[1]))
dist.init_process_group(backend="gloo")
rank = dist.get_rank()
with open(os.path.join(os.environ["GPUOPS_TEST_PIDS"], "%d-%d" % (rank, os.getpid())), "w"):
    pass
block = os.environ.get("GPUOPS_TEST_BLOCK") == "1"
for index, tokens in enumerate(config["tokens"]):
    if block and index == 1 and rank == 1:
        time.sleep(3600)
    t = torch.ones(8)
    dist.all_reduce(t)
    record = {"variant": config["variant"], "tokens": tokens, "ok": True, "latency_us": 1.0,
              "busbw_gbps": 1.0, "step_cost_ms": 0.1, "world_size": 2, "sum": float(t[0])}
    if rank == 0:
        sys.stdout.write("GPUOPS-BENCH %s allreduce %s\n" % (config["run_id"], json.dumps(record)))
        sys.stdout.flush()
dist.destroy_process_group()
'''


def test_a_hung_rank_is_killed_recorded_as_timed_out_and_the_next_variant_runs(tmp_path: Path, torch_py: str,
                                                                             gloo_run: GlooRun):
    """The watchdog's timeout is the payload's ``timeout_s``: short, so the test does not wait out the
    default (90 s), but never shorter than the hung launch needs to measure its first size. It is
    measured, not guessed: the module's launch of the real worker (2 ranks, more sizes and kernels
    than this worker measures) was timed in this run, and each launch here gets three times that (at
    least 5 s): twice was once too little for the launch without the hang, beside a whole run and
    promise_mutants (it timed out at 16 s).
    On a loaded machine both take longer together, so the hang is still found after the first size,
    never before it. The same worker without the hang runs as the next variant (checked below)."""
    import io

    from gpuops.bench.frames import parse_frames
    from gpuops.bench.suite_allreduce import allreduce_summary
    from gpuops.remote.bench_client import run
    from gpuops.remote.bench_frames import Emitter

    def launch(run_id: str, pids: Path, timeout_s: float, variants: list[dict[str, str]]) -> str:
        pids.mkdir()
        payload = {"run_id": run_id, "suite": "allreduce", "url": "http://127.0.0.1:9", "host_facts": False,
                   "record_file": str(tmp_path / run_id / "frames.txt"),
                   "allreduce": {"worker_source": BLOCKING_WORKER, "python": torch_py, "world_size": 2,
                                 "hidden_size": 8, "tokens": [1, 4], "backend": "gloo", "timeout_s": timeout_s,
                                 "variants": variants}}
        out = io.StringIO()
        os.environ["GPUOPS_TEST_PIDS"] = str(pids)
        try:
            run(payload, Emitter(run_id, stream=out))
        finally:
            del os.environ["GPUOPS_TEST_PIDS"]
        return out.getvalue()

    assert gloo_run.state.error is None, gloo_run.state.error
    timeout = float(round(max(5.0, 3.0 * gloo_run.took)))
    pids = tmp_path / "pids"
    keep = tmp_path / "hang1" / "frames.txt"
    text = launch("hang1", pids, timeout, [{"GPUOPS_TEST_BLOCK": "1"}, {"GPUOPS_TEST_BLOCK": "0"}])
    frames = parse_frames(text, "hang1")
    assert frames.end is not None and not frames.partial
    hung = [r for r in frames.allreduce if r["variant"] == {"GPUOPS_TEST_BLOCK": "1"}]
    assert [r["tokens"] for r in hung] == [1]  # measured before the hang: kept
    assert [e["message"] for e in frames.errors] == ["timed out after %.0f s (hung collective)" % timeout]
    assert frames.errors[0]["variant"] == {"GPUOPS_TEST_BLOCK": "1"} and frames.errors[0]["timed_out"]
    fine = [r for r in frames.allreduce if r["variant"] == {"GPUOPS_TEST_BLOCK": "0"}]
    assert [(r["tokens"], r["sum"]) for r in fine] == [(1, 2.0), (4, 2.0)]
    summary = allreduce_summary(frames.allreduce, frames.errors)
    by_label = {v["label"]: v for v in summary["variants"]}
    assert by_label["GPUOPS_TEST_BLOCK=1"]["timed_out"] and not by_label["GPUOPS_TEST_BLOCK=1"]["ok"]
    assert by_label["GPUOPS_TEST_BLOCK=0"]["ok"] and summary["best_variant"] == "GPUOPS_TEST_BLOCK=0"
    # every rank of the hung launch is gone (the whole process group was killed)
    ranks = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(ranks) == 4
    for pid in ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # the host kept its own copy of every frame
    kept = parse_frames(keep.read_text(), "hang1")
    assert kept.allreduce == frames.allreduce and kept.errors == frames.errors


def test_kernels_side_by_side_in_one_launch_each_skipped_with_its_reason_where_it_cannot_run(gloo_run: GlooRun):
    """--kernel nccl,pcie_ipc,custom: one launch measures NCCL's (here gloo's) all-reduce, then tries
    FlashInfer's PCIe IPC kernel and SGLang's custom all-reduce; on CPUs both are skipped at every
    size with a one-line reason (nothing timed), each under its own label, and the one that ran is
    ranked. Fails if the worker stops after the first kernel, or times a kernel it skipped."""
    state = gloo_run.state
    rows = state.result["allreduce"]
    assert [(r["kernel"], r["tokens"]) for r in rows] == [(kernel, tokens) for kernel in ("nccl", "pcie_ipc", "custom")
                                                         for tokens in GLOO_TOKENS]
    assert all(r["ok"] and r["latency_us"] > 0 for r in rows if r["kernel"] == "nccl")
    reasons = {"pcie_ipc": "skipped: the PCIe IPC kernels run on CUDA GPUs only (this run is on cpu)",
               "custom": "skipped: SGLang's custom all-reduce runs on CUDA GPUs only (this run is on cpu)"}
    for row in rows:
        if row["kernel"] != "nccl":
            assert not row["ok"] and row["skipped"] and "latency_us" not in row
            assert row["error"] == reasons[row["kernel"]]
    summary = state.result["summary"]
    variants = {v["label"]: v for v in summary["variants"]}
    assert set(variants) == {"NCCL_NVLS_ENABLE=0", "FlashInfer PCIe IPC: NCCL_NVLS_ENABLE=0",
                             "SGLang custom all-reduce: NCCL_NVLS_ENABLE=0"}
    assert variants["NCCL_NVLS_ENABLE=0"]["ok"] and variants["NCCL_NVLS_ENABLE=0"]["kernel"] == "nccl"
    assert not variants["SGLang custom all-reduce: NCCL_NVLS_ENABLE=0"]["ok"]
    assert "run on CUDA GPUs only" in variants["FlashInfer PCIe IPC: NCCL_NVLS_ENABLE=0"]["error"]
    assert summary["best_variant"] == "NCCL_NVLS_ENABLE=0"


def test_kernel_names_are_checked_before_anything_runs() -> None:
    from gpuops.bench.options import check_kernels
    from gpuops.errors import GpuopsError

    assert check_kernels(()) == ("nccl",) and check_kernels(["custom", "nccl,custom"]) == ("custom", "nccl")
    with pytest.raises(GpuopsError, match="--kernel 'pcie' is not one of nccl, pcie_ipc, custom"):
        check_kernels(["nccl,pcie"])


def test_pcie_ipc_reasons_for_world_size_and_dtype(torch_probe: TorchProbe):
    """The worker's own checks, run with the host's torch (by the module's probe, PROBE): a world size
    it does not serve, a dtype SGLang does not hand it."""
    done = torch_probe.done
    assert done.returncode == 0, done.stderr
    world, dtype = done.stdout.splitlines()[1:3]
    assert world == "world size 16: the PCIe IPC kernels serve 2, 4 or 8 ranks"
    assert dtype == "float16: SGLang hands only bf16 all-reduces to the PCIe IPC kernels"
