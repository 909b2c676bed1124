"""`gpuops profile` as a user types it, against the stand-in (its profiler serves /start_profile
and /stop_profile as SGLang does and writes a SIMULATED trace from its speed model): the operator's
sentence, the stored result that compare, export and report read, and one clear line for a server
that never writes its trace or refuses a second start; each time the server still serves and no
profile directory is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpuops.lab.standin_process import start_standin

KIMI_TP8 = ("--model-path", "/models/Kimi-K2.5", "--tp", "8")


def _profile(root: Path, url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``gpuops profile --url URL ARGS`` with a TMPDIR of its own (where the client makes its dir)."""
    tmp = root / "tmpdir"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "GPUOPS_INVENTORY"}
    env["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "gpuops.cli", "profile", "--url", url, *args], capture_output=True,
                          text=True, cwd=root, env=env, timeout=timeout)


def _left_behind(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "tmpdir").iterdir())


def _serving(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=5) as reply:
        return reply.status == 200


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, list[dict]]:
    """Two profiles of a TP 8 stand-in: NCCL's all-reduce, then FlashInfer's fused all-reduce+RMSNorm
    (the lab's PCIe IPC case, a release change, is tests/integration/test_profile_lab.py's)."""
    root = tmp_path_factory.mktemp("profile")
    hosts = []
    for flags in (KIMI_TP8, KIMI_TP8 + ("--enable-flashinfer-allreduce-fusion",)):
        with start_standin(root / "logs", flags, {"GPUOPS_STANDIN_TTFT_MS": "5"}) as server:
            done = _profile(root, server.url, "--steps", "3", "--json", "--fetch-traces")
            assert done.returncode == 0, done.stdout + done.stderr
            assert _serving(server.url) and _left_behind(root) == []
        hosts.append(json.loads(done.stdout)["hosts"]["localhost"])
    return root, hosts


def test_the_sentence_and_the_stored_summary(profiled) -> None:
    root, (nccl, _) = profiled
    assert nccl["ok"] and nccl["simulated"]
    assert nccl["sentence"].startswith("decode pass ") and "122 all-reduce calls per decode pass" in nccl["sentence"]
    assert "NCCL RING_LL" in nccl["sentence"] and "SIMULATED" in nccl["sentence"]
    stored = json.loads((root / nccl["result_file"]).read_text())
    assert stored["suite"] == "profile" and stored["fingerprint"] and stored["server"]["simulated"]
    decode = stored["summary"]["stages"]["DECODE"]
    assert decode["passes"] == 3 and [r["rank"] for r in decode["ranks"]] == list(range(8))
    assert decode["groups"]["allreduce"]["calls_per_forward"] == 122
    # the stand-in's model says what a pass costs: its trace is that, kernel by kernel
    step = stored["server"]["speed_model"]["steps"][0]
    assert decode["groups"]["allreduce"]["ms_per_forward"] == pytest.approx(step["allreduces"] * step["allreduce_us"] / 1000,
                                                                            rel=1e-3)
    kept = nccl["trace_files"]
    assert len(kept) == 16 and all((root / k["path"]).is_file() for k in kept)  # 8 ranks, EXTEND and DECODE


def test_after_the_fusion_the_share_falls(profiled) -> None:
    _, (nccl, fused) = profiled
    before, after = (h["summary"]["headline"] for h in (nccl, fused))
    assert after["allreduce_calls_per_forward"] == 122
    assert after["allreduce_kind"] == "fused all-reduce+RMSNorm (FlashInfer)"
    assert after["allreduce_share"] < before["allreduce_share"] - 0.1  # 63% -> 49% in the speed model
    assert after["wall_ms"] < before["wall_ms"]


def test_compare_export_and_report_read_profiles(profiled) -> None:
    from labtools import gpuops_cli as gpuops

    root, (nccl, pcie) = profiled
    compared = gpuops("results", "compare", nccl["result_id"], pcie["result_id"], "--json", cwd=root)
    assert compared.returncode == 0, compared.stderr
    metrics = {m["name"]: m for m in json.loads(compared.stdout)["metrics"]}
    assert "decode all-reduce share" in metrics and "decode all-reduce" in metrics
    assert "enable_flashinfer_allreduce_fusion" in compared.stdout
    exported = gpuops("results", "export", nccl["result_id"], "--format", "csv", cwd=root)
    assert exported.returncode == 0 and "allreduce_ms_per_forward" in exported.stdout.splitlines()[0]
    report = gpuops("report", nccl["result_id"], pcie["result_id"], "-o", "r.html", cwd=root)
    assert report.returncode == 0, report.stderr
    html = (root / "r.html").read_text()
    assert "Forward pass time by kernel group" in html and html.count("data:image/png;base64,") >= 1


def test_the_json_schema_names_every_key(profiled) -> None:
    """docs/profile.md documents every key `gpuops profile --json` prints."""
    _, (nccl, _) = profiled
    doc = (Path(__file__).resolve().parents[2] / "docs" / "profile.md").read_text()
    summary = nccl["summary"]
    stage = summary["stages"]["DECODE"]
    keys = (set(nccl) | set(summary) | set(summary["headline"]) | set(stage) | set(stage["groups"])
            | set(stage["groups"]["allreduce"]) | set(stage["collectives"][0]) | set(stage["top_kernels"][0])
            | set(stage["ranks"][0]) | set(summary["traces"][0]) | set(nccl["trace_files"][0]))
    missing = sorted(k for k in keys if f"`{k}`" not in doc and f"`summary.{k}`" not in doc)
    assert not missing, missing


def test_a_server_that_never_writes_its_trace_is_one_line(tmp_path: Path) -> None:
    with start_standin(tmp_path / "logs", KIMI_TP8, {"GPUOPS_STANDIN_TTFT_MS": "5",
                                                     "GPUOPS_STANDIN_PROFILE_WRITES": "0"}) as server:
        done = _profile(tmp_path, server.url, "--steps", "2", "--trace-wait", "3", "--json")
        assert _serving(server.url)
    assert done.returncode == 1 and _left_behind(tmp_path) == []
    line = json.loads(done.stdout)["hosts"]["localhost"]
    assert not line["ok"] and "the server wrote no trace in 3 s" in line["error"] and "\n" not in line["error"]


def test_a_profiler_already_running_is_one_line(tmp_path: Path) -> None:
    with start_standin(tmp_path / "logs", KIMI_TP8, {"GPUOPS_STANDIN_TTFT_MS": "5"}) as server:
        request = urllib.request.Request(server.url + "/start_profile", method="POST", data=json.dumps(
            {"output_dir": str(tmp_path / "theirs"), "num_steps": 50, "profile_by_stage": True}).encode())
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 200
        done = _profile(tmp_path, server.url, "--steps", "2")
        assert _serving(server.url)
    assert done.returncode == 1 and _left_behind(tmp_path) == []
    assert "refused to start its profiler (HTTP 500" in done.stdout and "SGLang refuses a second start" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
