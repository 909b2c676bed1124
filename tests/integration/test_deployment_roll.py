"""A multi-node SGLang server on lab hosts changed as ONE server (apply/deployment.py).

Two lab nodes running the stand-in as SGLang's nodes (``--nnodes 2 --node-rank R --dist-init-addr``:
node 0 healthy only once node 1 joined, one node gone takes the other down), one lab for the
module (each test leaves it healthy on a setting of its own). Faults come from the lab's fault
file (``lab/host_faults.py``) and SIGKILLs from outside gpuops' code path. After every fault the
promise is the same: never a split configuration, both nodes on one setting, the server healthy.

`gpuops rollback` of a deployment is in test_deployment_rollback, a split left between the commits
in test_deployment_split: each module has a lab of its own (``deployment_nodes``), so that the three
run on parallel workers (``--dist loadfile``) instead of one module holding the suite's tail.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from deployment_nodes import (apply_value, baseline, env_file, extra_vars, frozen_once_verified, http_get, nodes_said,
                              put_fault, server_pid, settled, stderr_lines, wait_event)
from labtools import progress_records
from test_apply_faults import calls, client, journal_events, kill, paused, wait_host_settled

from gpuops.lab.hosts import Lab, LabSpec, stop_lab
from gpuops.lab.ports import free_port

pytestmark = pytest.mark.integration


def test_serial_1_changes_both_nodes_as_one_server(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    lab, port = nodes
    code, hosts = apply_value(run_gpuops, lab, port, 4, "--serial", "1")
    assert code == 0, hosts
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    settled(lab, 4)
    status, body = http_get(lab.host("n0").server_port, "/get_server_info")
    assert status == 200 and json.loads(body)["nnodes"] == 2
    # The derived launch flags are each node's own (the inventory spells the same; merged, not doubled).
    for rank, name in enumerate(("n0", "n1")):
        script = (lab.host(name).state_dir / "sglang-launch.sh").read_text()
        assert f"--node-rank {rank} " in script and script.count("--nnodes") == 1, script
        assert f"--dist-init-addr 127.0.0.1:{port}" in script
    # Each node's journal names the deployment and its members (how any node finds the others).
    for name in ("n0", "n1"):
        records = [json.loads(l) for l in (lab.host(name).state_dir / "journal.jsonl").read_text().splitlines()]
        started = [r for r in records if r["event"] == "started"][-1]
        assert started["deployment"]["members"] == ["n0", "n1"] and started["deployment"]["name"] == "kimi"


def test_check_shows_the_deployment_plan(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    lab, port = nodes
    code, hosts = apply_value(run_gpuops, lab, port, 5, "--check")
    assert code == 0, hosts
    assert any("node 1 of 2 (n0, n1), a worker" in n for n in hosts["n1"]["notes"]), hosts["n1"]["notes"]


@pytest.mark.parametrize(("failing", "phase"), [("n1", "after_writes"), ("n1", "health"), ("n1", "confirm"),
                                               ("n0", "health")])
def test_a_node_failing_at_any_phase_rolls_back_both(nodes: tuple[Lab, int], run_gpuops: Any, failing: str,
                                                     phase: str) -> None:
    """The worker fails (after its writes, at its health, after it was verified), or the leader at
    its health: the other node, which would be healthy, is rolled back too. Without the commit
    waiting for every node, n0 commits 6 while n1 rolls back to 4: the split this test exists for."""
    lab, port = nodes
    other = "n0" if failing == "n1" else "n1"
    baseline(run_gpuops, lab, port)
    put_fault(lab, failing, {"fail_at": phase})
    code, hosts = apply_value(run_gpuops, lab, port, 6)
    assert code != 0
    assert hosts[failing]["status"] == "rolled_back", hosts
    # Before any server stopped, the other node may still be before its first write: refused, nothing changed.
    assert hosts[other]["status"] in (("rolled_back", "refused") if phase == "after_writes" else ("rolled_back",)), hosts
    assert f"node {failing} of deployment kimi failed" in hosts[other]["error"], hosts[other]
    settled(lab, 4)


@pytest.mark.parametrize("phase", ["after_writes", "server_start", "confirm"])
def test_client_killed_rolls_back_every_node(nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any,
                                             phase: str) -> None:
    """gpuops SIGKILLed while the worker node waits (started, or healthy before the commit): both
    leases lapse, both nodes roll back by themselves, the server comes back on the old setting."""
    lab, port = nodes
    baseline(run_gpuops, lab, port)
    earlier = {name: calls(lab.host(name)) for name in ("n0", "n1")}
    put_fault(lab, "n1", {"pause_at": phase, "seconds": 60})
    proc = client(lab, "nccl-env", *extra_vars(port, 7), home=gpuops_home)
    where = paused(lab.host("n1"), phase, proc, earlier["n1"])
    kill("client", where, proc)
    proc.communicate()
    wait_host_settled(lab.host("n1"), where)
    settled(lab, 4)
    for name in ("n0", "n1"):
        # Killed while n1 prepares (no server stopped yet), n0 may not have opened its run at all.
        ended = ("rolled_back", "finished", "unchanged") if phase == "after_writes" and name == "n0" else ("rolled_back",)
        # polled: n0's lease-lapse rollback journals its end just after its previous server is back
        deadline = time.monotonic() + 60
        while (events := [e for _, e in journal_events(lab.host(name))])[-1] not in ended \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert events[-1] in ended, (name, events[-3:])


def test_a_worker_that_joined_the_new_leader_starts_again_when_the_leader_rolls_back(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """gpuops killed while node 0's new server waits for node 1, which is about to start its own:
    both leases lapse together. Node 1's rollback starts its previous worker, which joins node 0's
    NEW server, still up (node 0 held here just before its rollback restarts it; a whole run's load
    did the same by chance, once in ~10 runs). Node 0's rollback then stops that server and the
    worker with it: node 1 starts the worker again, within its health wait, and both end on the old
    setting (before: the worker was left down beside a leader waiting for it)."""
    lab, port = nodes
    baseline(run_gpuops, lab, port)
    earlier = {name: calls(lab.host(name)) for name in ("n0", "n1")}
    release = lab.host("n0").state_dir / "lab-release"
    put_fault(lab, "n1", {"pause_at": "server_start", "seconds": 60})
    put_fault(lab, "n0", {"pause_at": "rollback_restore", "seconds": 120, "until": "lab-release"})
    proc = client(lab, "nccl-env", *extra_vars(port, 12), home=gpuops_home)
    try:
        where = paused(lab.host("n1"), "server_start", proc, earlier["n1"])
        # The premise: node 0's new server is up, waiting for node 1. gpuops tells both nodes to start
        # together, but a kill the moment node 1 pauses may land before node 0 took it: node 0 then
        # rolls back with no server at all, node 1's worker has no leader to join, and its rollback
        # fails (once in 15 runs alone: node 1 `previous_started`, `rollback_failed`).
        reached(lab.host("n0"), "health", proc, earlier["n0"])
        kill("client", where, proc)
        proc.communicate()
        paused(lab.host("n0"), "rollback_restore", None, earlier["n0"])  # the new server still up
        # Once (a whole run, 2026-12-03) the worker had not answered 60 s after node 0 paused; alone it
        # answers within seconds. 90 s, and the nodes' own words when it fails, so that the next says why.
        deadline = time.monotonic() + 90
        while http_get(lab.host("n1").server_port, "/health")[0] != 200:  # the worker joined it
            if time.monotonic() > deadline:
                pytest.fail("node 1's previous worker never joined node 0's server\n" + nodes_said(lab))
            time.sleep(0.05)
    finally:
        release.touch()
    try:
        wait_host_settled(lab.host("n1"), where)
        settled(lab, 4)
    finally:
        release.unlink(missing_ok=True)
    assert [e for _, e in journal_events(lab.host("n1"))][-1] == "rolled_back"


def reached(host: Any, phase: str, proc: Any, earlier: set[Path]) -> None:
    """Wait until this client's run on ``host`` began ``phase`` (its progress says so)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for progress in (p / "progress.jsonl" for p in calls(host) - earlier):
            if any(r.get("phase") == phase for r in progress_records(progress)):
                return
        time.sleep(0.05)
    raise AssertionError(f"{host.name} never began {phase}")


@pytest.mark.parametrize(("killed", "phase"), [("n0", "health"), ("n0", "confirm"), ("n1", "after_writes"),
                                              ("n1", "health"), ("n1", "confirm")])
def test_worker_killed_on_either_node_rolls_back_every_node(nodes: tuple[Lab, int], gpuops_home: Path,
                                                            run_gpuops: Any, killed: str, phase: str) -> None:
    """A node's host-side worker dies (OOM killer) after its writes, during its health wait, or once
    it was verified: its relay rolls it back, the client aborts the other node, both come back on
    the old setting."""
    lab, port = nodes
    other = "n0" if killed == "n1" else "n1"
    baseline(run_gpuops, lab, port)
    earlier = calls(lab.host(killed))
    put_fault(lab, killed, {"pause_at": phase, "seconds": 60})
    proc = client(lab, "nccl-env", "--json", *extra_vars(port, 8), home=gpuops_home)
    where = paused(lab.host(killed), phase, proc, earlier)
    kill("worker", where, proc)
    out, _ = proc.communicate(timeout=240)
    hosts = json.loads(out)["hosts"]
    why = {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    assert hosts[killed]["status"] == "rolled_back", why
    # Killed before any server stopped, the other node may still be before its first write: refused, nothing changed.
    assert hosts[other]["status"] in (("rolled_back", "refused") if phase == "after_writes" else ("rolled_back",)), why
    settled(lab, 4)


def test_a_node_left_out_by_limit_is_refused(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    lab, port = nodes
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-l", "n1", *extra_vars(port, 9), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "n1: deployment kimi" in proc.stderr and "n0" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    settled(lab, 4)


def test_inspect_shows_the_deployment_as_one_server(nodes: tuple[Lab, int], run_gpuops: Any,
                                                    tmp_path: Path) -> None:
    """The inventory names the deployment as a group var (as an operator writes it); inspect sees
    the two nodes as one server, healthy, on one configuration."""
    import yaml

    lab, port = nodes
    baseline(run_gpuops, lab, port)
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["vars"].update({"sglang_deployment": "kimi", "sglang_dist_port": port})
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    proc = run_gpuops("inspect", "host", "-i", str(inventory), "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    kimi = json.loads(proc.stdout)["deployments"]["kimi"]
    assert kimi["members"] == ["n0", "n1"] and kimi["leader"] == "n0", kimi
    assert kimi["init_addr"] == f"127.0.0.1:{port}" and kimi["warnings"] == [], kimi
    assert kimi["nodes"]["n0"]["healthy"] and kimi["nodes"]["n1"]["running"], kimi
    assert kimi["serving"] is True and kimi["answer"]["ok"] is True, kimi  # the leader answered a generation
    assert kimi["nodes"]["n1"]["launch"] == {"nnodes": "2", "node_rank": "1", "dist_init_addr": f"127.0.0.1:{port}"}


def test_a_change_on_one_node_restarts_every_node(nodes: tuple[Lab, int], run_gpuops: Any, tmp_path: Path) -> None:
    """Only node 1's launch changes (a host var of its own): node 0, with nothing to change,
    restarts with it (node 1's restart alone would take the leader down), and both commit. The
    same way a deployment whose nodes ended on different settings is brought back to one."""
    import yaml

    lab, port = nodes
    baseline(run_gpuops, lab, port)
    leader_pid = server_pid(lab, "n0")
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["hosts"]["n1"]["sglang_env"]["GPUOPS_TEST_NODE"] = "one"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    proc = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", *extra_vars(port, 4), timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, hosts
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    assert hosts["n0"]["changed"] == 0 and any("restarted with the other nodes" in n for n in hosts["n0"]["notes"])
    assert "GPUOPS_TEST_NODE='one'" in env_file(lab, "n1") and "GPUOPS_TEST_NODE" not in env_file(lab, "n0")
    settled(lab, 4)
    assert server_pid(lab, "n0") != leader_pid  # the leader was restarted with its worker
    code, hosts = apply_value(run_gpuops, lab, port, 4)  # back to the lab's own inventory: node 1 changes again
    assert code == 0 and "GPUOPS_TEST_NODE" not in env_file(lab, "n1"), hosts
    settled(lab, 4)



def test_three_nodes_change_and_roll_back_as_one(lab_factory: Any, run_gpuops: Any) -> None:
    """Three nodes (TP 24 over 3 hosts): each launched with its own derived rank; node 1 failing
    after it was verified rolls all three back, and the server is healthy on the old setting."""
    port = free_port()
    names = ("m0", "m1", "m2")
    lab = lab_factory(*[LabSpec(count=1, names=(n,), server_args=(
        "--model-path", "/models/Kimi-K2.5", "--tp", "24", "--nnodes", "3", "--node-rank", str(rank),
        "--dist-init-addr", f"127.0.0.1:{port}")) for rank, n in enumerate(names)])
    try:
        def all_settled(value: int) -> None:
            deadline = time.monotonic() + 90
            while True:
                files = all(f"NCCL_MIN_NCHANNELS='{value}'" in env_file(lab, n) for n in names)
                status, body = http_get(lab.host("m0").server_port, "/get_server_info")
                served = json.loads(body).get("env", {}).get("NCCL_MIN_NCHANNELS") if status == 200 else None
                workers = [http_get(lab.host(n).server_port, "/health")[0] for n in names[1:]]
                if files and served == str(value) and workers == [200, 200]:
                    return
                assert time.monotonic() < deadline, (files, served, workers)
                time.sleep(0.2)

        code, hosts = apply_value(run_gpuops, lab, port, 4)
        assert code == 0 and all(hosts[n]["status"] == "finished" for n in names), hosts
        all_settled(4)
        for rank, name in enumerate(names):
            script = (lab.host(name).state_dir / "sglang-launch.sh").read_text()
            assert f"--nnodes 3 --node-rank {rank} --dist-init-addr 127.0.0.1:{port}" in script, script
        put_fault(lab, "m1", {"fail_at": "confirm"})
        code, hosts = apply_value(run_gpuops, lab, port, 6)
        assert code != 0 and all(hosts[n]["status"] == "rolled_back" for n in names), hosts
        all_settled(4)
    finally:
        stop_lab(lab.root)



def test_a_node_rolled_back_by_its_lease_is_not_left_beside_a_committed_one(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """Node 1 healthy and waiting for its commit, its session frozen (SIGSTOP of its relay): its
    lease lapses and it rolls back, which takes node 0's new server down while node 0 is still
    before its commit. Node 0 then gets its commit but does not commit a server that is gone:
    both nodes end on the old setting (before: node 0 committed 11 with no server running)."""
    lab, port = nodes
    baseline(run_gpuops, lab, port)
    earlier = {n: calls(lab.host(n)) for n in ("n0", "n1")}
    seen = len(journal_events(lab.host("n1")))
    # Node 0 verifies last: held at its confirm until node 1 has rolled back (the test releases it;
    # a fixed pause would be a race with node 1's lease and rollback under load).
    put_fault(lab, "n0", {"pause_at": "confirm", "seconds": 120, "until": "lab-release"})
    # A short health timeout for this run: node 1's rollback by its lease waits for a leader that is
    # gone, and that wait (the run's timeout) is most of this test's time.
    proc = client(lab, "nccl-env", "-v", "--json", *extra_vars(port, 11), "-e",
                  json.dumps({"gpuops_health_timeout": 6}), home=gpuops_home)
    heard = stderr_lines(proc)
    paused(lab.host("n0"), "confirm", proc, earlier["n0"])
    worker = frozen_once_verified(lab, "n1", proc, heard, earlier["n1"])  # node 1 waits for its commit
    release = lab.host("n0").state_dir / "lab-release"
    try:
        wait_event(lab.host("n1"), ("rolled_back", "rollback_failed"), seen)  # by its lease
    finally:
        os.kill(worker["relay"], signal.SIGCONT)
        release.touch()
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        release.unlink(missing_ok=True)
    hosts = json.loads(out)["hosts"]
    assert hosts["n0"]["status"] != "finished" and hosts["n1"]["status"] != "finished", hosts
    assert "NCCL_MIN_NCHANNELS='11'" not in env_file(lab, "n0")
    baseline(run_gpuops, lab, port)  # the next command: one server on one setting again


