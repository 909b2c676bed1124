"""Rollback of an older run by recomposition, the pure parts: which runs stand, when an undo is
possible, and the launch planned without one run's part (apply/recompose.py, plan/compose.py).

The host-side transaction is tested for real in tests/integration/test_apply_helper.py and, end to
end with a real SGLang release, in tests/integration/test_rollback_recompose.py.
"""

from __future__ import annotations

import json

import pytest
from test_compose import FLAG, STATE, TREE, base, launch, roles_path, run  # noqa: F401  (fixture)

from gpuops.apply.recompose import judge
from gpuops.errors import GpuopsError
from gpuops.desired_state import read_desired
from gpuops.plan.compose import without_run
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role
from gpuops.remote.recompose import later_standing, pick_target, runs_in_order, undone_runs

DESIRED = f"{STATE}/desired.json"
LAUNCH = f"{STATE}/sglang-launch.sh"
ENV = f"{STATE}/sglang.env"
SRC = "/site/sglang/srt/layers/communicator.py"
INVENTORY = {
    "sglang_manager": "process", "gpuops_state_dir": STATE, "sglang_python": "python3",
    "sglang_args": ["--model-path", "/models/m", "--tp", "8", "--port", "30000"],
    "sglang_env": {"NCCL_IB_DISABLE": "1"},
}


def started(run_id: str, role: str, paths: list[str], **extra) -> list[dict]:
    changes = [{"path": p, "before_sha256": "b" + p, "after_sha256": "a" + p} for p in paths]
    return [{"run_id": run_id, "event": "started", "role": role, "changes": changes, **extra},
            {"run_id": run_id, "event": "finished"}]


def recomposing(facts: PlanFacts, target: str, role: str, before: dict, roles_path, run_id: str = "undo") -> PlanFacts:
    """The planning half of apply/recompose.py: the sglang-service role with the contributions
    minus ``target``'s part; the planned changes applied to the files."""
    def recompose(recorded: dict, dest: str) -> dict:
        assert recorded.get(role, {}).get("run_id") in (target, None)
        return without_run(recorded, before, role)

    plan = plan_role("sglang-service", facts, INVENTORY, {}, roles_path, run_id=run_id, recompose=recompose)
    files = dict(facts.files)
    for change in plan.changes:
        files[change.path] = FileState(path=change.path, exists=change.action != "delete",
                                       content=None if change.action == "delete" else change.after, mode=change.mode)
    return PlanFacts(host=facts.host, files=files)


def contributions(facts: PlanFacts) -> dict:
    state = facts.files.get(DESIRED)
    return read_desired(state.content if state and state.exists else None, DESIRED)


def test_the_older_flag_run_is_taken_out_and_the_launch_is_what_nccl_env_alone_gives(roles_path) -> None:
    start = base(roles_path)
    flagged, _ = run(start, "flag-role", roles_path, run_id="run-a")
    both, _ = run(flagged, "nccl-env", roles_path, TREE, run_id="run-b")
    undone = recomposing(both, "run-a", "flag-role", contributions(start), roles_path)
    only_nccl, _ = run(start, "nccl-env", roles_path, TREE, run_id="run-b")
    for path in (DESIRED, LAUNCH, ENV):
        assert undone.files[path].content == only_nccl.files[path].content, path
    args, env = launch(undone)
    assert FLAG not in args and "NCCL_ALGO='Tree'" in env
    # Then the remaining run: desired.json goes, the launch is as before both.
    pristine = recomposing(undone, "run-b", "nccl-env", contributions(flagged), roles_path)
    assert not pristine.files[DESIRED].exists
    assert launch(pristine) == launch(start)


def test_the_older_nccl_run_is_taken_out_in_the_other_order(roles_path) -> None:
    start = base(roles_path)
    tuned, _ = run(start, "nccl-env", roles_path, TREE, run_id="run-a")
    both, _ = run(tuned, "flag-role", roles_path, run_id="run-b")
    undone = recomposing(both, "run-a", "nccl-env", contributions(start), roles_path)
    only_flag, _ = run(start, "flag-role", roles_path, run_id="run-b")
    for path in (DESIRED, LAUNCH, ENV):
        assert undone.files[path].content == only_flag.files[path].content, path


def test_a_part_replaced_by_the_undone_run_comes_back() -> None:
    """Z set NCCL_ALGO=Ring, A set Tree (same role), B added a flag: undoing A gives Ring back."""
    ring = {"args": [], "env": {"NCCL_ALGO": "Ring"}, "run_id": "z"}
    flag = {"args": [FLAG], "env": {}, "run_id": "b"}
    other = {"args": ["--x"], "env": {}, "run_id": "o"}
    before = {"other": other, "nccl-env": ring}
    current = {"other": other, "nccl-env": {"args": [], "env": {"NCCL_ALGO": "Tree"}, "run_id": "a"}, "flag": flag}
    assert without_run(current, before, "nccl-env") == {"other": other, "nccl-env": ring, "flag": flag}
    assert list(without_run(current, before, "nccl-env")) == ["other", "nccl-env", "flag"]
    # a part that predates A but was changed later keeps its later value and place
    changed = dict(current, other={"args": ["--y"], "env": {}, "run_id": "c"})
    changed = {k: changed[k] for k in ("nccl-env", "flag", "other")}
    assert list(without_run(changed, before, "nccl-env")) == ["nccl-env", "flag", "other"]


def test_undone_and_standing_runs_follow_the_journal() -> None:
    records = (started("a", "fusion-sm120", [SRC, DESIRED, LAUNCH]) + started("b", "nccl-env", [DESIRED, ENV])
               + started("r", "fusion-sm120", [SRC, DESIRED, LAUNCH], kind="rollback", target="a", recompose=True))
    runs = runs_in_order(records)
    assert undone_runs(runs) == {"a"}
    assert pick_target(runs, None)["run_id"] == "b"           # a recomposition is not the default target
    assert [r["run_id"] for r in later_standing(runs, pick_target(runs, "b"))] == ["r"]
    assert pick_target(runs, "a") is None                      # the helper says "already rolled back"
    # Undoing the recomposition puts a back in effect.
    runs = runs_in_order(records + started("u", "fusion-sm120", [SRC, DESIRED, LAUNCH], kind="rollback", target="r"))
    assert undone_runs(runs) == {"r"}
    assert pick_target(runs, None)["run_id"] == "b"
    assert pick_target(runs, "u") is None                      # a plain rollback: the helper refuses it


LAUNCH_FILES = {DESIRED, LAUNCH, ENV}


def test_judge_plain_when_nothing_later_stands_on_the_files() -> None:
    records = started("a", "fusion-sm120", [SRC, DESIRED, LAUNCH])
    assert judge(records, None, LAUNCH_FILES, DESIRED) is None
    records += started("b", "nccl-env", [DESIRED, ENV]) + [{"run_id": "x", "event": "started", "kind": "rollback",
                                                             "target": "b"}, {"run_id": "x", "event": "finished"}]
    assert judge(records, "a", LAUNCH_FILES, DESIRED) is None     # b was rolled back


def test_judge_recomposes_launch_files_and_restores_the_rest() -> None:
    records = started("a", "fusion-sm120", [SRC, DESIRED, LAUNCH]) + started("b", "nccl-env", [DESIRED, ENV])
    found = judge(records, "a", LAUNCH_FILES, DESIRED)
    assert found is not None and found.restore == [SRC] and found.launch == [DESIRED, LAUNCH]
    assert [r["run_id"] for r in found.later] == ["b"]


def test_judge_refuses_what_cannot_be_recomposed_naming_the_runs_newest_first() -> None:
    # c patched the same source after a: a's backups would destroy c's patch.
    records = (started("a", "fusion-sm120", [SRC, DESIRED, LAUNCH]) + started("b", "nccl-env", [DESIRED, ENV])
               + started("c", "other-patch", [SRC]))
    with pytest.raises(GpuopsError) as err:
        judge(records, "a", LAUNCH_FILES, DESIRED)
    assert "c (other-patch) changed " + SRC in str(err.value)
    assert "roll back c (other-patch), b (nccl-env) first (newest first), then a" in str(err.value)
    # the same role again replaced a's part of the launch
    records = started("a", "nccl-env", [DESIRED, ENV]) + started("b", "nccl-env", [DESIRED, ENV])
    records += started("c", "fusion-sm120", [DESIRED, LAUNCH])
    with pytest.raises(GpuopsError, match="applied nccl-env again after a"):
        judge(records, "a", LAUNCH_FILES, DESIRED)
    # a run that recorded no part (its launch came from the inventory)
    records = started("a", "sglang-service", [LAUNCH]) + started("b", "fusion-sm120", [DESIRED, LAUNCH])
    with pytest.raises(GpuopsError, match="recorded no part of the launch"):
        judge(records, "a", LAUNCH_FILES, DESIRED)


def test_discovery_names_desired_json() -> None:
    assert discover("sglang-service", "h01", INVENTORY, {}).desired_path == DESIRED


def test_a_recompose_plan_deletes_desired_json_when_no_part_is_left(roles_path) -> None:
    start = base(roles_path)
    tuned, _ = run(start, "nccl-env", roles_path, TREE, run_id="run-a")
    plan = plan_role("sglang-service", tuned, INVENTORY, {}, roles_path, run_id="u",
                     recompose=lambda recorded, dest: without_run(recorded, {}, "nccl-env"))
    deleted = [c for c in plan.changes if c.path == DESIRED]
    assert deleted and deleted[0].action == "delete" and deleted[0].after_sha256 is None
    assert json.loads(tuned.files[DESIRED].content or "")["contributions"]["nccl-env"]["run_id"] == "run-a"
    assert any(c.path == ENV for c in plan.changes) and plan.handlers


def test_history_marks_the_run_a_rollback_took_out_of_effect() -> None:
    from gpuops.apply.journal import fold_runs

    records = (started("a", "fusion-sm120", [SRC, DESIRED, LAUNCH]) + started("b", "nccl-env", [DESIRED, ENV])
               + started("r", "fusion-sm120", [SRC, DESIRED, LAUNCH], kind="rollback", target="a", recompose=True))
    folded = {r["run_id"]: r for r in fold_runs(records)}
    assert folded["a"]["undone_by"] == "r" and "undone_by" not in folded["b"] and folded["r"]["recompose"] is True
    # undoing the recomposition: a is in effect again, r is the one undone
    records += started("u", "fusion-sm120", [SRC, DESIRED, LAUNCH], kind="rollback", target="r")
    folded = {r["run_id"]: r for r in fold_runs(records)}
    assert "undone_by" not in folded["a"] and folded["r"]["undone_by"] == "u"
    # a rollback that was itself rolled back undid nothing
    records = started("a", "nccl-env", [ENV]) + [
        {"run_id": "x", "event": "started", "kind": "rollback", "target": "a"}, {"run_id": "x", "event": "rolled_back"}]
    assert "undone_by" not in fold_runs(records)[0]


SYSTEMD = dict(INVENTORY, sglang_manager="systemd", sglang_systemd_unit_dir="/etc/systemd/system")
UNIT = "/etc/systemd/system/sglang.service"


def applied(facts: PlanFacts, role: str, roles_path, extra: dict, run_id: str, recompose=None) -> tuple[PlanFacts, object]:
    plan = plan_role(role, facts, SYSTEMD, extra, roles_path, run_id=run_id, recompose=recompose)
    files = dict(facts.files)
    for change in plan.changes:
        files[change.path] = FileState(path=change.path, exists=change.action != "delete",
                                       content=None if change.action == "delete" else change.after, mode=change.mode)
    return PlanFacts(host=facts.host, files=files), plan


def test_a_systemd_unit_is_recomposed_and_reloaded(roles_path) -> None:
    paths = set(discover("nccl-env", "h01", SYSTEMD, {}).paths) | set(discover("flag-role", "h01", SYSTEMD, {}, roles_path).paths)
    empty = PlanFacts(host="h01", files={p: FileState(path=p, exists=False) for p in paths})
    start, _ = applied(empty, "sglang-service", roles_path, {}, "s")
    flagged, _ = applied(start, "flag-role", roles_path, {}, "run-a")
    both, _ = applied(flagged, "nccl-env", roles_path, TREE, "run-b")
    assert FLAG in (both.files[UNIT].content or "")
    undone, plan = applied(both, "sglang-service", roles_path, {}, "undo",
                           recompose=lambda recorded, dest: without_run(recorded, {}, "flag-role"))
    only_nccl, _ = applied(start, "nccl-env", roles_path, TREE, "run-b")
    for path in (UNIT, DESIRED, ENV):
        assert undone.files[path].content == only_nccl.files[path].content, path
    assert FLAG not in (undone.files[UNIT].content or "")
    assert [h.daemon_reload for h in plan.handlers] == [True]   # the unit changed: systemd reloads it


DOCKER = dict(INVENTORY, sglang_manager="docker", sglang_docker_image="lmsysorg/sglang:v0.5.14")
RUN_SCRIPT = f"{STATE}/sglang-docker-run.sh"
DOCKER_ENV = f"{STATE}/sglang.docker.env"


def test_a_docker_launch_goes_back_to_the_inventory_image(tmp_path) -> None:
    """fusion-sm120 on docker contributes a derived image (with its flag): undoing it while a later
    nccl-env stands gives the run script of nccl-env alone, on the inventory's image."""
    from gpuops.plan.roles import project_root

    role = tmp_path / "image-role"
    role.mkdir()
    (role / "tasks.yml").write_text(
        "- name: launch the derived image\n  include_role:\n    name: sglang-service\n  vars:\n"
        f"    sglang_contribute_args: ['{FLAG}']\n    sglang_contribute_image: gpuops/sglang:abc\n"
        "    sglang_contribute_image_base: lmsysorg/sglang:v0.5.14\n")
    path = [tmp_path, project_root() / "roles"]

    def step(facts: PlanFacts, role_name: str, extra: dict, run_id: str, recompose=None) -> PlanFacts:
        plan = plan_role(role_name, facts, DOCKER, extra, path, run_id=run_id, recompose=recompose)
        files = dict(facts.files)
        for change in plan.changes:
            files[change.path] = FileState(path=change.path, exists=change.action != "delete",
                                           content=None if change.action == "delete" else change.after)
        return PlanFacts(host=facts.host, files=files)

    paths = set(discover("nccl-env", "h01", DOCKER, {}).paths)
    start = step(PlanFacts(host="h01", files={p: FileState(path=p, exists=False) for p in paths}),
                 "sglang-service", {}, "s")
    both = step(step(start, "image-role", {}, "run-a"), "nccl-env", TREE, "run-b")
    assert "gpuops/sglang:abc" in (both.files[RUN_SCRIPT].content or "")
    undone = step(both, "sglang-service", {}, "undo", lambda recorded, dest: without_run(recorded, {}, "image-role"))
    only_nccl = step(start, "nccl-env", TREE, "run-b")
    for name in (RUN_SCRIPT, DOCKER_ENV, DESIRED):
        assert undone.files[name].content == only_nccl.files[name].content, name
    assert "lmsysorg/sglang:v0.5.14" in (undone.files[RUN_SCRIPT].content or "")


def test_a_recomposed_launch_keeps_the_entrypoint_its_python_s_release_recommends() -> None:
    """Undoing nccl-env under a standing sglang-release run: the launch stays `ENV/bin/sglang serve`
    (apply/recompose.py gathers the entrypoints as apply does, docs/deploy.md)."""
    from gpuops.apply.recompose import Recomposition, _plan
    from gpuops.inventory import Host
    from gpuops.plan.entrypoint import LaunchEntry

    release = {"args": [], "env": {"PYTHONPATH": ""}, "python": "/env/bin/python", "renames": {}, "run_id": "r1"}
    desired = json.dumps({"schema": 1, "contributions": {"sglang-release": release, "nccl-env": {
        "args": [], "env": {"NCCL_MIN_NCHANNELS": "4"}, "run_id": "r2"}}})
    files = {p: FileState(path=p, exists=False) for p in discover("sglang-service", "h01", INVENTORY, {}).paths}
    files[DESIRED] = FileState(path=DESIRED, exists=True, content=desired, mode="0600")
    host = Host(name="h01", address=None, port=None, user=None, key_file=None, connection="ssh", groups=("all",),
                vars=INVENTORY)
    undo = Recomposition(target={"run_id": "r2", "role": "nccl-env", "changes": []}, later=[], desired_path=DESIRED)
    serve = LaunchEntry(python="/env/bin/python", entrypoint="serve", script="/env/bin/sglang", why="recommended")
    plan = _plan(host, dict(INVENTORY), {}, files, STATE, undo, "undo", {serve.python: serve})
    script = next(c.after for c in plan.changes if c.path == LAUNCH)
    assert "exec /env/bin/python /env/bin/sglang serve --model-path /models/m" in script, script
    assert "NCCL_MIN_NCHANNELS" not in next(c.after for c in plan.changes if c.path == ENV)
