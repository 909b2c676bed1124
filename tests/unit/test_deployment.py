"""A multi-node server's nodes (apply/deployment.py): ranks, init address, the launch flags the
sglang-service role renders for each node, the inventory's contradictions refused naming the host,
and the two-phase commit's holds (threads, no hosts)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpuops import multi_node as dep
from gpuops.apply.deployment import DeploymentTxn
from gpuops.errors import GpuopsError
from gpuops.inventory import Host
from gpuops.remote import host_protocol as hp


def _host(name: str, address: str | None = None, **variables: Any) -> Host:
    return Host(name=name, address=address, port=None, user=None, key_file=None, connection="ssh", groups=("all",),
                vars={"sglang_deployment": "kimi", **variables})


def test_ranks_follow_inventory_order_and_the_leader_gives_the_init_address() -> None:
    found = dep.plan_deployments([_host("a", "10.0.0.1"), _host("b", "10.0.0.2"), _host("c", "10.0.0.3")], {})
    kimi = found["kimi"]
    assert kimi.members == ("a", "b", "c") and kimi.init_addr == "10.0.0.1:20000"
    assert kimi.launch_flags("c") == ["--nnodes", "3", "--node-rank", "2", "--dist-init-addr", "10.0.0.1:20000"]


def test_sglang_node_rank_and_dist_port_decide_when_given() -> None:
    hosts = [_host("a", "10.0.0.1", sglang_node_rank=1), _host("b", "fd00::2", sglang_node_rank=0,
                                                                sglang_dist_port=5000)]
    kimi = dep.plan_deployments(hosts, {})["kimi"]
    assert kimi.members == ("b", "a") and kimi.init_addr == "[fd00::2]:5000"


@pytest.mark.parametrize("hosts, message", [
    ([_host("a", sglang_node_rank=0), _host("b")], "b: sglang_node_rank is set on other nodes"),
    ([_host("a", sglang_node_rank=0), _host("b", sglang_node_rank=0)], "b: sglang_node_rank 0 is also a's"),
    ([_host("a", sglang_node_rank=0), _host("b", sglang_node_rank=2)], "b: sglang_node_rank 2 is outside 0..1"),
    ([_host("a", sglang_node_rank="x"), _host("b", sglang_node_rank=1)], "a: sglang_node_rank must be a whole"),
    ([_host("a", sglang_dist_port=70000), _host("b")], "a: sglang_dist_port must be a TCP port"),
    ([_host("a", "10.0.0.1", sglang_args=["--tp", "16", "--nnodes", "3"]), _host("b")],
     "a: the launch flags say --nnodes 3 but deployment kimi has 2 nodes (a, b)"),
    ([_host("a", "10.0.0.1"), _host("b", sglang_extra_args=["--node-rank=0"])],
     "b: the launch flags say --node-rank 0 but it is node 1 of deployment kimi"),
    ([_host("a", "10.0.0.1"), _host("b", sglang_args=["--dist-init-addr", "10.0.0.9:20000"])],
     "b: the launch flags say --dist-init-addr 10.0.0.9:20000 but deployment kimi's leader a is at 10.0.0.1:20000"),
])
def test_contradictions_are_one_line_naming_the_host(hosts: list[Host], message: str) -> None:
    with pytest.raises(GpuopsError) as err:
        dep.plan_deployments(hosts, {})
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_flags_that_agree_are_accepted() -> None:
    hosts = [_host("a", "10.0.0.1", sglang_args=["--nnodes", "2", "--node-rank", "0"]),
             _host("b", sglang_args=["--dist-init-addr=10.0.0.1:20000", "--node-rank", "1"])]
    assert dep.plan_deployments(hosts, {})["kimi"].nnodes == 2


def test_a_run_leaving_a_node_out_is_refused() -> None:
    a, b, c = _host("a"), _host("b"), Host(name="c", address=None, port=None, user=None, key_file=None,
                                         connection="ssh", groups=("all",), vars={})
    dep.check_whole([a, b], [a, b, c], {})
    with pytest.raises(GpuopsError, match="^b: deployment kimi also has a, left out of this run"):
        dep.check_whole([b, c], [a, b, c], {})


def test_the_role_renders_each_nodes_derived_flags_into_the_launch() -> None:
    """The launch script the sglang-service role writes for node 1 carries its rank (not the
    inventory's flags alone: they name none here)."""
    from gpuops.plan.model import FileState, PlanFacts
    from gpuops.plan.planner import discover, plan_role

    hosts = [_host("a", "10.0.0.1"), _host("b", "10.0.0.2")]
    kimi = dep.plan_deployments(hosts, {})["kimi"]
    node = dep.with_launch_flags(hosts[1], kimi)
    role_vars = {**dict(node.vars), "sglang_manager": "process", "sglang_args": ["--model-path", "/m", "--tp", "16"],
                 "gpuops_state_dir": "/var/lib/gpuops"}
    paths = discover("sglang-service", "b", role_vars, {}).paths
    facts = PlanFacts(host="b", files={p: FileState(path=p, exists=False) for p in paths})
    script = next(c.after for c in plan_role("sglang-service", facts, role_vars, {}).changes
                  if c.path.endswith("sglang-launch.sh"))
    assert "--tp 16 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:20000" in script, script


# ---------------------------------------------------------------- the two-phase commit's holds


def _txn(n: int = 3) -> DeploymentTxn:
    return DeploymentTxn(dep.Deployment("kimi", tuple(f"n{i}" for i in range(n)), "10.0.0.1:20000"))


def _in_threads(txn: DeploymentTxn, point: str, names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    order: list[str] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        result = txn.hold(name, point)
        with lock:
            out[name] = result
            order.append(name)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a hold never returned"
    out["order"] = order
    return out


def test_every_node_goes_on_only_when_all_reached_the_point_and_the_leader_starts_last() -> None:
    txn = _txn()
    out = _in_threads(txn, hp.EVENT_STOPPED, ["n0", "n1", "n2"])
    assert out["n0"] == out["n1"] == out["n2"] == (True, None)
    assert out["order"][-1] == "n0", out["order"]  # workers let go before the leader


def test_one_node_failing_releases_the_others_with_its_reason_and_aborts_them() -> None:
    txn = _txn(2)
    sent: list[dict[str, Any]] = []
    txn.opened("n0", lambda m: sent.append(m) or True)
    txn.opened("n1", lambda m: True)
    waiting: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: waiting.update(r=txn.hold("n0", txn.VERIFIED)))
    thread.start()
    txn.ended("n1", False, "injected fault at health")
    thread.join(10)
    assert waiting["r"] == (False, "node n1 of deployment kimi failed: injected fault at health")
    assert sent == [{"abort": "node n1 of deployment kimi failed: injected fault at health"}]


def test_a_rollback_hold_waits_for_every_node_even_after_a_failure() -> None:
    txn = _txn(2)
    txn.fail("n1", "health")
    out = _in_threads(txn, hp.EVENT_ROLLBACK_STOPPED, ["n0", "n1"])
    assert out["n0"] == out["n1"] == (True, None) and out["order"] == ["n1", "n0"]


def test_when_one_node_restarts_every_node_does() -> None:
    txn = _txn(2)
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(n0=txn.planned("n0", True)))
    thread.start()
    got["n1"] = txn.planned("n1", False)
    thread.join(10)
    assert got == {"n0": None, "n1": None} and txn.restarts()


def _gates(txn: DeploymentTxn, checks: dict[str, Any], seen: list[str]) -> dict[str, Any]:
    """Every node's commit gate run in its own thread, with ``checks[name]`` as its node check
    (apply/deployment_health.py); ``seen``: the checks in the order they ran."""
    out: dict[str, Any] = {}

    def check_of(name: str) -> Any:
        def check() -> tuple[bool, str | None]:
            seen.append(name)
            return checks[name]
        return check

    threads = [threading.Thread(target=lambda n=n: out.update({n: txn.commit_gate(n, None, check_of(n))()}))
               for n in txn.deployment.members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a gate never returned"
    return out


def test_the_commit_waits_for_the_leaders_first_answer_then_every_workers_check() -> None:
    txn = _txn(3)
    seen: list[str] = []
    out = _gates(txn, {"n0": (True, None), "n1": (True, None), "n2": (True, None)}, seen)
    assert out == {"n0": (True, None), "n1": (True, None), "n2": (True, None)}
    assert seen[0] == "n0" and sorted(seen[1:]) == ["n1", "n2"]  # the workers are judged after the answer


def test_a_leader_without_a_first_answer_rolls_back_every_node_unasked() -> None:
    """The leader's /health answered (it was verified) but it gives no answer: no node commits."""
    txn = _txn(2)
    seen: list[str] = []
    out = _gates(txn, {"n0": (False, "the leader gave no first answer: timed out"), "n1": (True, None)}, seen)
    assert out["n0"] == (False, "the leader gave no first answer: timed out")
    assert out["n1"] == (False, "node n0 of deployment kimi failed: the leader gave no first answer: timed out")
    assert seen == ["n0"]


def test_a_dead_worker_stops_every_node_from_committing_even_with_the_leader_answering() -> None:
    txn = _txn(3)
    seen: list[str] = []
    gone = "its server (pid 7) exited after its health check"
    out = _gates(txn, {"n0": (True, None), "n1": (True, None), "n2": (False, gone)}, seen)
    assert out["n2"] == (False, gone)
    assert out["n0"] == out["n1"] == (False, f"node n2 of deployment kimi failed: {gone}")


def test_a_workers_log_tells_a_failed_peer_by_the_releases_own_lines() -> None:
    from gpuops.remote.node_health import peer_failure

    assert peer_failure(["INFO the server is fired up", "INFO Prefill batch"]) is None
    # SGLang 0.5.8 engine.py:988 on a node of rank > 0, and its SIGQUIT handler (engine.py:823).
    assert peer_failure(["x", "[2026] ERROR Scheduler or DataParallelController 4242 terminated with -9"]) \
        == "[2026] ERROR Scheduler or DataParallelController 4242 terminated with -9"
    assert peer_failure(["Received sigquit from a child process. It usually means the child failed."])
    assert peer_failure(["NCCL error: remote process exited or there was a network error (node 0 is gone)"])


# ---------------------------------------------------------------- inspect: one server


def _entry(rank: int, env: dict[str, str] | None = None, version: str = "0.5.8", running: bool = True,
           **args: Any) -> dict[str, Any]:
    flags = {"model_path": "/m", "tp_size": "16", "nnodes": "2", "node_rank": str(rank),
             "dist_init_addr": "10.0.0.1:20000", "port": str(30000 + rank), **args}
    return {"ok": True, "facts": {"server": {"running": running, "healthy": running, "args": flags,
                                             "env": env or {"NCCL_MIN_NCHANNELS": "4"}},
                                  "software": {"sglang": {"version": version}}}}


def test_inspect_sees_one_deployment_with_its_nodes() -> None:
    from gpuops.facts.deployment import deployments_json, report_lines

    hosts = [_host("a", "10.0.0.1"), _host("b", "10.0.0.2")]
    view = deployments_json(hosts, {"a": _entry(0), "b": _entry(1)})
    kimi = view["deployments"]["kimi"]
    assert kimi["members"] == ["a", "b"] and kimi["leader"] == "a" and kimi["warnings"] == []
    assert kimi["nodes"]["b"]["role"] == "worker" and kimi["nodes"]["b"]["launch"]["node_rank"] == "1"
    text = [line for line, _ in report_lines(view)]
    assert text[0].startswith("== deployment kimi: one SGLang server over 2 nodes (leader a")


@pytest.mark.parametrize("entries, warning", [
    ({"a": _entry(0), "b": _entry(1, {"NCCL_MIN_NCHANNELS": "8"})},
     "b runs a different configuration from a (a split deployment): NCCL_MIN_NCHANNELS='8' vs '4'"),
    ({"a": _entry(0), "b": _entry(1, version="0.5.9")}, "b runs SGLang 0.5.9, a 0.5.8"),
    ({"a": _entry(0), "b": _entry(1, running=False)}, "b (node 1) runs no SGLang server"),
    ({"a": _entry(0), "b": _entry(0)}, "b runs --node-rank 0, the inventory makes it 1"),
    ({"a": _entry(0), "b": _entry(1, cuda_graph_max_bs="8")}, "--cuda-graph-max-bs '8' vs None"),
    ({"a": _entry(0), "b": {"ok": False, "error": "connection refused"}}, "b (node 1) did not answer"),
    # The leader that did not notice: its /health still answers.
    ({"a": _entry(0), "b": _entry(1, running=False)},
     "b (node 1) runs no SGLang server: the deployment is down, although its leader a answers /health"),
])
def test_inspect_warns_of_a_split_or_broken_deployment(entries: dict[str, Any], warning: str) -> None:
    from gpuops.facts.deployment import deployments_json

    view = deployments_json([_host("a", "10.0.0.1"), _host("b", "10.0.0.2")], entries)
    warnings = view["deployments"]["kimi"]["warnings"]
    assert any(warning in w for w in warnings), warnings


def test_a_deployment_serves_only_with_every_node_up_and_the_leaders_first_answer() -> None:
    from gpuops.facts.deployment import deployments_json, report_lines

    hosts = [_host("a", "10.0.0.1"), _host("b", "10.0.0.2")]
    up = {"a": _entry(0), "b": _entry(1)}
    answered = deployments_json(hosts, up, answers={"kimi": {"ok": True, "error": None, "seconds": 0.4}})
    assert answered["deployments"]["kimi"]["serving"] is True
    assert [t for t, _ in report_lines(answered)][0].endswith(": serving; first answer in 0.4 s")
    assert deployments_json(hosts, up)["deployments"]["kimi"]["serving"] is False  # not asked: not shown to serve
    hung = deployments_json(hosts, up, answers={"kimi": {"ok": False, "error": "no answer within 3s (timed out)",
                                                         "seconds": None}})["deployments"]["kimi"]
    assert hung["serving"] is False and hung["nodes"]["a"]["healthy"] is True
    assert "the leader a gave no first answer: no answer within 3s (timed out)" in hung["warnings"][0]
    down = deployments_json(hosts, {"a": _entry(0), "b": _entry(1, running=False)})["deployments"]["kimi"]
    assert down["serving"] is False and down["answer"] is None


# ---------------------------------------------------------------- gpuops rollback of a deployment's run

_RECORD = {"name": "kimi", "rank": 1, "nnodes": 2, "members": ["n0", "n1"], "init_addr": "10.0.0.1:20000"}


def test_a_rollback_of_a_deployment_run_holds_its_nodes_together_without_aborting_them() -> None:
    from gpuops.apply.undo import DeploymentRollbacks

    rollbacks = DeploymentRollbacks([["n0", "n1", "x"]], forks=16)
    (a, why_a), (b, why_b) = rollbacks.join("n0", _RECORD), rollbacks.join("n1", _RECORD)
    assert a is b and a is not None and why_a is why_b is None
    sent: list[dict[str, Any]] = []
    a.opened("n1", lambda m: sent.append(m) or True)
    out = _in_threads(a, hp.EVENT_ROLLBACK_STOPPED, ["n0", "n1"])
    # the rollback's own rollback_stopped is the way forward: no abort, workers before the leader
    assert out["n0"] == out["n1"] == (True, None) and out["order"] == ["n1", "n0"] and sent == []


@pytest.mark.parametrize(("batches", "forks", "record", "says"), [
    ([["n1"]], 16, _RECORD, "other nodes n0 are not in this rollback (-l)"),
    ([["n1"], ["n0"]], 16, _RECORD, "nodes n0 fall in another batch (--serial)"),
    ([["n0", "n1"]], 1, _RECORD, "2 nodes, more than --forks 1"),
    ([["n0", "n1"]], 16, {"name": "kimi", "members": "n0"}, "deployment record is not readable"),
    ([["n0", "n1"]], 16, {**_RECORD, "members": ["n0", "n2"]}, "deployment record is not readable"),
])
def test_a_rollback_that_cannot_take_every_node_at_once_is_refused(batches: list[list[str]], forks: int,
                                                                   record: Any, says: str) -> None:
    from gpuops.apply.undo import DeploymentRollbacks

    txn, why = DeploymentRollbacks(batches, forks).join("n1", record)
    assert txn is None and why is not None and why.startswith("n1: ") and says in why, why


def test_a_refused_node_releases_the_nodes_held_for_it() -> None:
    from gpuops.apply.undo import DeploymentRollbacks

    rollbacks = DeploymentRollbacks([["n0"], ["n1"]], forks=16)
    txn, why = rollbacks.join("n0", _RECORD)
    assert txn is None and why is not None
    # n1 joins the same deployment's transaction (as its own batch would find it): its stop_ready
    # hold returns at once, refused, instead of waiting for an n0 that never comes
    held = DeploymentTxn(dep.Deployment("kimi", ("n0", "n1"), "10.0.0.1:20000"), undoing=True)
    rollbacks._txns["kimi"] = held
    rollbacks.join("n0", _RECORD)
    out = _in_threads(held, hp.EVENT_STOP_READY, ["n1"])
    assert out["n1"][0] is False and "fall in another batch" in str(out["n1"][1])


def _undoing() -> DeploymentTxn:
    return DeploymentTxn(dep.Deployment("kimi", ("n0", "n1"), "10.0.0.1:20000"), undoing=True)


def test_a_failed_rollback_is_undone_on_every_node_restarted_together() -> None:
    """`gpuops rollback`: n1's previous server fails after every node restarted. Nobody commits;
    every node (n1 and the aborted n0) undoes its rollback, and that restart is held like the
    first one: nobody starts before every node stopped, the worker before the leader."""
    txn = _undoing()
    sent: list[dict[str, Any]] = []
    txn.opened("n0", lambda m: sent.append(m) or True)
    first = _in_threads(txn, hp.EVENT_ROLLBACK_STOPPED, ["n0", "n1"])
    assert first["n0"] == first["n1"] == (True, None) and first["order"] == ["n1", "n0"]
    txn.rolling_back("n1", "the server was not healthy within 6s")
    assert sent == [{hp.MESSAGE_ABORT: "node n1 of deployment kimi failed: the server was not healthy within 6s"}]
    assert txn.hold("n0", DeploymentTxn.VERIFIED)[0] is False  # n0 does not commit
    txn.rolling_back("n0", "gpuops aborted the run")
    undo = _in_threads(txn, hp.EVENT_ROLLBACK_STOPPED, ["n0", "n1"])
    assert undo["n0"] == undo["n1"] == (True, None) and undo["order"] == ["n1", "n0"], undo
    assert txn.restarted()


def test_the_undo_restart_waits_for_a_node_still_stopping() -> None:
    """n1 undoes at once; n0 has not stopped its server yet: n1's restart waits for it (before,
    n1 restarted alone, beside a leader still on the other configuration)."""
    txn = _undoing()
    txn.rolling_back("n1", "bad")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(txn.hold("n1", hp.EVENT_ROLLBACK_STOPPED)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and got == []  # held for n0
    txn.rolling_back("n0", "aborted")
    assert txn.hold("n0", hp.EVENT_ROLLBACK_STOPPED) == (True, None)
    waiter.join(10)
    assert got == [(True, None)]


def test_a_node_still_stopped_for_the_rollback_is_told_not_to_restart_once_another_failed() -> None:
    """n0 stopped its server for the rollback and waits for its restart; n1 failed meanwhile: n0
    is told not to start the previous server (it undoes its rollback with the others), while its
    files are still all it changed. In an apply the restart is held through the failure."""
    txn = _undoing()
    txn.rolling_back("n1", "its files could not be restored")
    go, why = txn.hold("n0", hp.EVENT_ROLLBACK_STOPPED)
    assert go is False and "node n1 of deployment kimi failed" in str(why)
    assert txn.hold("n0", DeploymentTxn.RESTORED)[0] is False  # nor does a node not yet stopped stop


def test_a_node_that_ends_without_joining_releases_the_nodes_held_for_it_at_once() -> None:
    """n1's rollback ends before it joins (its manifest unreadable, unreachable, another run):
    n0, held for it at stop_ready, is let go at once, refused; a node joining later is refused
    too (before, it waited for n1 until --timeout)."""
    from gpuops.apply.undo import DeploymentRollbacks

    rollbacks = DeploymentRollbacks([["n0", "n1"]], forks=16)
    txn, why = rollbacks.join("n0", _RECORD)
    assert txn is not None and why is None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(txn.hold("n0", hp.EVENT_STOP_READY)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()
    rollbacks.left("n1", "n1: tampering: the manifest of run R (/s/runs/R/manifest.json) is not valid JSON")
    waiter.join(5)
    assert got and got[0][0] is False and "manifest.json" in str(got[0][1]) and "nothing was changed" in str(got[0][1])
    later = DeploymentRollbacks([["n0", "n1"]], forks=16)
    later.left("n1", "unreachable")
    txn, why = later.join("n0", _RECORD)
    assert txn is None and why is not None and "node n1 stopped its rollback" in why and "unreachable" in why


def test_an_unreadable_record_names_its_file_and_releases_the_others() -> None:
    from gpuops.apply.undo import DeploymentRollbacks

    rollbacks = DeploymentRollbacks([["n0", "n1"]], forks=16)
    txn, _ = rollbacks.join("n0", _RECORD)
    assert txn is not None
    _, why = rollbacks.join("n1", {"name": "kimi", "members": "n0"}, "/s/runs/R/manifest.json")
    assert why is not None and why.startswith("n1: ") and "in /s/runs/R/manifest.json is not readable" in why
    assert txn.hold("n0", hp.EVENT_STOP_READY)[0] is False  # at once, not at --timeout


def _report(name: str, status: str) -> Any:
    from gpuops.apply.host_report import HostReport

    return HostReport(host=name, ok=status == hp.STATUS_FINISHED, status=status, error=None)


@pytest.mark.parametrize(("statuses", "says", "ok"), [
    ({"n0": hp.STATUS_FINISHED, "n1": hp.STATUS_FINISHED}, "rolled back on every node as one server", True),
    ({"n0": hp.STATUS_ROLLED_BACK, "n1": hp.STATUS_ROLLED_BACK}, "NOT rolled back (node n1 of deployment kimi "
     "failed: bad); every node is on the configuration it ran before this rollback", False),
    ({"n0": hp.STATUS_FINISHED, "n1": hp.STATUS_ROLLED_BACK}, "NOT ON ONE CONFIGURATION (n0 rolled back, n1 "
     "rollback undone)", False),
    ({"n0": hp.STATUS_ROLLED_BACK, "n1": hp.STATUS_ROLLBACK_FAILED}, "NOT ON ONE CONFIGURATION", False),
])
def test_the_deployment_outcome_is_one_line_on_every_node(statuses: dict[str, str], says: str, ok: bool) -> None:
    """One line for the deployment, on each node's report: a node is never left "rolled back"
    (ok) beside one whose rollback was undone."""
    from gpuops.apply.undo import held_as_one

    txn = _undoing()
    if ok is False:
        txn.fail("n1", "bad")
    reports = {n: _report(n, s) for n, s in statuses.items()}
    held_as_one(txn, reports, None)
    for report in reports.values():
        assert [n for n in report.notes if n.startswith("deployment kimi (n0, n1): ")] and says in report.notes[-1]
        assert report.ok is ok, report
