"""gpuops rollback of a multi-node deployment: whatever fails, one server (the lab: deployment_nodes)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deployment_nodes import (LEASE, apply_value, baseline, between_commits, committed_run, env_file, put_fault,
                              rollback_all, server_pid, settled, undone_on_both)
from test_apply_faults import calls, client, journal_events, kill, paused, wait_host_settled

from gpuops.lab.hosts import Lab, LabSpec

pytestmark = pytest.mark.integration


def test_rollback_undoes_every_node_as_one(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    """`gpuops rollback` of a run committed on both nodes: one node alone is refused (nothing
    changed), both together come back on the old setting with the server healthy, however slow one
    node is. Node 1 pauses in its rollback (restoring its files) for longer than the run's health
    timeout: without the nodes held together, node 0's previous leader waited alone for a node 1
    not yet back, its rollback failed and was undone (node 0 on 10, node 1 on 4: a split)."""
    lab, port = nodes
    baseline(run_gpuops, lab, port)
    code, hosts = apply_value(run_gpuops, lab, port, 10, "-e", json.dumps({"gpuops_health_timeout": 4}))
    assert code == 0, hosts
    settled(lab, 10)
    inventory = str(lab.inventory_path)
    alone = run_gpuops("rollback", "-i", inventory, "-l", "n1", "--json", timeout=120)
    assert alone.returncode != 0
    refused = json.loads(alone.stdout)["hosts"]["n1"]
    assert refused["status"] == "refused" and "deployment kimi" in refused["error"] and "n0" in refused["error"], refused
    settled(lab, 10)
    put_fault(lab, "n1", {"pause_at": "rollback_restore", "seconds": 8})
    proc = run_gpuops("rollback", "-i", inventory, "--json", timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    settled(lab, 4)



@pytest.mark.parametrize("failing", ["n1", "n0"])
def test_a_rollback_failing_on_one_node_is_undone_on_every_node(nodes: tuple[Lab, int], run_gpuops: Any,
                                                                failing: str) -> None:
    """One node's previous server does not come healthy during `gpuops rollback` (the worker's, or
    the leader's): its rollback is undone, and so is every other node's, all restarted together on
    the configuration they ran before it; both said so, with the deployment's outcome. Before: the
    failing node undid its rollback alone (its server restarted beside a peer still on the old
    setting), and the others were aborted without being held together."""
    lab, port = nodes
    committed_run(run_gpuops, lab, port, 12)
    before = {n: server_pid(lab, n) for n in ("n0", "n1")}
    put_fault(lab, failing, {"fail_at": "rollback_health", "times": 1})
    code, hosts = rollback_all(run_gpuops, lab)
    assert code != 0
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "rolled_back", hosts
        assert "the rollback was undone" in hosts[name]["error"], hosts[name]
        outcome = [n for n in hosts[name]["notes"] if n.startswith("deployment kimi (n0, n1): ")]
        assert len(outcome) == 1 and f"node {failing} of deployment kimi failed" in outcome[0], hosts[name]["notes"]
        assert "every node restarted together on it, healthy" in outcome[0], outcome
    assert "injected fault at rollback_health" in hosts[failing]["error"]
    settled(lab, 12)
    # Both servers are new processes: the undo restarted every node, not the failing one alone.
    assert all(server_pid(lab, n) != before[n] for n in ("n0", "n1"))


def test_an_unreadable_record_on_one_node_releases_the_others_at_once(nodes: tuple[Lab, int],
                                                                      run_gpuops: Any) -> None:
    """Node 1's copy of the run's record (its manifest) is damaged: node 1 is refused, naming its
    file, and node 0, already held for it, is let go at once instead of at --timeout; nothing
    changed on either node."""
    lab, port = nodes
    committed_run(run_gpuops, lab, port, 13)
    journal = lab.host("n1").state_dir / "journal.jsonl"
    run = [json.loads(l) for l in journal.read_text().splitlines() if '"started"' in l][-1]["run_id"]
    manifest = lab.host("n1").state_dir / "runs" / run / "manifest.json"
    good = manifest.read_bytes()
    manifest.write_bytes(good[: len(good) // 2])
    lines = {n: len((lab.host(n).state_dir / "journal.jsonl").read_text().splitlines()) for n in ("n0", "n1")}
    try:
        started = time.monotonic()
        code, hosts = rollback_all(run_gpuops, lab, "--timeout", "90")
        took = time.monotonic() - started
    finally:
        manifest.write_bytes(good)
    assert code != 0 and took < 30, (took, hosts)
    assert str(manifest) in hosts["n1"]["error"] and "not valid JSON" in hosts["n1"]["error"], hosts["n1"]
    assert hosts["n0"]["status"] == "refused" and "node n1" in hosts["n0"]["error"], hosts["n0"]
    assert "nothing was changed" in hosts["n0"]["error"], hosts["n0"]
    for name in ("n0", "n1"):  # no run of the rollback journaled (nothing started)
        records = (lab.host(name).state_dir / "journal.jsonl").read_text().splitlines()[lines[name]:]
        assert not [r for r in records if '"started"' in r], records
    settled(lab, 13)


def test_rollback_serial_keeps_a_deployments_nodes_in_one_batch(nodes: tuple[Lab, int], lab_factory: Any,
                                                                 run_gpuops: Any, tmp_path: Path) -> None:
    """`gpuops rollback --serial 1` over the two nodes (named a deployment by the inventory, as an
    operator writes it) and a lone host: the nodes are one batch, as apply makes them, the lone
    host the next; --check shows it. Before: the nodes fell in two batches and were refused."""
    import yaml

    lab, port = nodes
    solo = lab_factory(LabSpec(count=1, names=("solo",)))
    data = yaml.safe_load(lab.inventory_path.read_text())
    for name in ("n0", "n1"):
        data["all"]["children"]["lab"]["hosts"][name].update({"sglang_deployment": "kimi", "sglang_dist_port": port})
    data["all"]["children"]["solo"] = yaml.safe_load(solo.inventory_path.read_text())["all"]["children"]["lab"]
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    baseline(run_gpuops, lab, port)
    nccl = json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": "14"}, "gpuops_health_timeout": 6, "gpuops_lease": LEASE})
    proc = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", "-e", nccl, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    settled(lab, 14)
    check = run_gpuops("rollback", "-i", str(inventory), "--serial", "1", "--check", "--json", timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["batches"] == [{"hosts": ["n0", "n1"], "deployments": {"kimi": ["n0", "n1"]}},
                                                   {"hosts": ["solo"], "deployments": {}}], check.stdout
    text = run_gpuops("rollback", "-i", str(inventory), "--serial", "1", "--check", timeout=60)
    assert "batch 1 of 2: n0, n1 (deployment kimi: rolled back as one server)" in text.stdout, text.stdout
    proc = run_gpuops("rollback", "-i", str(inventory), "--serial", "1", "--json", timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert all(hosts[n]["status"] == "finished" for n in ("n0", "n1", "solo")), hosts
    assert any("its nodes in one batch (--serial): batch 1 of 2" in n for n in hosts["n0"]["notes"]), hosts["n0"]
    settled(lab, 4)
    assert "NCCL_MIN_NCHANNELS='14'" not in (solo.host("solo").state_dir / "sglang.env").read_text()


def test_client_killed_while_a_deployment_rollback_prepares_stops_no_server(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """gpuops SIGKILLed during `gpuops rollback` while node 1 restores its files (node 0 held
    before stopping its server): both leases lapse, both undo their rollback without touching a
    server, and the deployment stays on the run's setting, healthy, its servers never restarted."""
    lab, port = nodes
    committed_run(run_gpuops, lab, port, 15)
    before = {n: server_pid(lab, n) for n in ("n0", "n1")}
    earlier = calls(lab.host("n1"))
    put_fault(lab, "n1", {"pause_at": "rollback_restore", "seconds": 6})
    proc = client(lab, "rollback", home=gpuops_home)
    where = paused(lab.host("n1"), "rollback_restore", proc, earlier)
    kill("client", where, proc)
    proc.communicate()
    wait_host_settled(lab.host("n1"), where)
    for name in ("n0", "n1"):
        deadline = time.monotonic() + 60
        while (events := [e for _, e in journal_events(lab.host(name))])[-1] != "rolled_back" \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert events[-1] == "rolled_back" and "server_touched" not in events[-3:], (name, events[-4:])
    settled(lab, 15)
    assert {n: server_pid(lab, n) for n in ("n0", "n1")} == before




def test_a_rollback_split_between_its_commits_is_finished_by_the_next_apply(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any, tmp_path: Path) -> None:
    """`gpuops rollback` of run 15 (committed on both) split the same way: its rollback committed on
    node 0, node 1's lease undid it (node 1 still on 15). The next `gpuops apply` of the old
    setting rolls run 15 back on node 1 with node 0 restarting beside it, then has nothing to do."""
    import yaml

    lab, port = nodes
    baseline(run_gpuops, lab, port)
    code, hosts = apply_value(run_gpuops, lab, port, 15)
    assert code == 0, hosts
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["vars"].update({"gpuops_lease": 8})
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    undo, _ = between_commits(lab, "n0", lambda: client(lab, "rollback", "-v", "--json", "-i", str(inventory),
                                                         home=gpuops_home))
    applied = [r for r, e in journal_events(lab.host("n0")) if e == "finished"][-2]  # run 15, before the rollback
    assert "NCCL_MIN_NCHANNELS='4'" in env_file(lab, "n0") and "NCCL_MIN_NCHANNELS='15'" in env_file(lab, "n1")
    code, hosts = apply_value(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    assert any(f"its run {applied} committed on n1 and rolled back on n0" in n for n in hosts["n0"]["notes"]), hosts
    settled(lab, 4)
    undone_on_both(lab, applied)
    assert undo != applied

