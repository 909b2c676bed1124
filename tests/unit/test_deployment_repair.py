"""Which journals make a split deployment (multi_node.find_split), and what the
repair refuses: a node of the split left out by -l, a journal that cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops.apply import deployment_repair as repair
from gpuops.apply.extra_vars import ExtraVars
from gpuops.multi_node import Outcome, find_split, outcome
from gpuops.errors import GpuopsError

MEMBERS = ["n0", "n1"]
RECORD = {"name": "kimi", "rank": 0, "nnodes": 2, "members": MEMBERS, "init_addr": "10.0.0.1:20000"}


def run(run_id: str, *ends: str, record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{"run_id": run_id, "event": "started", "role": "nccl-env",
                                      "deployment": record or RECORD}]
    records += [{"run_id": run_id, "event": end} for end in ends]
    return records


def undo(run_id: str, target: str, *ends: str) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "event": "started", "kind": "rollback", "target": target}] + [
        {"run_id": run_id, "event": end, **({"kind": "rollback", "target": target} if end == "finished" else {})}
        for end in ends]


OLD = run("20260101T000000Z-aaaaaa", "server_touched", "finished")
LAST = "20260101T010000Z-bbbbbb"


def test_committed_on_one_node_rolled_back_on_the_other_is_a_split() -> None:
    split = find_split("kimi", {"n0": OLD + run(LAST, "server_touched", "finished"),
                                "n1": OLD + run(LAST, "server_touched", "rolled_back")})
    assert split is not None
    assert (split.run_id, split.committed, split.rolled_back) == (LAST, ("n0",), ("n1",))
    assert split.deployment.members == ("n0", "n1") and split.deployment.init_addr == "10.0.0.1:20000"
    assert "deployment kimi is split: its run " + LAST in split.line()


def test_the_worker_committed_and_the_leader_rolled_back_is_a_split_too() -> None:
    split = find_split("kimi", {"n0": run(LAST, "rolled_back"), "n1": run(LAST, "finished")})
    assert split is not None and split.committed == ("n1",) and split.rolled_back == ("n0",)
    # The leader's files are back but its previous server could not be healthy alone (its worker had
    # committed and went down with it): the run stays open as rollback_failed, and that is a split too.
    split = find_split("kimi", {"n0": run(LAST, "server_touched", "rollback_failed"), "n1": run(LAST, "finished")})
    assert split is not None and split.rolled_back == ("n0",)


@pytest.mark.parametrize(("n0", "n1"), [
    (("finished",), ("finished",)),          # committed everywhere
    (("rolled_back",), ("rolled_back",)),    # rolled back everywhere
    (("finished",), ("server_touched",)),    # still open on n1: it settles first (its lease or the next lock)
    (("finished",), ("unchanged",)),         # n1 had nothing to do
])
def test_no_split(n0: tuple[str, ...], n1: tuple[str, ...]) -> None:
    assert find_split("kimi", {"n0": run(LAST, *n0), "n1": run(LAST, *n1)}) is None


def test_a_rollback_that_undid_the_run_counts_as_rolled_back() -> None:
    # The repair itself (or a gpuops rollback) undid it on n0: both sides rolled back, no split.
    rollback = undo("20260101T020000Z-cccccc", LAST, "server_touched", "finished")
    journals = {"n0": run(LAST, "finished") + rollback, "n1": run(LAST, "rolled_back") + rollback}
    assert find_split("kimi", journals) is None
    # A rollback that committed on n0 only (its client died too) splits the run the other way round.
    split = find_split("kimi", {"n0": run(LAST, "finished") + rollback, "n1": run(LAST, "finished")})
    assert split is not None and split.committed == ("n1",) and split.rolled_back == ("n0",)
    assert outcome(run(LAST, "finished") + undo("r", LAST, "rolled_back"), LAST, "kimi") is Outcome.COMMITTED


def test_only_the_deployments_last_run_counts() -> None:
    # An older run split and since then a newer run committed everywhere: nothing to repair.
    older = run("20260101T000000Z-aaaaaa", "finished")
    journals = {"n0": older + run(LAST, "finished"), "n1": run("20260101T000000Z-aaaaaa", "rolled_back")
                + run(LAST, "finished")}
    assert find_split("kimi", journals) is None
    # The newest run is the newest on any node: n1 never journaled it (refused before it started).
    assert find_split("kimi", {"n0": OLD + run(LAST, "finished"), "n1": OLD}) is None
    # Another deployment's runs are not this one's.
    other = run(LAST, "finished", record=dict(RECORD, name="other"))
    assert find_split("kimi", {"n0": other, "n1": run(LAST, "rolled_back")}) is None


def test_an_unreadable_journal_beside_a_commit_is_refused_naming_the_node() -> None:
    with pytest.raises(GpuopsError, match=r"^n1: its journal cannot be read \(ssh: connection refused\).*"
                                          r"committed on n0.*nothing changed"):
        find_split("kimi", {"n0": run(LAST, "finished"), "n1": "ssh: connection refused"})
    # A member of the run's record that the inventory does not have in the deployment any more.
    with pytest.raises(GpuopsError, match="^n1: .*not a node of deployment kimi in this inventory"):
        find_split("kimi", {"n0": run(LAST, "finished")})
    # Nothing committed anywhere: no split is possible, whatever the unreadable node says.
    assert find_split("kimi", {"n0": run(LAST, "rolled_back"), "n1": "timed out"}) is None


def test_an_unreadable_deployment_record_is_refused() -> None:
    with pytest.raises(GpuopsError, match="^n0: the deployment record of run .* is not readable"):
        find_split("kimi", {"n0": run(LAST, "finished", record={"name": "kimi", "members": "n0,n1"}),
                            "n1": run(LAST, "rolled_back")})


def _host(name: str, deployment: str | None = "kimi") -> Any:
    from gpuops.inventory import Host

    return Host(name=name, address="127.0.0.1", port=22, user=None, key_file=None, connection="ssh",
                groups=("all",), vars={"sglang_deployment": deployment} if deployment else {})


def test_a_node_of_the_split_left_out_by_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    journals = {"n0": run(LAST, "finished"), "n1": run(LAST, "rolled_back")}
    read: list[list[str]] = []

    def fake_journals(hosts: Any, extra: Any, options: Any) -> dict[str, Any]:
        read.append([h.name for h in hosts])
        return {h.name: journals[h.name] for h in hosts}

    monkeypatch.setattr(repair, "_journals", fake_journals)
    everyone = [_host("n0"), _host("n1"), _host("other", None)]
    with pytest.raises(GpuopsError, match=r"^n0: deployment kimi is split: .* n0 is not in this run \(-l\)"):
        repair.splits([everyone[1]], everyone, ExtraVars.none(), options=None)  # type: ignore[arg-type]
    assert read == [["n0", "n1"]]  # the unselected node's journal is read; a host of no deployment is not
    found = repair.splits(everyone[:2], everyone, ExtraVars.none(), options=None)  # type: ignore[arg-type]
    assert [s.run_id for s in found] == [LAST]
    assert repair.splits([everyone[2]], everyone, ExtraVars.none(), options=None) == []  # type: ignore[arg-type]


def test_the_host_takes_a_target_rolled_back_already_only_to_finish_a_split(tmp_path: Any) -> None:
    """remote/apply_rollback: the run rolled back here (its lease) is refused as a target, except
    with finish_split for a deployment's run; a file changed since that rollback is refused."""
    from gpuops.remote.apply_common import StepFailed
    from gpuops.remote.apply_rollback import check_rolled_back, pick_rollback_target

    records = run(LAST, "server_touched", "rolled_back")
    with pytest.raises(StepFailed, match="already rolled back"):
        pick_rollback_target(records, LAST)
    assert pick_rollback_target(records, LAST, finish_split=True)["already_undone"] is True
    plain = [{"run_id": LAST, "event": "started", "changes": [{"path": "/x"}]}, {"run_id": LAST, "event": "rolled_back"}]
    with pytest.raises(StepFailed, match="already rolled back"):  # not a deployment's run
        pick_rollback_target(plain, LAST, finish_split=True)
    undone = run(LAST, "finished") + undo("20260101T020000Z-cccccc", LAST, "finished")
    assert pick_rollback_target(undone, LAST, finish_split=True)["already_undone"] is True
    # committed here: the ordinary rollback (its drift check), not the "already undone" one
    committed = [dict(r, changes=[{"path": "/x"}]) for r in run(LAST, "finished")]
    assert not pick_rollback_target(committed, LAST, finish_split=True).get("already_undone")

    import hashlib

    env = tmp_path / "sglang.env"
    env.write_text("old\n")
    manifest = {"files": [{"path": str(env), "existed": True, "sha256": hashlib.sha256(b"old\n").hexdigest()},
                          {"path": str(tmp_path / "created"), "existed": False}]}
    check_rolled_back(manifest, {"run_id": LAST})
    env.write_text("changed since\n")
    with pytest.raises(StepFailed, match=r"sglang.env changed since run .* was rolled back on this host"):
        check_rolled_back(manifest, {"run_id": LAST})
    env.write_text("old\n")
    (tmp_path / "created").write_text("")
    with pytest.raises(StepFailed, match="created changed since"):
        check_rolled_back(manifest, {"run_id": LAST})


def test_inspect_names_the_split_run_and_the_command_that_repairs_it() -> None:
    from gpuops.facts.deployment import deployments_json

    hosts = [_host("n0"), _host("n1")]
    entries = {n: {"ok": True, "facts": {"server": {"running": True, "args": {}}}} for n in ("n0", "n1")}
    journals = {"n0": run(LAST, "finished"), "n1": run(LAST, "rolled_back")}
    warnings = deployments_json(hosts, entries, journals)["deployments"]["kimi"]["warnings"]
    assert warnings == [f"deployment kimi is split: its run {LAST} committed on n0 and rolled back on n1: "
                        "`gpuops rollback -l n0,n1` (or the next `gpuops apply` on its nodes) rolls it back on every "
                        "node as one"], warnings
    journals["n1"] = run(LAST, "finished")
    assert deployments_json(hosts, entries, journals)["deployments"]["kimi"]["warnings"] == []
    # a journal not read (the node did not answer): no split claimed
    assert deployments_json(hosts, entries, {"n0": run(LAST, "finished")})["deployments"]["kimi"]["warnings"] == []


def test_a_run_that_committed_on_some_nodes_only_has_its_journals_read_again() -> None:
    from gpuops.apply.host_report import HostReport

    hosts = [_host("n0"), _host("n1"), _host("solo", None)]

    def reports(*statuses: str) -> dict[str, HostReport]:
        return {h.name: HostReport(host=h.name, ok=s in ("finished", "unchanged"), status=s)
                for h, s in zip(hosts, statuses)}

    assert repair._may_be_split(hosts, ExtraVars.none(), reports("finished", "unknown", "finished"))
    assert repair._may_be_split(hosts, ExtraVars.none(), reports("rolled_back", "finished", "finished"))
    assert not repair._may_be_split(hosts, ExtraVars.none(), reports("finished", "finished", "failed"))  # solo is no node
    assert not repair._may_be_split(hosts, ExtraVars.none(), reports("rolled_back", "rolled_back", "finished"))
    assert not repair._may_be_split(hosts, ExtraVars.none(), reports("unchanged", "failed", "finished"))
