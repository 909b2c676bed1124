"""apply/noop_memo.py: an empty plan is recalled only for the very same inputs, and nothing else is."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuops.apply import noop_memo
from gpuops.gates.scan import GateScan
from gpuops.plan.model import FileState, PlanFacts, Plan

SCAN = GateScan(known=True, root="/site/sglang", version="0.5.8", python="3.11.7", fingerprint="a" * 64,
                sources={"srt/layers/communicator.py": "text"})
FACTS = PlanFacts(host="h01", files={"/state/sglang.env": FileState("/state/sglang.env", True, "0" * 64, "0600", 0, 0, "A='1'\n")},
                  gate_scan=SCAN, gpu={"compute_capability": "12.0", "cuda": "13.0"})
VARS = {"sglang_port": 30000}


@pytest.fixture(autouse=True)
def memo_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUOPS_KEEP", str(tmp_path / "kept"))
    return tmp_path / "kept" / "plans"


def empty_plan(**fields) -> Plan:
    return Plan(host="h01", role="fusion-sm120", changes=(), handlers=(), service=None,
                warnings=("P2P warning",), notes=("launch with --flag",), tasks_ok=7, state_dir="/state", **fields)


class Planner:
    """Counts real plans."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.calls = plan, 0

    def __call__(self) -> Plan:
        self.calls += 1
        return self.plan


def run(planner: Planner, facts: PlanFacts = FACTS, extra: dict | None = None, journal: list | None = None,
        run_id: str = "20261130T120000Z-aaaaaa") -> Plan:
    return noop_memo.plan_or_recall("fusion-sm120", facts, VARS, extra or {}, run_id, journal or [], planner)


def test_same_inputs_recall_the_empty_plan() -> None:
    planner = Planner(empty_plan())
    first = run(planner)
    second = run(planner)
    assert planner.calls == 1
    assert (second.warnings, second.notes, second.tasks_ok, second.state_dir, second.changes, second.handlers) == \
           (first.warnings, first.notes, first.tasks_ok, first.state_dir, (), ())


@pytest.mark.parametrize("changed", [
    lambda f: dataclasses.replace(f, files={"/state/sglang.env": dataclasses.replace(f.files["/state/sglang.env"], content="A='2'\n")}),
    lambda f: dataclasses.replace(f, files={"/state/sglang.env": dataclasses.replace(f.files["/state/sglang.env"], mode="0644")}),
    lambda f: dataclasses.replace(f, files={}),
    lambda f: dataclasses.replace(f, gate_scan=dataclasses.replace(SCAN, fingerprint="b" * 64)),
    lambda f: dataclasses.replace(f, gate_scan=dataclasses.replace(SCAN, sources={"srt/layers/communicator.py": "other"})),
    lambda f: dataclasses.replace(f, gpu={"compute_capability": "10.0", "cuda": "13.0"}),
    lambda f: dataclasses.replace(f, container={"name": "sglang", "image_id": "sha256:1"}),
    lambda f: dataclasses.replace(f, server_running=False),  # a stopped server is planned: it is started
], ids=["content", "mode", "file gone", "tree", "sources", "gpu", "container", "server stopped"])
def test_any_fact_that_differs_is_planned(changed) -> None:
    planner = Planner(empty_plan())
    run(planner)
    run(planner, facts=changed(FACTS))
    assert planner.calls == 2


def test_other_variables_are_planned() -> None:
    planner = Planner(empty_plan())
    run(planner)
    run(planner, extra={"gpuops_stop_grace": 6})
    assert planner.calls == 2


def test_never_kept_without_a_scan_fingerprint_or_with_changes_or_an_unfinished_run() -> None:
    no_fingerprint = dataclasses.replace(FACTS, gate_scan=dataclasses.replace(SCAN, fingerprint=None))
    planner = Planner(empty_plan())
    run(planner, facts=no_fingerprint)
    run(planner, facts=no_fingerprint)
    assert planner.calls == 2

    from gpuops.plan.model import HandlerRun

    busy = Planner(dataclasses.replace(empty_plan(), handlers=(HandlerRun(name="restart sglang", service=None),)))
    run(busy)
    run(busy)
    assert busy.calls == 2

    planner = Planner(empty_plan())
    run(planner)
    unfinished = [{"run_id": "r1", "event": "started", "role": "nccl-env"}]
    run(planner, journal=unfinished)
    assert planner.calls == 2  # that run needs a real plan


def test_a_report_naming_its_run_is_not_kept() -> None:
    planner = Planner(dataclasses.replace(empty_plan(), notes=("run 20261130T120000Z-aaaaaa did x",)))
    run(planner)
    run(planner)
    assert planner.calls == 2


def test_torn_or_foreign_entries_are_ignored(memo_dir: Path) -> None:
    planner = Planner(empty_plan())
    run(planner)
    (entry,) = list(memo_dir.glob("*.json"))
    data = json.loads(entry.read_text())
    for bad in ("{", json.dumps({**data, "key": "0" * 64}), json.dumps({**data, "host": "h02"}),
                json.dumps({**data, "kind": "discovery"}), json.dumps({**data, "notes": [1]})):
        entry.write_text(bad)
        calls = planner.calls
        run(planner)
        assert planner.calls == calls + 1
    assert run(planner).notes == empty_plan().notes


def test_off_plans_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_KEEP", "off")
    planner = Planner(empty_plan())
    run(planner)
    run(planner)
    assert planner.calls == 2


def test_discovery_is_recalled_for_the_same_role_and_variables() -> None:
    from gpuops.facts.container_python import ContainerTarget
    from gpuops.plan.planner import Discovery

    found = Discovery(paths=("/state/a", "/state/b"), needs_gate_scan=True, state_dir="/state", python="python3",
                      warnings=("w",), container=ContainerTarget(container="sglang", image="img", python="python3"),
                      desired_path="/state/desired.json", needs_server_state=True)
    calls = []

    def discover() -> Discovery:
        calls.append(1)
        return found

    assert noop_memo._discovery_shape_known()  # a field added to Discovery must be stored here too
    assert noop_memo.discover_or_recall("fusion-sm120", "h01", VARS, {}, discover) == found
    assert noop_memo.discover_or_recall("fusion-sm120", "h01", VARS, {}, discover) == found
    assert len(calls) == 1
    noop_memo.discover_or_recall("fusion-sm120", "h01", VARS, {"x": 1}, discover)
    noop_memo.discover_or_recall("nccl-env", "h01", VARS, {}, discover)
    noop_memo.discover_or_recall("fusion-sm120", "h02", VARS, {}, discover)
    assert len(calls) == 4


def test_code_digest_follows_gpuops_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    noop_memo.code_digest.cache_clear()
    before = noop_memo.code_digest()
    roles = tmp_path / "roles"
    (roles / "x").mkdir(parents=True)
    monkeypatch.setenv("GPUOPS_ROLES_PATH", str(roles))
    noop_memo.code_digest.cache_clear()
    with_path = noop_memo.code_digest()
    assert with_path != before
    (roles / "x" / "tasks.yml").write_text("[]\n")
    noop_memo.code_digest.cache_clear()
    assert noop_memo.code_digest() != with_path
    noop_memo.code_digest.cache_clear()


def test_code_digest_follows_a_role_linked_into_the_roles_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_role follows a symlinked role directory (roles/x -> elsewhere): an edit there must be a miss too.
    elsewhere = tmp_path / "elsewhere" / "x"
    elsewhere.mkdir(parents=True)
    (elsewhere / "tasks.yml").write_text("[]\n")
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "x").symlink_to(elsewhere, target_is_directory=True)
    (roles / "loop").symlink_to(roles, target_is_directory=True)  # a cycle is walked once, not forever
    monkeypatch.setenv("GPUOPS_ROLES_PATH", str(roles))
    noop_memo.code_digest.cache_clear()
    before = noop_memo.code_digest()
    (elsewhere / "tasks.yml").write_text("- name: edited\n  debug: {}\n")
    noop_memo.code_digest.cache_clear()
    assert noop_memo.code_digest() != before
    noop_memo.code_digest.cache_clear()
