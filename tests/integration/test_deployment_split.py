"""A deployment split between its commits (committed on one node, rolled back on the other by its
lease): named, and rolled back on every node as one (the lab: deployment_nodes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployment_nodes import apply_value, env_file, settled, split_run, undone_on_both

from gpuops.lab.hosts import Lab

pytestmark = pytest.mark.integration


def test_a_split_left_by_a_killed_client_is_rolled_back_by_the_next_apply(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """Node 0 committed run 12, node 1's lease rolled it back (the client died between the two
    commit messages). `apply --check` names the split; the next `gpuops apply` first rolls the run
    back on every node as one (node 1 restarting with node 0), then goes on: the same old setting
    is then nothing to change. Before: the apply changed node 0 back by a run of its own while run
    12 still stood in its journal, and `--check` said nothing."""
    lab, port = nodes
    run_id, _ = split_run(run_gpuops, lab, port, gpuops_home, 12, committed="n0")
    code, hosts = apply_value(run_gpuops, lab, port, 4, "--check")
    assert code == 0 and any(f"deployment kimi is split: its run {run_id} committed on n0 and rolled back on n1" in w
                             for w in hosts["n1"]["warnings"]), hosts["n1"]
    code, hosts = apply_value(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "unchanged", (name, hosts[name])
        assert any(f"its run {run_id} committed on n0" in n and "finished that rollback on every node" in n
                   for n in hosts[name]["notes"]), (name, hosts[name]["notes"])
    settled(lab, 4)
    undone_on_both(lab, run_id)


def test_a_split_left_by_a_killed_client_is_rolled_back_by_the_next_rollback(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any, tmp_path: Path) -> None:
    """The other way round: the worker (node 1) committed run 13 and the leader rolled it back.
    inspect names the split run and the command that repairs it; `gpuops rollback -l n0` is refused
    naming n1, nothing changed; `gpuops rollback` of both
    finishes the split run's rollback (and only that): both on the old setting, healthy, each
    journal with the rollback of run 13. Before: each node rolled back its own last run."""
    import yaml

    lab, port = nodes
    run_id, _ = split_run(run_gpuops, lab, port, gpuops_home, 13, committed="n1")
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["vars"].update({"sglang_deployment": "kimi", "sglang_dist_port": port})
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    seen = run_gpuops("inspect", "host", "-i", str(inventory), "--json", timeout=240)
    warnings = json.loads(seen.stdout)["deployments"]["kimi"]["warnings"]
    assert any(f"its run {run_id} committed on n1 and rolled back on n0" in w and "gpuops rollback -l n0,n1" in w
               for w in warnings), warnings
    alone = run_gpuops("rollback", "-i", str(inventory), "-l", "n0", timeout=120)
    assert alone.returncode == 2 and "Traceback" not in alone.stderr, alone.stdout + alone.stderr
    assert f"n1: deployment kimi is split: its run {run_id} committed on n1 and rolled back on n0" in alone.stderr
    assert "NCCL_MIN_NCHANNELS='13'" in env_file(lab, "n1")  # nothing changed
    proc = run_gpuops("rollback", "-i", str(inventory), "--json", timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    settled(lab, 4)
    undone_on_both(lab, run_id)


def test_a_split_the_run_leaves_itself_is_rolled_back_before_it_returns(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """The same split with the client alive (node 1's session frozen past its lease while node 0
    committed): the apply itself rolls the run back on every node as one before it returns, and
    says so on both nodes. Before: node 0 reported "finished" for a server its partner's rollback
    had taken down, and stayed on 14."""
    lab, port = nodes
    run_id, out = split_run(run_gpuops, lab, port, gpuops_home, 14, committed="n0", kill=False)
    hosts = json.loads(out)["hosts"]
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "rolled_back", (name, hosts[name]["status"], hosts[name]["error"])
        assert f"its run {run_id} committed on n0" in hosts[name]["error"], hosts[name]["error"]
        assert "rolled back on every node as one" in hosts[name]["error"], hosts[name]["error"]
    settled(lab, 4)
    undone_on_both(lab, run_id)


