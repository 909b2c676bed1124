"""The all-reduce suite on CPUs (gloo, 2 ranks) through torchrun, the way it runs on a host.

Needs torch: the test python's own, else ``$GPUOPS_TORCH_PYTHON``, else the venv that
``~/.cache/gpuops/torch-venv`` holds; skipped (with the reason) when none has it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def torch_python() -> str | None:
    candidates = [sys.executable, os.environ.get("GPUOPS_TORCH_PYTHON"),
                  str(Path.home() / ".cache" / "gpuops" / "torch-venv" / "bin" / "python")]
    for python in candidates:
        if python and Path(python).exists() and _has_torch(python):
            return python
    return None


@pytest.fixture(scope="module")
def torch_py() -> str:
    python = torch_python()
    if python is None:
        pytest.skip("no python with torch (gloo) here: pip install torch, or set GPUOPS_TORCH_PYTHON")
    return python


def local_host(python: str) -> Host:
    from types import MappingProxyType

    return Host(name="cpu-host", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars=MappingProxyType({"sglang_python": python}))


def test_gloo_two_ranks_gives_sane_figures_at_every_size(tmp_path: Path, torch_py: str):
    tokens = (1, 4, 8, 16, 64)
    options = BenchOptions(suite="allreduce", allreduce=AllreduceOptions(
        backend="gloo", world_size=2, hidden_size=7168, tokens=tokens, iters=8, warmup=2, trials=3,
        env_variants=expand_env_variants(["NCCL_NVLS_ENABLE=0"])))
    target = BenchTarget(local_host(torch_py), "http://127.0.0.1:9", sys.executable)
    states = run_bench([target], options, ResultsStore(tmp_path), ConnectOptions(), remote=False)
    state = states["cpu-host"]
    assert state.error is None, state.error
    rows = state.result["allreduce"]
    assert [r["tokens"] for r in rows] == list(tokens)
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
