"""`gpuops bench --remote` over real sshd (the lab): results come home, compare and report them, and
Ctrl-C stops the remote clients and keeps what they measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# The field report's server (see shared fixtures host.yaml), without and with the fusion flag.
BASE_ARGS = ("--model-path", "/models/Kimi-K2.5", "--tp", "8", "--trust-remote-code",
             "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3",
             "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
FUSED_ARGS = BASE_ARGS + ("--enable-flashinfer-allreduce-fusion",)


@pytest.fixture(scope="module")
def story_lab(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(LabSpec(names=("base",), server_args=BASE_ARGS, server_env={"GPUOPS_STANDIN_TTFT_MS": "20"}),
                       LabSpec(names=("fused",), server_args=FUSED_ARGS, server_env={"GPUOPS_STANDIN_TTFT_MS": "20"}))


def test_decode_results_come_home_and_compare(story_lab, run_gpuops, tmp_path: Path):
    results = tmp_path / "results"
    done = run_gpuops("bench", "--remote", "-i", str(story_lab.inventory_path), "--suite", "decode",
                      "--output-len", "40", "--num-requests", "2", "--warmup", "1", "--json",
                      "--results-dir", str(results))
    assert done.returncode == 0, done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert set(hosts) == {"base", "fused"}
    for line in hosts.values():
        assert line["ok"] and line["simulated"] and line["error"] is None
        assert Path(line["result_file"]).is_file()
    # the stand-in's speed model (speed_model.json's documented predictions for the field report's
    # shape): EAGLE-3 60.0 tok/s (the report's figure), 94.3 with fusion (an assumed factor)
    assert hosts["base"]["output_tokens_per_s"] == pytest.approx(60.0, rel=0.1)
    assert hosts["fused"]["output_tokens_per_s"] == pytest.approx(94.3, rel=0.1)
    assert hosts["base"]["speed_model"] == hosts["fused"]["speed_model"] == "rtx-pro-6000-pcie-x8 v2"
    stored = json.loads(Path(hosts["base"]["result_file"]).read_text())
    assert stored["server"]["simulated"] is True and stored["server"]["speed_model"]["basis"] == "calibrated"
    assert stored["server"]["speed_model"]["predicted_tokens_per_s"] == pytest.approx(60.0, abs=0.01)
    assert stored["host_facts"]["gpus"][0]["compute_cap"] == "12.0"  # the lab's replayed nvidia-smi
    assert stored["configuration"]["env"] == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}
    assert stored["configuration"]["sglang_version"] == "0.5.8"
    assert stored["host_facts"]["packages"]["flashinfer-python"] == "0.6.1"  # as the server's python sees it
    assert "--speculative-num-draft-tokens" in stored["server"]["process_cmdline"]  # host /proc, via the pid file

    listed = run_gpuops("results", "list", "--json", "--results-dir", str(results))
    assert {r["id"] for r in json.loads(listed.stdout)["results"]} == {h["result_id"] for h in hosts.values()}
    compared = run_gpuops("results", "compare", hosts["base"]["result_id"], hosts["fused"]["result_id"],
                          "--json", "--results-dir", str(results))
    assert compared.returncode == 0, compared.stderr
    comparison = json.loads(compared.stdout)
    assert comparison["same_configuration"] is False
    rate = next(m for m in comparison["metrics"] if m["name"].startswith("output tokens/s"))
    assert rate["delta_pct"][1] == pytest.approx(57, abs=15)
    assert comparison["simulated"] == [True, True]
    keys = [(d["section"], d["key"]) for d in comparison["configuration_differences"][0]["differences"]]
    assert keys == [("server_args", "enable_flashinfer_allreduce_fusion")]
    human = run_gpuops("results", "compare", hosts["base"]["result_id"], hosts["fused"]["result_id"],
                       "--results-dir", str(results))
    assert "enable_flashinfer_allreduce_fusion: False -> True" in human.stdout
    reported = run_gpuops("report", "-o", str(tmp_path / "r.html"), "--results-dir", str(results))
    assert reported.returncode == 0, reported.stderr
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()
    assert (tmp_path / "r.md").is_file()


def test_serving_sweep_over_ssh(story_lab, run_gpuops, tmp_path: Path):
    done = run_gpuops("bench", "--remote", "-i", str(story_lab.inventory_path), "-l", "fused", "--suite", "serving",
                      "--concurrency", "1,4", "--output-len", "16", "--warmup", "1", "--json",
                      "--slo", "tpot_ms=100000", "--results-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)["hosts"]["fused"]
    assert [lv["concurrency"] for lv in line["levels"]] == [1, 4]
    assert line["levels"][1]["total_output_tokens_per_s"] > 2 * line["levels"][0]["total_output_tokens_per_s"]
    # bench_serving's figures, over SSH too; the headline is the peak
    stored = json.loads(Path(line["result_file"]).read_text())
    for level in stored["levels"]:
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
            assert set(level[name]) == {"mean", "median", "std", "p50", "p90", "p95", "p99"}
        assert level["failed"] == 0 and level["goodput_request_per_s"] == pytest.approx(level["request_throughput"])
    assert line["peak_total_output_tokens_per_s"] == max(lv["total_output_tokens_per_s"] for lv in line["levels"])


def test_bad_port_var_and_unreachable_server_fail_per_host(story_lab, run_gpuops, tmp_path: Path):
    done = run_gpuops("bench", "--remote", "-i", str(story_lab.inventory_path), "--suite", "decode",
                      "--port", "9", "--json", "--results-dir", str(tmp_path))
    assert done.returncode == 1
    hosts = json.loads(done.stdout)["hosts"]
    for line in hosts.values():
        assert not line["ok"] and "cannot reach the server at http://127.0.0.1:9" in line["error"]
        assert line["result_id"] is None
    bad = run_gpuops("bench", "--remote", "-i", str(story_lab.inventory_path), "--suite", "allreduce",
                     "--env", "NCCL_ALGO", "--results-dir", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.strip().startswith("gpuops: error: bench: --env")
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 1), (signal.SIGTERM, 128 + signal.SIGTERM)],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_keeps_partial_results(story_lab, gpuops_home: Path, tmp_path: Path, sig, status):
    """Ctrl-C, and SIGTERM as a killed CI job sends it (issue 42): the hosts' clients stop, what they
    measured comes home; SIGTERM's exit status says the job was ended (128 + 15), Ctrl-C's partial 1."""
    from gpuops.lab.sglang_cache import cache_root

    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update({"HOME": str(gpuops_home), "GPUOPS_CACHE": str(cache_root().parent)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuops.cli", "bench", "--remote", "-i", str(story_lab.inventory_path),
         "--suite", "decode", "--output-len", "20", "--num-requests", "1000", "--warmup", "0", "--json",
         "--results-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    # Interrupt once every host's client has sent two measured requests home (its progress file
    # counts the sample frames it wrote): the server counting a request done is not the client
    # having measured it, and under load the one ran well ahead of the other.
    sshd_pids = {h.sshd_pid for h in story_lab.hosts}
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the remote clients never measured two requests"
        pid_files = [p for p in Path("/tmp").glob("gpuops-bench-*.pid") if _pid_alive(p) and _runs_under(p, sshd_pids)]
        if len(pid_files) == len(story_lab.hosts) and all(_done(p) >= 2 for p in pid_files):
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == status, err  # partial: not ok, but measured
    hosts = json.loads(out)["hosts"]
    for name, line in hosts.items():
        assert line.get("partial") is True, (name, line, err[-2000:], out[-3000:])
        assert line["result_id"] and Path(line["result_file"]).is_file()
        stored = json.loads(Path(line["result_file"]).read_text())
        assert 2 <= len(stored["samples"]) < 1000  # at least what the host had sent before the signal
        assert stored["summary"]["output_tokens_per_s"] > 0
    for pid_file in pid_files:
        assert not pid_file.exists()  # every remote client ended and cleaned up


def _done(pid_file: Path) -> int:
    """The measured requests a running client says it has sent (its progress file beside the pid file)."""
    try:
        return int(json.loads(pid_file.with_suffix(".progress").read_text())["done"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _pid_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def _runs_under(pid_file: Path, ancestors: set[int]) -> bool:
    # Other tests (and other checkouts' tests) write pid files in /tmp too; ours descend from this lab's sshd.
    try:
        pid = int(pid_file.read_text().split()[0])
        while pid > 1:
            if pid in ancestors:
                return True
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return False


def test_allreduce_over_ssh_with_gloo(lab_factory, run_gpuops, tmp_path: Path):
    # The lab host is this machine: the torch that the unit tests use is the host's torch here.
    # (A host with no SGLang: the lab's SGLang hosts put a stand-in torch package on PYTHONPATH.)
    from gpuops.lab.hosts import LabSpec

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_bench_allreduce import torch_python

    python = torch_python()
    if python is None:
        pytest.skip("no python with torch (gloo) here")
    lab = lab_factory(LabSpec(names=("base",), sglang=None, server=False, gpu="none"))
    done = run_gpuops("bench", "--remote", "-i", str(lab.inventory_path), "-l", "base", "--suite", "allreduce",
                      "--backend", "gloo", "--world-size", "2", "--tokens", "1,16", "--iters", "5", "--trials", "2",
                      "--env", "NCCL_PROTO=LL,Simple", "--python", python, "--json", "--results-dir", str(tmp_path),
                      timeout=300)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)["hosts"]["base"]
    assert {v["label"] for v in line["variants"]} == {"NCCL_PROTO=LL", "NCCL_PROTO=Simple"}
    for variant in line["variants"]:
        assert variant["ok"] and set(variant["latency_us"]) == {"1", "16"}
        assert all(x > 0 for x in variant["busbw_gbps"].values())
    assert line["step_cost_ms"] > 0
    # the host kept its own copy of every record (its state dir), whatever happened to the connection
    kept = list(lab.hosts[0].dir.rglob("bench/*.frames"))
    assert kept and sum(1 for x in kept[0].read_text().splitlines() if " allreduce " in x) == 4
    # nothing left in the host's temp dir (torchrun's `torchelastic_*` log dirs included)
    assert sorted(p.name for p in (lab.hosts[0].dir / "tmp").iterdir()) == []
