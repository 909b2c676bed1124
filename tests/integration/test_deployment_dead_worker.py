"""A leader that does not notice a dead worker (apply/deployment_health.py, facts/deployment.py).

Two lab nodes whose leader is the stand-in's ``GPUOPS_STANDIN_LEADER_MISSES_DEAD_WORKER=1``: when
node 1's server dies, node 0 lives on, answers ``/health`` and ``/server_info``, and every
generation hangs, as a real leader whose collective waits for a vanished rank does. Judged by the
leader's health alone the deployment looks up; gpuops judges it by every node and the leader's
first answer. One lab for the module.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from test_apply_faults import calls, client, journal_events, paused
from deployment_nodes import extra_vars, http_get, node_args, put_fault, server_pid, settled, verified_worker

from gpuops.lab.hosts import Lab, LabSpec
from gpuops.lab.ports import free_port

pytestmark = pytest.mark.integration

UNNOTICING = {"GPUOPS_STANDIN_LEADER_MISSES_DEAD_WORKER": "1"}  # read by node 0 only: the same on both


@pytest.fixture(scope="module")
def nodes(lab_factory: Any) -> Iterator[tuple[Lab, int]]:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    lab = lab_factory(LabSpec(count=1, names=("n0",), server_args=node_args(0, addr), server_env=UNNOTICING),
                      LabSpec(count=1, names=("n1",), server_args=node_args(1, addr), server_env=UNNOTICING))
    yield lab, port


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower():
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.05)


def test_a_worker_dead_before_the_commit_rolls_every_node_back(nodes: tuple[Lab, int], gpuops_home: Path,
                                                                run_gpuops: Any) -> None:
    """Node 1 verified and waiting for the commit, its server is killed while the leader still
    waits at its health check; the leader then passes its health (it did not notice), but gives no
    first answer: every node rolls back and the server is healthy on the old setting. Judged by
    the leader's health, node 0 committed 6 while node 1 rolled back to 4: a split (repaired only
    afterwards, by the split repair), and a server that hangs every request."""
    lab, port = nodes
    code, hosts = _apply_json(run_gpuops, lab, port, 4)
    assert code == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    settled(lab, 4)
    earlier = {n: calls(lab.host(n)) for n in ("n0", "n1")}
    # The leader held at its health check until the test lets it go (after the kill): no race.
    put_fault(lab, "n0", {"pause_at": "health", "seconds": 90, "until": "release-n0"})
    proc = client(lab, "nccl-env", "--json", *extra_vars(port, 6),
                  "-e", json.dumps({"sglang_deployment_answer_timeout": 4}), home=gpuops_home)
    paused(lab.host("n0"), "health", proc, earlier["n0"])
    verified_worker(lab, "n1", earlier["n1"])  # node 1 waits for its commit
    victim = server_pid(lab, "n1")
    os.kill(victim, signal.SIGKILL)
    _wait_gone(victim)
    (lab.host("n0").state_dir / "release-n0").write_text("go\n")
    out, err = proc.communicate(timeout=240)
    hosts = json.loads(out)["hosts"]
    assert proc.returncode != 0, hosts
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "rolled_back", \
        {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    assert "the leader gave no first answer" in hosts["n0"]["error"], hosts["n0"]
    # Never committed, not even for a moment (a split repaired afterwards would show "finished").
    assert "finished" not in {e for r, e in journal_events(lab.host("n0")) if r == hosts["n0"]["run_id"]}
    assert "node n0 of deployment kimi failed" in hosts["n1"]["error"], hosts["n1"]
    settled(lab, 4)


def test_inspect_names_the_dead_worker_while_the_leader_answers_health(nodes: tuple[Lab, int], run_gpuops: Any,
                                                                        tmp_path: Path) -> None:
    import yaml

    lab, port = nodes
    code, hosts = _apply_json(run_gpuops, lab, port, 4)
    assert code == 0, hosts
    settled(lab, 4)
    victim = server_pid(lab, "n1")
    os.kill(victim, signal.SIGKILL)
    _wait_gone(victim)
    assert http_get(lab.host("n0").server_port, "/health")[0] == 200  # the leader did not notice
    data = yaml.safe_load(lab.inventory_path.read_text())
    data["all"]["children"]["lab"]["vars"].update({"sglang_deployment": "kimi", "sglang_dist_port": port,
                                                   "sglang_deployment_answer_timeout": 3})
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    proc = run_gpuops("inspect", "host", "-i", str(inventory), "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    kimi = json.loads(proc.stdout)["deployments"]["kimi"]
    assert kimi["nodes"]["n0"]["healthy"] is True and kimi["nodes"]["n1"]["running"] is False, kimi
    assert kimi["serving"] is False, kimi
    assert any(w.startswith("n1 (node 1) runs no SGLang server: the deployment is down, although its leader n0 "
                            "answers /health") for w in kimi["warnings"]), kimi["warnings"]
    # The next change restarts both nodes together: one server again, the hung leader replaced.
    code, hosts = _apply_json(run_gpuops, lab, port, 5)
    assert code == 0, {n: (h["status"], h.get("error")) for n, h in hosts.items()}
    settled(lab, 5)


def _apply_json(run_gpuops: Any, lab: Lab, port: int, value: int, *more: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--json", *extra_vars(port, value), *more,
                      timeout=300)
    return proc.returncode, json.loads(proc.stdout)["hosts"]
