"""The per-host rollback pipeline (apply/rollback_pipeline.py) and each strategy around it: a
deployment's node (apply/rollback_node.HeldRollback) and a recomposition (apply/recompose.Recompose).

The steps run for real over a local connection: the host helper undoes a run it applied in a temp
tree (as tests/integration/test_apply_helper.py drives it); the strategies are tested alone on real
``DeploymentRollbacks`` and helper answers. Multi-node and recomposed rollbacks on lab hosts:
tests/integration/test_deployment_rollback.py, test_deployment_split.py, test_rollback_recompose.py."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuops.apply.host_report import HostReport
from gpuops.apply.options import ApplyOptions
from gpuops.apply.recompose import Recompose
from gpuops.apply.remote_exec import run_helper
from gpuops.apply.rollback_node import DeploymentRollbacks, HeldRollback
from gpuops.apply.rollback_pipeline import (RollbackRun, RollbackStrategy, Undone, helper_report, journal_home,
                                            rollback_host)
from gpuops.apply.undo import rollback_hosts, rollback_strategies
from gpuops.errors import GpuopsError
from gpuops.inventory.model import Host
from gpuops.remote import host_protocol as hp
from gpuops.remote.host_protocol import HelperResult, HostEvent
from gpuops.transport import ConnectOptions, connect


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home-state"))
    return tmp_path / "home-state" / "gpuops" / "journal.jsonl"


def _home_lines(home: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in home.read_text().splitlines()] if home.exists() else []


def _local(state: Path, name: str = "h1") -> Host:
    return Host(name=name, address=None, port=None, user=None, key_file=None, groups=(), connection="local",
                vars={"gpuops_state_dir": str(state), "gpuops_python": sys.executable})


def _run(host: Host, target: str | None = "r1", state_dir: str = "/var/lib/gpuops") -> RollbackRun:
    return RollbackRun(host=host, target=target, run_id="rb1", options=ApplyOptions(connect=ConnectOptions()),
                       deadline=time.monotonic() + 120, state_dir=state_dir)


def _applied(tmp_path: Path) -> tuple[Host, Path, Path]:
    """A host (local) where run r1 changed one file from b"old" to b"new", through the real helper."""
    state, target = tmp_path / "state", tmp_path / "etc" / "a.conf"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    host = _local(state)
    change = {"path": str(target), "after_b64": base64.b64encode(b"new\n").decode(), "mode": None,
              "before_sha256": hashlib.sha256(b"old\n").hexdigest(), "after_sha256": hashlib.sha256(b"new\n").hexdigest()}
    payload = {"mode": "apply", "run_id": "r1", "state_dir": str(state), "meta": {"role": "test", "user": "me"},
               "changes": [change], "compile": [], "handlers": [], "service": None, "audit": None}
    conn = connect(host, ConnectOptions())
    try:
        applied = run_helper(conn, dict(host.vars or {}), payload, deadline=time.monotonic() + 120,
                             on_audit=lambda out: (True, "judged"))
    finally:
        conn.close()
    assert applied.status == "finished" and target.read_bytes() == b"new\n", applied
    return host, state, target


class Recorder(RollbackStrategy):
    """A strategy that writes down which of its hooks ran, and with what."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events: list[str] = []

    def payload(self, run: RollbackRun, payload: dict[str, Any]) -> None:
        self.calls.append(f"payload {payload['mode']} {payload['target']}")

    def commit_check(self, run: RollbackRun, check: Any) -> Any:
        self.calls.append("commit_check")
        return check

    def helper_hooks(self, run: RollbackRun) -> dict[str, Any]:
        self.calls.append("helper_hooks")
        return {}

    def on_event(self, run: RollbackRun, event: HostEvent) -> None:
        self.events.append(event.name)

    def ended(self, run: RollbackRun, ok: bool, error: str) -> None:
        self.calls.append(f"ended {ok} {error}")

    def answered(self, run: RollbackRun, conn: Any, result: HelperResult) -> Undone | None:
        self.calls.append(f"answered {result.status}")
        return None

    def reported(self, run: RollbackRun, report: HostReport) -> None:
        self.calls.append(f"reported {report.status}")


# ---------------------------------------------------------------- the steps, on a real helper


def test_a_rollback_runs_every_step_with_the_strategies_and_journals_at_home(tmp_path: Path, home: Path) -> None:
    host, state, target = _applied(tmp_path)
    recorder = Recorder()
    report = rollback_host(_run(host, "r1", str(state)), [recorder])
    assert target.read_bytes() == b"old\n"  # undone from the run's backup
    assert (report.ok, report.status, report.run_id, report.restored, report.changed) == \
        (True, "finished", "rb1", [str(target)], 1)
    assert report.notes[-1].startswith("undid run r1: ")
    assert recorder.calls == ["payload rollback r1", "commit_check", "helper_hooks", "ended True finished",
                              "answered finished", "reported finished"]
    assert recorder.events  # the helper's progress reached the strategies
    [line] = _home_lines(home)
    assert (line["run_id"], line["host"], line["role"], line["outcome"], line["target"], line["state_dir"]) == \
        ("rb1", "h1", "rollback", "finished", "r1", str(state))
    assert line["changes"] == [{"path": str(target)}] and "recompose" not in line


def test_rollback_hosts_chooses_the_strategies_and_undoes_the_run(tmp_path: Path, home: Path) -> None:
    host, state, target = _applied(tmp_path)
    reports = rollback_hosts([host], "r1", ApplyOptions(connect=ConnectOptions()))
    assert (reports["h1"].ok, reports["h1"].status) == (True, "finished")
    assert target.read_bytes() == b"old\n"
    assert [line["target"] for line in _home_lines(home)] == ["r1"]


def test_a_host_that_cannot_be_reached_tells_the_strategies_and_fails(tmp_path: Path) -> None:
    unreachable = Host(name="h1", address="127.0.0.1", port=1, user="nobody", key_file=None, groups=(),
                       connection="ssh", vars={})
    recorder = Recorder()
    run = _run(unreachable)
    run.options = ApplyOptions(connect=ConnectOptions(connect_timeout=5))
    with pytest.raises(GpuopsError):
        rollback_host(run, [recorder])
    [ended] = recorder.calls
    assert ended.startswith("ended False ") and len(ended) > len("ended False ")  # why, for the waiting nodes


def test_the_helper_answer_reads_as_the_report() -> None:
    done = helper_report("h1", "rb1", HelperResult(status="finished", ok=True, restored=("/etc/a",), notes=("n",),
                                                   kept=("/etc/b",), target="r1", service="restarted sglang"))
    assert (done.ok, done.changed, done.error) == (True, 1, None)
    assert done.notes == ["n", "undid run r1: restarted sglang", "--force: the later version of /etc/b"]
    undone = helper_report("h1", "rb1", HelperResult(status="rolled_back", restored=("/etc/a",), error="unhealthy"))
    assert (undone.ok, undone.changed) == (False, 0)
    assert undone.error == "unhealthy -- the rollback was undone: the host is as it was before it"
    refused = helper_report("h1", "rb1", HelperResult(status="refused", error="no run to undo"))
    assert (refused.status, refused.error) == ("refused", "no run to undo")


def test_only_a_recomposition_is_journaled_as_one(home: Path) -> None:
    run = _run(_local(Path("/nonexistent")))
    report = HostReport(host="h1", ok=True, status="finished", restored=["/etc/a"])
    journal_home(run, Undone(report, "r1"))
    journal_home(run, Undone(report, "r0", recompose=True))
    plain, recomposed = _home_lines(home)
    assert "recompose" not in plain and plain["target"] == "r1"
    assert recomposed["recompose"] is True and recomposed["target"] == "r0"


# ---------------------------------------------------------------- the deployment strategy


_RECORD = {"name": "kimi", "rank": 1, "nnodes": 2, "members": ["n0", "n1"], "init_addr": "10.0.0.1:20000"}


def _node(deployments: DeploymentRollbacks, name: str, finish_split: bool = False) -> tuple[HeldRollback, RollbackRun, Any]:
    strategy, run = HeldRollback(deployments, finish_split), _run(_local(Path("/nonexistent"), name))
    hooks = strategy.helper_hooks(run)
    hooks["on_open"](lambda message: True)
    return strategy, run, hooks["on_hold"]


def test_a_host_whose_run_was_its_own_is_no_node_and_lets_a_waiting_deployment_go() -> None:
    deployments = DeploymentRollbacks([["n0", "n1"]], forks=16)
    strategy, run, on_hold = _node(deployments, "n0")
    check = strategy.commit_check(run, None)
    assert check is not None and check() == (True, None)  # no deployment's commit to wait for
    strategy.ended(run, True, "finished")
    strategy.reported(run, HostReport(host="n0", ok=True, status="finished"))
    txn, why = deployments.join("n1", _RECORD)  # n1's run names n0, which will never join
    assert txn is None and why is not None and "its own rollback ended" in why
    assert deployments.txns() and deployments.reports_of(deployments.txns()[0], {"n0": HostReport("n0", True, "")}) == {}


def test_a_node_whose_deployment_is_not_all_in_the_rollback_is_refused_at_its_first_hold() -> None:
    deployments = DeploymentRollbacks([["n1"]], forks=16)
    strategy, run, on_hold = _node(deployments, "n1")
    strategy.on_event(run, HostEvent(hp.EVENT_STOP_READY, deployment=_RECORD, manifest="/s/runs/r1/manifest.json"))
    go, why = on_hold(hp.EVENT_STOP_READY)
    assert go is False and why is not None and "other nodes n0 are not in this rollback" in why
    assert strategy.txn is None
    assert on_hold(hp.EVENT_STOPPED) == (False, "not a node of a deployment")


def test_the_nodes_of_a_deployment_join_one_rollback_and_are_reported_together() -> None:
    deployments = DeploymentRollbacks([["n0", "n1"]], forks=16)
    nodes = {name: _node(deployments, name) for name in ("n0", "n1")}
    answers: dict[str, Any] = {}

    def first_hold(name: str) -> None:
        strategy, run, on_hold = nodes[name]
        strategy.on_event(run, HostEvent(hp.EVENT_STOP_READY, deployment=_RECORD, manifest="m"))
        answers[name] = on_hold(hp.EVENT_STOP_READY)

    threads = [threading.Thread(target=first_hold, args=(name,)) for name in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {"n0": (True, None), "n1": (True, None)}  # each let go once both were there
    [txn] = deployments.txns()
    assert nodes["n0"][0].txn is nodes["n1"][0].txn is txn and txn.deployment.members == ("n0", "n1")
    reports = {name: HostReport(host=name, ok=True, status="finished") for name in nodes}
    nodes["n0"][0].reported(nodes["n0"][1], reports["n0"])
    assert list(deployments.reports_of(txn, reports)) == ["n0"]  # n1 never ended with a report
    nodes["n1"][0].reported(nodes["n1"][1], reports["n1"])
    assert list(deployments.reports_of(txn, reports)) == ["n0", "n1"]


def test_a_node_that_failed_makes_the_others_wait_for_nothing() -> None:
    deployments = DeploymentRollbacks([["n0", "n1"]], forks=16)
    strategy, run, _ = _node(deployments, "n0")
    strategy.ended(run, False, "cannot read the journal")
    txn, why = deployments.join("n1", _RECORD)
    assert txn is None and why is not None and "(cannot read the journal)" in why


def test_finish_split_rides_in_the_payload_only_when_asked() -> None:
    deployments = DeploymentRollbacks([["n0"]], forks=16)
    plain: dict[str, Any] = {}
    HeldRollback(deployments).payload(_run(_local(Path("/x"))), plain)
    split: dict[str, Any] = {}
    HeldRollback(deployments, finish_split=True).payload(_run(_local(Path("/x"))), split)
    assert plain == {} and split == {"finish_split": True}


# ---------------------------------------------------------------- the recomposition strategy


class UnusedConnection:
    """The recomposition decides this without the host: any use of its connection is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connection was used ({name})")


def test_a_helper_answer_other_than_later_runs_stand_leaves_recomposition_idle() -> None:
    answer = HelperResult(status="finished", ok=True, target="r1")
    assert Recompose().answered(_run(_local(Path("/x"))), UnusedConnection(), answer) is None  # type: ignore[arg-type]


def test_a_recomposition_that_cannot_be_done_is_refused_and_journaled_as_one(home: Path) -> None:
    # The journal the helper sent still shows a run open: nothing is recomposed over it.
    records = ({"run_id": "r0", "event": "started", "role": "nccl-env", "changes": []},)
    answer = HelperResult(status=hp.STATUS_LATER_RUNS_STAND, error="later runs stand on its files: r2",
                          recovered=("rolled back r9",), notes=("journal read",), records=records)
    run = _run(_local(Path("/nonexistent")), target="r1")
    undone = Recompose().answered(run, UnusedConnection(), answer)  # type: ignore[arg-type]
    assert undone is not None and (undone.target, undone.recompose) == ("r1", True)
    report = undone.report
    assert (report.ok, report.status, report.error) == (False, "refused", "later runs stand on its files: r2")
    assert (report.recovered, report.notes, report.run_id) == (["rolled back r9"], ["journal read"], "rb1")


def test_every_host_gets_a_deployment_node_then_a_recomposition() -> None:
    chosen = rollback_strategies(DeploymentRollbacks([["h1"]], forks=1), finish_split=True)
    assert [type(s) for s in chosen] == [HeldRollback, Recompose]
    assert chosen[0].finish_split is True  # type: ignore[attr-defined]
