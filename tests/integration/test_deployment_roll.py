"""A multi-node SGLang server on lab hosts changed as ONE server (apply/deployment.py).

Two lab nodes running the stand-in as SGLang's nodes (``--nnodes 2 --node-rank R --dist-init-addr``:
node 0 healthy only once node 1 joined, one node gone takes the other down), one lab for the
module (each test leaves it healthy on a setting of its own). Faults come from the lab's fault
file (``lab/host_faults.py``) and SIGKILLs from outside gpuops' code path. After every fault the
promise is the same: never a split configuration, both nodes on one setting, the server healthy.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from test_apply_faults import calls, client, journal_events, kill, paused, wait_host_settled

from gpuops.lab.hosts import Lab, LabSpec
from gpuops.lab.ports import free_port

pytestmark = pytest.mark.integration

LEASE = 4


def _node_args(rank: int, addr: str) -> tuple[str, ...]:
    return ("--model-path", "/models/Kimi-K2.5", "--tp", "16", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", addr)


@pytest.fixture(scope="module")
def nodes(lab_factory: Any) -> Iterator[tuple[Lab, int]]:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    lab = lab_factory(LabSpec(count=1, names=("n0",), server_args=_node_args(0, addr)),
                      LabSpec(count=1, names=("n1",), server_args=_node_args(1, addr)))
    yield lab, port


def _extra(port: int, value: int, *more: str) -> list[str]:
    return ["-e", json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": str(value)}, "sglang_deployment": "kimi",
                              "sglang_dist_port": port, "gpuops_health_timeout": 30, "gpuops_lease": LEASE}),
            *more]


def _env_file(lab: Lab, name: str) -> str:
    return (lab.host(name).state_dir / "sglang.env").read_text()


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read()
    except OSError:
        return 0, b""


def _settled(lab: Lab, value: int, timeout: float = 90) -> None:
    """Both nodes' launch files hold ``value``, the leader serves it, the worker answers /health:
    polled, since a rollback's restart may still be under way when the client returns."""
    want = f"NCCL_MIN_NCHANNELS='{value}'"
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        files = {n: want in _env_file(lab, n) for n in ("n0", "n1")}
        status, body = _get(lab.host("n0").server_port, "/get_server_info")
        served = json.loads(body).get("env", {}).get("NCCL_MIN_NCHANNELS") if status == 200 else None
        worker = _get(lab.host("n1").server_port, "/health")[0]
        seen = (files, served, worker)
        if all(files.values()) and served == str(value) and worker == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"not settled on {value}: files {seen[0]}, leader serves {seen[1]!r}, worker /health {seen[2]}")


def _baseline(run_gpuops: Any, lab: Lab, port: int) -> None:
    """Both nodes on NCCL_MIN_NCHANNELS=4 (a no-op when an earlier test left them there)."""
    code, hosts = _apply(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    _settled(lab, 4)


def _fault(lab: Lab, name: str, fault: dict[str, Any]) -> None:
    (lab.host(name).state_dir / "lab-fault.json").write_text(json.dumps(fault))


def _apply(run_gpuops: Any, lab: Lab, port: int, value: int, *more: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *_extra(port, value), *more,
                      timeout=300)
    return proc.returncode, json.loads(proc.stdout)["hosts"]


def test_serial_1_changes_both_nodes_as_one_server(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    lab, port = nodes
    code, hosts = _apply(run_gpuops, lab, port, 4, "--serial", "1")
    assert code == 0, hosts
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    _settled(lab, 4)
    status, body = _get(lab.host("n0").server_port, "/get_server_info")
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
    code, hosts = _apply(run_gpuops, lab, port, 5, "--check")
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
    _baseline(run_gpuops, lab, port)
    _fault(lab, failing, {"fail_at": phase})
    code, hosts = _apply(run_gpuops, lab, port, 6)
    assert code != 0
    assert hosts[failing]["status"] == "rolled_back", hosts
    # Before any server stopped, the other node may still be before its first write: refused, nothing changed.
    assert hosts[other]["status"] in (("rolled_back", "refused") if phase == "after_writes" else ("rolled_back",)), hosts
    assert f"node {failing} of deployment kimi failed" in hosts[other]["error"], hosts[other]
    _settled(lab, 4)


@pytest.mark.parametrize("phase", ["after_writes", "server_start", "confirm"])
def test_client_killed_rolls_back_every_node(nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any,
                                             phase: str) -> None:
    """gpuops SIGKILLed while the worker node waits (started, or healthy before the commit): both
    leases lapse, both nodes roll back by themselves, the server comes back on the old setting."""
    lab, port = nodes
    _baseline(run_gpuops, lab, port)
    earlier = {name: calls(lab.host(name)) for name in ("n0", "n1")}
    _fault(lab, "n1", {"pause_at": phase, "seconds": 60})
    proc = client(lab, "nccl-env", *_extra(port, 7), home=gpuops_home)
    where = paused(lab.host("n1"), phase, proc, earlier["n1"])
    kill("client", where, proc)
    proc.communicate()
    wait_host_settled(lab.host("n1"), where)
    _settled(lab, 4)
    for name in ("n0", "n1"):
        # Killed while n1 prepares (no server stopped yet), n0 may not have opened its run at all.
        ended = ("rolled_back", "finished", "unchanged") if phase == "after_writes" and name == "n0" else ("rolled_back",)
        # polled: n0's lease-lapse rollback journals its end just after its previous server is back
        deadline = time.monotonic() + 60
        while (events := [e for _, e in journal_events(lab.host(name))])[-1] not in ended \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert events[-1] in ended, (name, events[-3:])


@pytest.mark.parametrize(("killed", "phase"), [("n0", "health"), ("n0", "confirm"), ("n1", "after_writes"),
                                              ("n1", "health"), ("n1", "confirm")])
def test_worker_killed_on_either_node_rolls_back_every_node(nodes: tuple[Lab, int], gpuops_home: Path,
                                                            run_gpuops: Any, killed: str, phase: str) -> None:
    """A node's host-side worker dies (OOM killer) after its writes, during its health wait, or once
    it was verified: its relay rolls it back, the client aborts the other node, both come back on
    the old setting."""
    lab, port = nodes
    other = "n0" if killed == "n1" else "n1"
    _baseline(run_gpuops, lab, port)
    earlier = calls(lab.host(killed))
    _fault(lab, killed, {"pause_at": phase, "seconds": 60})
    proc = client(lab, "nccl-env", "--json", *_extra(port, 8), home=gpuops_home)
    where = paused(lab.host(killed), phase, proc, earlier)
    kill("worker", where, proc)
    out, _ = proc.communicate(timeout=240)
    hosts = json.loads(out)["hosts"]
    why = {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    assert hosts[killed]["status"] == "rolled_back", why
    # Killed before any server stopped, the other node may still be before its first write: refused, nothing changed.
    assert hosts[other]["status"] in (("rolled_back", "refused") if phase == "after_writes" else ("rolled_back",)), why
    _settled(lab, 4)


def test_rollback_undoes_every_node_as_one(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    """`gpuops rollback` of a run committed on both nodes: one node alone is refused (nothing
    changed), both together come back on the old setting with the server healthy, however slow one
    node is. Node 1 pauses in its rollback (restoring its files) for longer than the run's health
    timeout: without the nodes held together, node 0's previous leader waited alone for a node 1
    not yet back, its rollback failed and was undone (node 0 on 10, node 1 on 4: a split)."""
    lab, port = nodes
    _baseline(run_gpuops, lab, port)
    code, hosts = _apply(run_gpuops, lab, port, 10, "-e", json.dumps({"gpuops_health_timeout": 4}))
    assert code == 0, hosts
    _settled(lab, 10)
    inventory = str(lab.inventory_path)
    alone = run_gpuops("rollback", "-i", inventory, "-l", "n1", "--json", timeout=120)
    assert alone.returncode != 0
    refused = json.loads(alone.stdout)["hosts"]["n1"]
    assert refused["status"] == "refused" and "deployment kimi" in refused["error"] and "n0" in refused["error"], refused
    _settled(lab, 10)
    _fault(lab, "n1", {"pause_at": "rollback_restore", "seconds": 8})
    proc = run_gpuops("rollback", "-i", inventory, "--json", timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    _settled(lab, 4)


def test_a_node_left_out_by_limit_is_refused(nodes: tuple[Lab, int], run_gpuops: Any) -> None:
    lab, port = nodes
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "-l", "n1", *_extra(port, 9), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "n1: deployment kimi" in proc.stderr and "n0" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    _settled(lab, 4)


def test_inspect_shows_the_deployment_as_one_server(nodes: tuple[Lab, int], run_gpuops: Any,
                                                    tmp_path: Path) -> None:
    """The inventory names the deployment as a group var (as an operator writes it); inspect sees
    the two nodes as one server, healthy, on one configuration."""
    import yaml

    lab, port = nodes
    _baseline(run_gpuops, lab, port)
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
    _baseline(run_gpuops, lab, port)
    leader_pid = _pid(lab, "n0")
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["hosts"]["n1"]["sglang_env"]["GPUOPS_TEST_NODE"] = "one"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    proc = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", *_extra(port, 4), timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, hosts
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    assert hosts["n0"]["changed"] == 0 and any("restarted with the other nodes" in n for n in hosts["n0"]["notes"])
    assert "GPUOPS_TEST_NODE='one'" in _env_file(lab, "n1") and "GPUOPS_TEST_NODE" not in _env_file(lab, "n0")
    _settled(lab, 4)
    assert _pid(lab, "n0") != leader_pid  # the leader was restarted with its worker
    code, hosts = _apply(run_gpuops, lab, port, 4)  # back to the lab's own inventory: node 1 changes again
    assert code == 0 and "GPUOPS_TEST_NODE" not in _env_file(lab, "n1"), hosts
    _settled(lab, 4)


def _pid(lab: Lab, name: str) -> int:
    return int((lab.host(name).state_dir / "sglang.pid").read_text().split()[0])


def test_three_nodes_change_and_roll_back_as_one(lab_factory: Any, run_gpuops: Any) -> None:
    """Three nodes (TP 24 over 3 hosts): each launched with its own derived rank; node 1 failing
    after it was verified rolls all three back, and the server is healthy on the old setting."""
    from gpuops.lab.hosts import stop_lab

    port = free_port()
    names = ("m0", "m1", "m2")
    lab = lab_factory(*[LabSpec(count=1, names=(n,), server_args=(
        "--model-path", "/models/Kimi-K2.5", "--tp", "24", "--nnodes", "3", "--node-rank", str(rank),
        "--dist-init-addr", f"127.0.0.1:{port}")) for rank, n in enumerate(names)])
    try:
        def settled(value: int) -> None:
            deadline = time.monotonic() + 90
            while True:
                files = all(f"NCCL_MIN_NCHANNELS='{value}'" in _env_file(lab, n) for n in names)
                status, body = _get(lab.host("m0").server_port, "/get_server_info")
                served = json.loads(body).get("env", {}).get("NCCL_MIN_NCHANNELS") if status == 200 else None
                workers = [_get(lab.host(n).server_port, "/health")[0] for n in names[1:]]
                if files and served == str(value) and workers == [200, 200]:
                    return
                assert time.monotonic() < deadline, (files, served, workers)
                time.sleep(0.2)

        code, hosts = _apply(run_gpuops, lab, port, 4)
        assert code == 0 and all(hosts[n]["status"] == "finished" for n in names), hosts
        settled(4)
        for rank, name in enumerate(names):
            script = (lab.host(name).state_dir / "sglang-launch.sh").read_text()
            assert f"--nnodes 3 --node-rank {rank} --dist-init-addr 127.0.0.1:{port}" in script, script
        _fault(lab, "m1", {"fail_at": "confirm"})
        code, hosts = _apply(run_gpuops, lab, port, 6)
        assert code != 0 and all(hosts[n]["status"] == "rolled_back" for n in names), hosts
        settled(4)
    finally:
        stop_lab(lab.root)


def test_a_node_rolled_back_by_its_lease_is_not_left_beside_a_committed_one(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """Node 1 healthy and waiting for its commit, its session frozen (SIGSTOP of its relay): its
    lease lapses and it rolls back, which takes node 0's new server down while node 0 is still
    before its commit. Node 0 then gets its commit but does not commit a server that is gone:
    both nodes end on the old setting (before: node 0 committed 11 with no server running)."""
    import signal

    lab, port = nodes
    _baseline(run_gpuops, lab, port)
    earlier = {n: calls(lab.host(n)) for n in ("n0", "n1")}
    _fault(lab, "n0", {"pause_at": "confirm", "seconds": 15})  # node 0 verifies last, long after node 1
    # A short health timeout for this run: node 1's rollback by its lease waits for a leader that is
    # gone, and that wait (the run's timeout) is most of this test's time.
    proc = client(lab, "nccl-env", "--json", *_extra(port, 11), "-e", json.dumps({"gpuops_health_timeout": 6}),
                  home=gpuops_home)
    paused(lab.host("n0"), "confirm", proc, earlier["n0"])
    worker = _verified_worker(lab, "n1", earlier["n1"])  # node 1 waits for its commit
    time.sleep(2)  # the relay has passed "verified" on to gpuops (it pumps every POLL_S): gpuops waits at the commit
    os.kill(worker["relay"], signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 90
        while not {"rolled_back", "rollback_failed"} & {e for _, e in journal_events(lab.host("n1"))[-1:]}:
            assert time.monotonic() < deadline, "node 1 never rolled back by its lease"
            time.sleep(0.1)
    finally:
        os.kill(worker["relay"], signal.SIGCONT)
    out, _ = proc.communicate(timeout=240)
    hosts = json.loads(out)["hosts"]
    assert hosts["n0"]["status"] != "finished" and hosts["n1"]["status"] != "finished", hosts
    assert "NCCL_MIN_NCHANNELS='11'" not in _env_file(lab, "n0")
    _baseline(run_gpuops, lab, port)  # the next command: one server on one setting again


def _worker_of(host: Any, earlier: set[Path]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for progress in sorted(p / "progress.jsonl" for p in calls(host) - earlier):
            if progress.exists():
                for line in progress.read_text().splitlines():
                    record = json.loads(line) if line.strip() else {}
                    if record.get("event") == "worker":
                        return {"dir": progress.parent, "worker": record["pid"], "relay": record["relay"]}
        time.sleep(0.05)
    raise AssertionError("no worker")


def _verified(call_dir: Path) -> bool:
    progress = call_dir / "progress.jsonl"
    return progress.exists() and '"event": "verified"' in progress.read_text()


def _verified_worker(lab: Lab, name: str, earlier: set[Path]) -> dict[str, Any]:
    """The node's worker of this run (``_worker_of``), once it was verified (healthy, waiting for its commit)."""
    worker = _worker_of(lab.host(name), earlier)
    deadline = time.monotonic() + 60
    while not _verified(worker["dir"]):
        assert time.monotonic() < deadline, f"node {name} was never verified"
        time.sleep(0.05)
    return worker


# ---------------------------------------------------------------- gpuops rollback: whatever fails, one server


def _committed(run_gpuops: Any, lab: Lab, port: int, value: int) -> None:
    """Both nodes on the old setting 4, then ``value`` applied and committed (the run to undo)."""
    _baseline(run_gpuops, lab, port)
    code, hosts = _apply(run_gpuops, lab, port, value, "-e", json.dumps({"gpuops_health_timeout": 6}))
    assert code == 0, hosts
    _settled(lab, value)


def _rollback(run_gpuops: Any, lab: Lab, *more: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops("rollback", "-i", str(lab.inventory_path), "--json", *more, timeout=300)
    return proc.returncode, json.loads(proc.stdout)["hosts"]


@pytest.mark.parametrize("failing", ["n1", "n0"])
def test_a_rollback_failing_on_one_node_is_undone_on_every_node(nodes: tuple[Lab, int], run_gpuops: Any,
                                                                failing: str) -> None:
    """One node's previous server does not come healthy during `gpuops rollback` (the worker's, or
    the leader's): its rollback is undone, and so is every other node's, all restarted together on
    the configuration they ran before it; both said so, with the deployment's outcome. Before: the
    failing node undid its rollback alone (its server restarted beside a peer still on the old
    setting), and the others were aborted without being held together."""
    lab, port = nodes
    _committed(run_gpuops, lab, port, 12)
    before = {n: _pid(lab, n) for n in ("n0", "n1")}
    _fault(lab, failing, {"fail_at": "rollback_health", "times": 1})
    code, hosts = _rollback(run_gpuops, lab)
    assert code != 0
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "rolled_back", hosts
        assert "the rollback was undone" in hosts[name]["error"], hosts[name]
        outcome = [n for n in hosts[name]["notes"] if n.startswith("deployment kimi (n0, n1): ")]
        assert len(outcome) == 1 and f"node {failing} of deployment kimi failed" in outcome[0], hosts[name]["notes"]
        assert "every node restarted together on it, healthy" in outcome[0], outcome
    assert "injected fault at rollback_health" in hosts[failing]["error"]
    _settled(lab, 12)
    # Both servers are new processes: the undo restarted every node, not the failing one alone.
    assert all(_pid(lab, n) != before[n] for n in ("n0", "n1"))


def test_an_unreadable_record_on_one_node_releases_the_others_at_once(nodes: tuple[Lab, int],
                                                                      run_gpuops: Any) -> None:
    """Node 1's copy of the run's record (its manifest) is damaged: node 1 is refused, naming its
    file, and node 0, already held for it, is let go at once instead of at --timeout; nothing
    changed on either node."""
    lab, port = nodes
    _committed(run_gpuops, lab, port, 13)
    journal = lab.host("n1").state_dir / "journal.jsonl"
    run = [json.loads(l) for l in journal.read_text().splitlines() if '"started"' in l][-1]["run_id"]
    manifest = lab.host("n1").state_dir / "runs" / run / "manifest.json"
    good = manifest.read_bytes()
    manifest.write_bytes(good[: len(good) // 2])
    lines = {n: len((lab.host(n).state_dir / "journal.jsonl").read_text().splitlines()) for n in ("n0", "n1")}
    try:
        started = time.monotonic()
        code, hosts = _rollback(run_gpuops, lab, "--timeout", "90")
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
    _settled(lab, 13)


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
    _baseline(run_gpuops, lab, port)
    nccl = json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": "14"}, "gpuops_health_timeout": 6, "gpuops_lease": LEASE})
    proc = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", "-e", nccl, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _settled(lab, 14)
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
    _settled(lab, 4)
    assert "NCCL_MIN_NCHANNELS='14'" not in (solo.host("solo").state_dir / "sglang.env").read_text()


def test_client_killed_while_a_deployment_rollback_prepares_stops_no_server(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """gpuops SIGKILLed during `gpuops rollback` while node 1 restores its files (node 0 held
    before stopping its server): both leases lapse, both undo their rollback without touching a
    server, and the deployment stays on the run's setting, healthy, its servers never restarted."""
    lab, port = nodes
    _committed(run_gpuops, lab, port, 15)
    before = {n: _pid(lab, n) for n in ("n0", "n1")}
    earlier = calls(lab.host("n1"))
    _fault(lab, "n1", {"pause_at": "rollback_restore", "seconds": 6})
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
    _settled(lab, 15)
    assert {n: _pid(lab, n) for n in ("n0", "n1")} == before



def _split(run_gpuops: Any, lab: Lab, port: int, gpuops_home: Path, value: int, committed: str,
           kill: bool = True) -> tuple[str, bytes]:
    """Run ``value`` committed on node ``committed`` and rolled back on the other by its lease
    (``_between_commits``); returns the run id and the client's stdout (``kill``: it was killed)."""
    _baseline(run_gpuops, lab, port)
    run_id, out = _between_commits(lab, committed, lambda: client(
        lab, "nccl-env", "-v", "--json", *_extra(port, value), "-e",
        json.dumps({"gpuops_health_timeout": 6, "gpuops_lease": 8}), home=gpuops_home), kill)
    frozen = "n1" if committed == "n0" else "n0"
    if kill:
        assert f"NCCL_MIN_NCHANNELS='{value}'" in _env_file(lab, committed)
        assert f"NCCL_MIN_NCHANNELS='{value}'" not in _env_file(lab, frozen)  # split: the state this test is for
    return run_id, out


def _between_commits(lab: Lab, committed: str, start: Any, kill: bool = True) -> tuple[str, bytes]:
    """A run (``start()``: gpuops -v --json in its own process) committed on node ``committed`` and
    rolled back on the other by its lease, deterministically: the committing node holds at its
    confirm until released, the other's session is frozen (SIGSTOP of its relay) once gpuops has
    heard it verified, so the commit sent to it stays unread; once the first node has committed the
    client is SIGKILLed (unless not ``kill``), and the frozen node's lease lapses."""
    import signal
    import threading

    frozen = "n1" if committed == "n0" else "n0"
    earlier = {n: calls(lab.host(n)) for n in ("n0", "n1")}
    seen = {n: len(journal_events(lab.host(n))) for n in ("n0", "n1")}
    _fault(lab, committed, {"pause_at": "confirm", "seconds": 120, "until": "lab-release"})
    proc = start()
    heard: list[bytes] = []
    stderr = proc.stderr
    assert stderr is not None
    threading.Thread(target=lambda: heard.extend(iter(stderr.readline, b"")), daemon=True).start()
    paused(lab.host(committed), "confirm", proc, earlier[committed])
    worker = _worker_of(lab.host(frozen), earlier[frozen])
    deadline = time.monotonic() + 60
    while not any(f"{frozen}: run ".encode() in line and b"verified on the host" in line for line in heard):
        assert time.monotonic() < deadline and proc.poll() is None, b"".join(heard)[-2000:]
        time.sleep(0.05)
    os.kill(worker["relay"], signal.SIGSTOP)
    release = lab.host(committed).state_dir / "lab-release"
    try:
        release.touch()
        run_id = _wait_event(lab.host(committed), ("finished",), seen[committed])
        if kill:
            proc.kill()
            proc.communicate()
        _wait_event(lab.host(frozen), ("rolled_back", "rollback_failed"), seen[frozen], run_id)
    finally:
        os.kill(worker["relay"], signal.SIGCONT)
        release.unlink(missing_ok=True)
    if not kill:
        out, _ = proc.communicate(timeout=240)
        return run_id, out
    wait_host_settled(lab.host(frozen), worker)
    return run_id, b""


def _wait_event(host: Any, events: tuple[str, ...], after: int, run_id: str | None = None) -> str:
    """The run id of the run that ``host``'s journal (past its first ``after`` records) ends with one of ``events``."""
    deadline = time.monotonic() + 90
    while True:
        for rid, event in journal_events(host)[after:]:
            if event in events and run_id in (None, rid):
                return rid
        assert time.monotonic() < deadline, (events, journal_events(host)[-4:])
        time.sleep(0.1)


def _undone_on_both(lab: Lab, run_id: str) -> None:
    """Each node's journal: a finished rollback of ``run_id`` (the repair) that restarted its
    previous server, the node that had rolled the run back already too (with the others)."""
    for name in ("n0", "n1"):
        lines = (lab.host(name).state_dir / "journal.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        undone = [r for r in records if r["event"] == "finished" and r.get("kind") == "rollback"
                  and r.get("target") == run_id]
        assert undone and "previous server configuration restarted and healthy" in undone[-1].get("service", ""), \
            (name, records[-4:])


def test_a_split_left_by_a_killed_client_is_rolled_back_by_the_next_apply(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """Node 0 committed run 12, node 1's lease rolled it back (the client died between the two
    commit messages). `apply --check` names the split; the next `gpuops apply` first rolls the run
    back on every node as one (node 1 restarting with node 0), then goes on: the same old setting
    is then nothing to change. Before: the apply changed node 0 back by a run of its own while run
    12 still stood in its journal, and `--check` said nothing."""
    lab, port = nodes
    run_id, _ = _split(run_gpuops, lab, port, gpuops_home, 12, committed="n0")
    code, hosts = _apply(run_gpuops, lab, port, 4, "--check")
    assert code == 0 and any(f"deployment kimi is split: its run {run_id} committed on n0 and rolled back on n1" in w
                             for w in hosts["n1"]["warnings"]), hosts["n1"]
    code, hosts = _apply(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "unchanged", (name, hosts[name])
        assert any(f"its run {run_id} committed on n0" in n and "finished that rollback on every node" in n
                   for n in hosts[name]["notes"]), (name, hosts[name]["notes"])
    _settled(lab, 4)
    _undone_on_both(lab, run_id)


def test_a_split_left_by_a_killed_client_is_rolled_back_by_the_next_rollback(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any, tmp_path: Path) -> None:
    """The other way round: the worker (node 1) committed run 13 and the leader rolled it back.
    inspect names the split run and the command that repairs it; `gpuops rollback -l n0` is refused
    naming n1, nothing changed; `gpuops rollback` of both
    finishes the split run's rollback (and only that): both on the old setting, healthy, each
    journal with the rollback of run 13. Before: each node rolled back its own last run."""
    import yaml

    lab, port = nodes
    run_id, _ = _split(run_gpuops, lab, port, gpuops_home, 13, committed="n1")
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
    assert "NCCL_MIN_NCHANNELS='13'" in _env_file(lab, "n1")  # nothing changed
    proc = run_gpuops("rollback", "-i", str(inventory), "--json", timeout=300)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    _settled(lab, 4)
    _undone_on_both(lab, run_id)


def test_a_split_the_run_leaves_itself_is_rolled_back_before_it_returns(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any) -> None:
    """The same split with the client alive (node 1's session frozen past its lease while node 0
    committed): the apply itself rolls the run back on every node as one before it returns, and
    says so on both nodes. Before: node 0 reported "finished" for a server its partner's rollback
    had taken down, and stayed on 14."""
    lab, port = nodes
    run_id, out = _split(run_gpuops, lab, port, gpuops_home, 14, committed="n0", kill=False)
    hosts = json.loads(out)["hosts"]
    for name in ("n0", "n1"):
        assert hosts[name]["status"] == "rolled_back", (name, hosts[name]["status"], hosts[name]["error"])
        assert f"its run {run_id} committed on n0" in hosts[name]["error"], hosts[name]["error"]
        assert "rolled back on every node as one" in hosts[name]["error"], hosts[name]["error"]
    _settled(lab, 4)
    _undone_on_both(lab, run_id)


def test_a_rollback_split_between_its_commits_is_finished_by_the_next_apply(
        nodes: tuple[Lab, int], gpuops_home: Path, run_gpuops: Any, tmp_path: Path) -> None:
    """`gpuops rollback` of run 15 (committed on both) split the same way: its rollback committed on
    node 0, node 1's lease undid it (node 1 still on 15). The next `gpuops apply` of the old
    setting rolls run 15 back on node 1 with node 0 restarting beside it, then has nothing to do."""
    import yaml

    lab, port = nodes
    _baseline(run_gpuops, lab, port)
    code, hosts = _apply(run_gpuops, lab, port, 15)
    assert code == 0, hosts
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["vars"].update({"gpuops_lease": 8})
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    undo, _ = _between_commits(lab, "n0", lambda: client(lab, "rollback", "-v", "--json", "-i", str(inventory),
                                                         home=gpuops_home))
    applied = [r for r, e in journal_events(lab.host("n0")) if e == "finished"][-2]  # run 15, before the rollback
    assert "NCCL_MIN_NCHANNELS='4'" in _env_file(lab, "n0") and "NCCL_MIN_NCHANNELS='15'" in _env_file(lab, "n1")
    code, hosts = _apply(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error"), h.get("notes")) for n, h in hosts.items()}
    assert any(f"its run {applied} committed on n1 and rolled back on n0" in n for n in hosts["n0"]["notes"]), hosts
    _settled(lab, 4)
    _undone_on_both(lab, applied)
    assert undo != applied
