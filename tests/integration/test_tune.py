"""`gpuops tune` over real sshd lab hosts: variants measured and ranked, a crashing variant rolled
back by its own apply run, and every host byte for byte as it started at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration

FAST = {"GPUOPS_STANDIN_TOKENS_PER_S": "2000", "GPUOPS_STANDIN_TTFT_MS": "5",
        "GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"}  # like the field: Tree dies during graph capture
BENCH = ["--num-requests", "2", "--warmup", "0", "--input-len", "16", "--output-len", "16"]


def test_sweep_ranks_variants_survives_a_crashing_one_and_restores_the_host(lab_factory, run_gpuops, tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8", server_env=FAST)
    host = lab.hosts[0]
    # Render the launch files once with the role, so the "before" state is gpuops' own.
    first = run_gpuops("apply", "sglang-service", "-i", str(lab.inventory_path), "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    before = tree_hashes(host.dir, skip_runs=True)
    assert "NCCL_ALGO" not in server_info(host.server_port)["env"]

    proc = run_gpuops("tune", "-i", str(lab.inventory_path), "--sweep", "NCCL_ALGO=Ring,Tree",
                      "--results-dir", str(tmp_path / "results"), "--json", *BENCH, timeout=300)
    doc = json.loads(proc.stdout)
    result = doc["hosts"][host.name]
    by_variant = {t["variant"]: t for t in result["ranking"]}
    assert set(by_variant) == {"baseline (as configured)", "NCCL_ALGO=Ring", "NCCL_ALGO=Tree"}
    assert by_variant["NCCL_ALGO=Ring"]["ok"] and by_variant["NCCL_ALGO=Ring"]["output_tokens_per_s"] > 0
    assert by_variant["baseline (as configured)"]["ok"]
    assert by_variant["NCCL_ALGO=Ring"]["simulated"] and by_variant["NCCL_ALGO=Ring"]["speed_model"] == "exact rate 2000 tok/s"
    tree = by_variant["NCCL_ALGO=Tree"]
    assert not tree["ok"] and tree["status"] == "apply_failed" and "rolled back" in tree["error"]
    assert result["ranking"][-1]["variant"] == "NCCL_ALGO=Tree"  # failures rank last
    assert result["restored"] is True and result["kept"] is None
    assert proc.returncode == 0, proc.stderr

    # Every byte as it started, and the server healthy on its original environment.
    assert tree_hashes(host.dir, skip_runs=True) == before
    info = server_info(host.server_port)
    assert "NCCL_ALGO" not in info["env"]
    # The trials' results are in the store, each with its own configuration.
    stored = list((tmp_path / "results").glob("*.json"))
    assert len(stored) == 2


def test_a_typo_in_the_sweep_changes_nothing(lab_factory, run_gpuops, tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang="0.5.8", server_env=FAST)
    host = lab.hosts[0]
    before = tree_hashes(host.dir, skip_runs=True)
    proc = run_gpuops("tune", "-i", str(lab.inventory_path), "--sweep", "NCCL_ALGOS=Ring",
                      "--results-dir", str(tmp_path / "results"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "did you mean NCCL_ALGO?" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_hashes(host.dir, skip_runs=True) == before
    assert not (tmp_path / "results").exists()
