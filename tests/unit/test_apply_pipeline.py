"""The per-host pipeline's steps after the plan (apply/pipeline.py) and each strategy around it
(apply/replica_roll.py, apply/deployment_node.py, apply/release_step.py), on real plans, replicas
and deployment transactions; the connection is a stand-in that fails if any of these steps uses it
(they decide before the transaction: the transaction itself is what the integration tests run on
lab hosts: tests/integration/test_apply*.py, test_replica_roll.py, test_deployment_*.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuops.apply.deployment import DeploymentTxn
from gpuops.apply.deployment_node import DeploymentNode
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.host_gather import Gathered
from gpuops.apply.host_report import HostReport
from gpuops.apply.options import ApplyOptions
from gpuops.apply.pipeline import HostRun, Refusal, RunEnds, Strategy, run_steps
from gpuops.apply.release_step import ReleasePrep
from gpuops.apply.replica_roll import ReplicaRoll
from gpuops.apply.replicas import Replica
from gpuops.apply.router_api import Router
from gpuops.inventory.model import Host
from gpuops.multi_node import Deployment
from gpuops.plan.changes import HandlerRun, ServiceSpec
from gpuops.plan.model import Plan, PlanFacts
from gpuops.plan.planner import Discovery
from gpuops.transport import ConnectOptions

SERVICE = ServiceSpec(manager="process", name="sglang", state_dir="/var/lib/gpuops", port=30000, health_timeout=60,
                      grace=10)
RESTART = (HandlerRun(name="restart sglang", service=SERVICE),)


class UnusedConnection:
    """These steps decide before the transaction: any use of the host's connection is a bug
    (which host it reaches may be read)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the connection was used ({name}) before the transaction")


class Recorder(Strategy):
    """A strategy that writes down which of its hooks ran, and may end or refuse at one of them."""

    def __init__(self, calls: list[str], raise_at: str | None = None, error: Exception | None = None) -> None:
        self.calls, self.raise_at, self.error = calls, raise_at, error

    def _hook(self, name: str) -> None:
        self.calls.append(name)
        if name == self.raise_at and self.error is not None:
            raise self.error

    def planned(self, run: HostRun) -> None:
        self._hook("planned")

    def checked(self, run: HostRun) -> None:
        self._hook("checked")

    def ready(self, run: HostRun) -> None:
        self._hook("ready")

    def prepare(self, run: HostRun) -> None:
        self._hook("prepare")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "gpuops" / "journal.jsonl"


def _run(plan: Plan, check: bool = False, journal: list[dict[str, Any]] | None = None, host: str = "h1") -> HostRun:
    report = HostReport(host=host, ok=True, status="checked", changed=plan.changed,
                        handlers=[h.name for h in plan.handlers])
    inventory_host = Host(name=host, address="10.0.0.1", port=22, user="ops", key_file=None, connection="ssh",
                          groups=(), vars={})
    return HostRun(host=inventory_host,
                   role="nccl-env", extra=ExtraVars({}), discovery=Discovery(paths=(), needs_gate_scan=False, state_dir="/var/lib/gpuops",
                                                                  python="python3", warnings=()),
                   options=ApplyOptions(connect=ConnectOptions(), check=check), run_id="r1",
                   conn=UnusedConnection(inventory_host),  # type: ignore[arg-type]
                   deadline=None, facts=PlanFacts(host=host, files={}), gathered=Gathered(journal=journal or [], python=None, problems=[]),
                   plan=plan, report=report, restarts=bool(plan.handlers), pending=None)


def _plan(handlers: tuple[HandlerRun, ...] = (), service: ServiceSpec | None = SERVICE, starts: bool = False) -> Plan:
    return Plan(host="h1", role="nccl-env", changes=(), handlers=handlers, service=service, starts=starts)


def _home_lines(home: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in home.read_text().splitlines()] if home.exists() else []


# ---------------------------------------------------------------- the pipeline's steps


def test_check_mode_stops_after_the_strategies_have_said_what_a_run_would_do(home: Path) -> None:
    calls: list[str] = []
    report = run_steps(_run(_plan(RESTART), check=True), [Recorder(calls), Recorder(calls)])
    assert calls == ["planned", "planned", "checked", "checked"]  # never ready or prepare: nothing is done
    assert (report.ok, report.status) == (True, "checked")
    assert _home_lines(home) == []


def test_a_run_with_nothing_to_do_is_unchanged_and_journaled_at_home_without_preparing(home: Path) -> None:
    calls: list[str] = []
    report = run_steps(_run(_plan()), [Recorder(calls)])
    assert calls == ["planned", "ready"]  # a release is not readied for a run that changes nothing
    assert (report.ok, report.status, report.run_id) == (True, "unchanged", "r1")
    [line] = _home_lines(home)
    assert (line["run_id"], line["host"], line["outcome"], line["address"]) == ("r1", "h1", "unchanged", "ops@10.0.0.1:22")


def test_a_refusal_anywhere_is_the_report_refused_with_nothing_changed(home: Path) -> None:
    calls: list[str] = []
    run = _run(_plan(RESTART))
    run.report.changed = 3
    report = run_steps(run, [Recorder(calls, "planned", Refusal("router down; nothing changed")), Recorder(calls)])
    assert calls == ["planned"]  # the next strategy and every later step never ran
    assert (report.ok, report.status, report.changed, report.error) == (False, "refused", 0, "router down; nothing changed")
    assert _home_lines(home) == []


def test_a_journaled_refusal_is_a_line_in_the_home_journal(home: Path) -> None:
    report = run_steps(_run(_plan(RESTART)), [Recorder([], "prepare", Refusal("env refused", journaled=True))])
    assert report.status == "refused"
    [line] = _home_lines(home)
    assert (line["outcome"], line["error"]) == ("refused", "env refused")


def test_a_run_that_ends_early_keeps_its_report_and_is_not_journaled(home: Path) -> None:
    calls: list[str] = []
    run = _run(_plan(RESTART))
    run.report.status = "staged"
    report = run_steps(run, [Recorder(calls, "ready", RunEnds()), Recorder(calls)])
    assert calls == ["planned", "planned", "ready"]  # the second strategy is never readied, nothing prepared
    assert (report.ok, report.status, report.error) == (True, "staged", None)
    assert _home_lines(home) == []


def test_check_mode_warns_of_a_run_left_open_on_the_host() -> None:
    run = _run(_plan(), check=True)
    run.pending = {"run_id": "old1", "role": "fusion-sm120", "outcome": "unfinished"}
    report = run_steps(run, [])
    assert any(w.startswith("run old1 (fusion-sm120) is in progress or did not finish") for w in report.warnings)


# ---------------------------------------------------------------- the replica strategy


def _replica(**fields: Any) -> Replica:
    return Replica(host="h1", router=Router(url="http://127.0.0.1:1"), worker_url="http://10.0.0.1:30000",
                   drain_timeout_s=30, healthy_timeout_s=60, **fields)


def test_a_replica_the_router_does_not_list_is_refused_before_anything_changes() -> None:
    report = run_steps(_run(_plan(RESTART)), [ReplicaRoll(_replica(listed=False, listing="none"))])
    assert (report.status, report.changed) == ("refused", 0)
    assert report.error is not None and "is not one of router http://127.0.0.1:1's workers" in report.error


def test_check_mode_shows_a_replica_refusal_as_a_warning_and_its_drain_plan() -> None:
    report = run_steps(_run(_plan(RESTART), check=True), [ReplicaRoll(_replica(listed=False, listing="none"))])
    assert report.status == "checked"
    assert [w for w in report.warnings if w.startswith("apply would refuse: http://10.0.0.1:30000 is not one")]
    assert [n for n in report.notes if n.startswith("drain plan: ")]


def test_a_replica_whose_server_starts_shows_its_join_plan() -> None:
    report = run_steps(_run(_plan(RESTART, starts=True), check=True), [ReplicaRoll(_replica(listed=False))])
    assert [n for n in report.notes if n.startswith("join plan: http://10.0.0.1:30000 does not serve yet")]


def test_a_replica_with_nothing_to_restart_is_not_rolled() -> None:
    run = _run(_plan(RESTART))
    run.restarts = False

    def transaction(check: Any) -> None:
        raise AssertionError("unused")

    assert ReplicaRoll(_replica()).around(run, transaction) is transaction
    run.restarts = True
    assert ReplicaRoll(_replica()).around(run, transaction) is not transaction


# ---------------------------------------------------------------- the deployment strategy


def _deployment() -> DeploymentTxn:
    return DeploymentTxn(Deployment(name="kimi", members=("h1", "h2"), init_addr="10.0.0.1:5000"))


def test_a_node_with_nothing_to_change_restarts_with_the_other_nodes() -> None:
    txn = _deployment()
    other = threading.Thread(target=txn.planned, args=("h2", True))
    other.start()
    run = _run(_plan())
    run.restarts = False
    DeploymentNode(txn).planned(run)
    other.join(10)
    assert run.restarts and [h.name for h in run.plan.handlers] == ["restart sglang"]
    assert run.report.handlers == ["restart sglang"]
    assert run.report.notes == ["nothing to change here; restarted with the other nodes of deployment kimi"]


def test_a_node_whose_other_node_failed_is_refused() -> None:
    txn = _deployment()
    txn.fail("h2", "cannot read the files")
    with pytest.raises(Refusal, match="node h2 of deployment kimi failed: cannot read the files"):
        DeploymentNode(txn).planned(_run(_plan(RESTART)))


def test_check_mode_shows_the_nodes_place_and_waits_for_no_other() -> None:
    run = _run(_plan(RESTART), check=True, host="h2")
    DeploymentNode(_deployment()).planned(run)  # h1 never plans: a wait would hang here
    assert run.report.notes == [_deployment().deployment.plan_line("h2")]


def test_the_nodes_journal_record_rides_in_the_payload() -> None:
    payload: dict[str, Any] = {}
    DeploymentNode(_deployment()).commit_check(_run(_plan(RESTART)), payload, None)
    assert payload["deployment"] == {"name": "kimi", "rank": 0, "nnodes": 2, "members": ["h1", "h2"],
                                     "init_addr": "10.0.0.1:5000"}


# ---------------------------------------------------------------- the release strategy


def test_a_plan_without_a_release_leaves_the_release_strategy_idle() -> None:
    run = _run(_plan(RESTART))
    ReleasePrep().checked(run)
    ReleasePrep().prepare(run)  # the connection stand-in fails on any use
    assert (run.report.notes, run.report.warnings, run.report.status) == ([], [], "checked")
