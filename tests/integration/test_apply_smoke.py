"""The correctness smoke check of apply fusion-sm120: greedy prompts before and after the restart.

Two lab hosts on one real SGLang release: ``same`` answers the same after the change; ``wrong``
runs the stand-in with its GPUOPS_STANDIN_WRONG_IF fault keyed on the fusion flag, so the server
that fusion-sm120 restarts answers different text (as a kernel that broke numerics would).
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from gpuops.lab.hosts import LabSpec
from labtools import FUSION_FLASHINFER, server_info, tree_hashes

pytestmark = pytest.mark.integration

WRONG = {"GPUOPS_STANDIN_WRONG_IF": "enable_flashinfer_allreduce_fusion=true"}


def greedy(port: int) -> str:
    body = json.dumps({"text": "The capital of France is",
                       "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["text"]


def apply(run_gpuops, lab, *args: str):
    return run_gpuops("apply", "fusion-sm120", "-i", str(lab.inventory_path), "-e", "gpuops_health_timeout=60",
                      "-e", "gpuops_stop_grace=5", "-e", "fusion_allow_without_p2p=true", "--json", *args,
                      timeout=300)


def test_smoke_check_same_different_and_rollback(lab_factory, run_gpuops) -> None:
    lab = lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("same",), flashinfer=FUSION_FLASHINFER),
                      LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("wrong",), server_env=WRONG,
                              flashinfer=FUSION_FLASHINFER))
    same, wrong = lab.hosts
    before = tree_hashes(wrong.dir, skip_runs=True)
    answer = greedy(wrong.server_port)
    assert greedy(wrong.server_port) == answer  # the stand-in is deterministic across requests

    # smoke_rollback=true: the host whose answers changed is rolled back, byte for byte; the other keeps it.
    proc = apply(run_gpuops, lab, "-e", "smoke_rollback=true")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["same"]["status"] == "finished", hosts["same"]
    assert not any("smoke" in w for w in hosts["same"]["warnings"]), hosts["same"]["warnings"]
    assert any("answer the same" in n for n in hosts["same"]["notes"]), hosts["same"]["notes"]
    assert hosts["wrong"]["status"] == "rolled_back", hosts["wrong"]
    assert "answer differently after the restart" in hosts["wrong"]["error"], hosts["wrong"]["error"]
    assert tree_hashes(wrong.dir, skip_runs=True) == before
    assert not server_info(wrong.server_port).get("enable_flashinfer_allreduce_fusion")
    assert greedy(wrong.server_port) == answer

    # Without smoke_rollback: the change stays, and the recap and --json carry the warning.
    proc = apply(run_gpuops, lab, "-l", "wrong")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)["hosts"]["wrong"]
    assert report["status"] == "finished", report
    smoke = [w for w in report["warnings"] if w.startswith("smoke check")]
    assert smoke and "1 of 3" not in smoke[0] and "3 of 3 greedy prompts" in smoke[0], smoke
    assert greedy(wrong.server_port) != answer
    text = run_gpuops("rollback", "-i", str(lab.inventory_path), "-l", "wrong", timeout=300)
    assert text.returncode == 0, text.stdout + text.stderr
    assert tree_hashes(wrong.dir, skip_runs=True) == before
