"""Desired state composes: the launch is the inventory plus every run still in effect (pure planning).

A run is planned on the files the previous run left (``facts_after``); a rollback restores the
``before`` of each file the run changed, as the host transaction does.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gpuops.plan.compose import with_contribution
from gpuops.release.flags import merge_flags
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role
from gpuops.plan.roles import project_root

STATE = "/srv/gpuops"
INVENTORY = {
    "sglang_manager": "process", "gpuops_state_dir": STATE, "sglang_python": "python3",
    "sglang_args": ["--model-path", "/models/m", "--tp", "8", "--port", "30000"],
    "sglang_env": {"NCCL_IB_DISABLE": "1"},
}
FLAG = "--enable-flashinfer-allreduce-fusion"


@pytest.fixture()
def roles_path(tmp_path: Path) -> list[Path]:
    """A stand-in for fusion-sm120's launch part (its gate patch needs a real release; the
    integration tests run that): a role that includes sglang-service with one contributed flag."""
    role = tmp_path / "flag-role"
    role.mkdir()
    (role / "tasks.yml").write_text(
        "- name: launch with the flag\n  include_role:\n    name: sglang-service\n"
        f"  vars:\n    sglang_contribute_args: ['{FLAG}']\n")
    return [tmp_path, project_root() / "roles"]


def host(files: dict[str, str] | None = None) -> PlanFacts:
    paths = discover("nccl-env", "h01", INVENTORY, {}).paths
    state = {p: FileState(path=p, exists=False) for p in paths}
    for path, text in (files or {}).items():
        state[path] = FileState(path=path, exists=True, content=text, mode="0600")
    return PlanFacts(host="h01", files=state)


def run(facts: PlanFacts, role: str, roles_path: list[Path], extra: dict | None = None, run_id: str = "r") -> tuple[PlanFacts, dict]:
    plan = plan_role(role, facts, INVENTORY, extra or {}, roles_path, run_id=run_id)
    files = dict(facts.files)
    undo = {}
    for change in plan.changes:
        undo[change.path] = change.before
        files[change.path] = FileState(path=change.path, exists=True, content=change.after, mode=change.mode)
    return PlanFacts(host="h01", files=files), {"undo": undo, "changed": plan.changed}


def rollback(facts: PlanFacts, undo: dict) -> PlanFacts:
    files = dict(facts.files)
    for path, before in undo["undo"].items():
        files[path] = FileState(path=path, exists=before is not None, content=before, mode="0600")
    return PlanFacts(host="h01", files=files)


def launch(facts: PlanFacts) -> tuple[list[str], str]:
    script = facts.files[f"{STATE}/sglang-launch.sh"].content or ""
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    return shlex.split(exec_line)[4:], facts.files[f"{STATE}/sglang.env"].content or ""


def base(roles_path: list[Path]) -> PlanFacts:
    facts, _ = run(host(), "sglang-service", roles_path)
    assert f"{STATE}/desired.json" not in {p for p, f in facts.files.items() if f.exists}  # nothing to record
    return facts


TREE = {"nccl_env": {"NCCL_ALGO": "Tree"}}


def test_nccl_env_after_the_flag_keeps_it_and_rollback_removes_only_its_part(roles_path) -> None:
    start = base(roles_path)
    flagged, _ = run(start, "flag-role", roles_path, run_id="run-a")
    assert FLAG in launch(flagged)[0]
    both, nccl_run = run(flagged, "nccl-env", roles_path, TREE, run_id="run-b")
    args, env = launch(both)
    assert FLAG in args and "NCCL_ALGO='Tree'" in env and "NCCL_IB_DISABLE='1'" in env
    desired = json.loads(both.files[f"{STATE}/desired.json"].content or "")
    assert {k: v["run_id"] for k, v in desired["contributions"].items()} == {"flag-role": "run-a", "nccl-env": "run-b"}
    # Re-applying either role changes nothing (its part is recorded, with its first run id).
    assert run(both, "flag-role", roles_path, run_id="run-c")[1]["changed"] == 0
    assert run(both, "nccl-env", roles_path, TREE, run_id="run-d")[1]["changed"] == 0
    # Rolling back the NCCL run removes exactly its part.
    undone = rollback(both, nccl_run)
    args, env = launch(undone)
    assert FLAG in args and "NCCL_ALGO" not in env
    assert launch(undone) == launch(flagged)


def test_the_flag_after_nccl_env_keeps_the_nccl_variables(roles_path) -> None:
    start = base(roles_path)
    tuned, _ = run(start, "nccl-env", roles_path, TREE, run_id="run-a")
    both, flag_run = run(tuned, "flag-role", roles_path, run_id="run-b")
    args, env = launch(both)
    assert FLAG in args and "NCCL_ALGO='Tree'" in env
    assert run(both, "nccl-env", roles_path, TREE)[1]["changed"] == 0
    undone = rollback(both, flag_run)
    assert launch(undone) == launch(tuned)
    # The plain service role renders the composition too (it never drops a run's part).
    assert run(both, "sglang-service", roles_path)[1]["changed"] == 0


def test_reapplying_with_an_empty_mapping_removes_the_part(roles_path) -> None:
    tuned, _ = run(base(roles_path), "nccl-env", roles_path, TREE)
    cleared, _ = run(tuned, "nccl-env", roles_path, {"nccl_env": {}})
    assert "NCCL_ALGO" not in launch(cleared)[1]
    assert json.loads(cleared.files[f"{STATE}/desired.json"].content or "")["contributions"] == {}


def test_merge_flags_replaces_a_flag_in_place_and_never_doubles_a_value() -> None:
    assert merge_flags(["--tp", "8", "--x"], ["--x"], ["--tp", "4"]) == ["--tp", "4", "--x"]
    assert merge_flags(["--backend", "a"], ["--backend", "trtllm", "--y"]) == ["--backend", "trtllm", "--y"]
    assert merge_flags(["--a=1"], ["--a=2"]) == ["--a=2"]


def test_an_unchanged_part_keeps_its_record() -> None:
    recorded = {"x": {"args": ["--f"], "env": {}, "run_id": "old"}}
    assert with_contribution(recorded, "x", ["--f"], {}, "new") == recorded
    assert with_contribution(recorded, "x", [], {}, "new") == {}
    assert with_contribution(recorded, "y", [], {"A": "1"}, "new")["y"]["run_id"] == "new"


# ---- nothing silently ignored (plan/varcheck.py, inspect gates --feature)


def test_unknown_extra_variable_warns_with_the_closest_name() -> None:
    found = discover("nccl-env", "h01", INVENTORY, {"NCCL_ALGO": "Tree"})
    assert any("NCCL_ALGO" in w and "did you mean nccl_env?" in w and '{"nccl_env": {"NCCL_ALGO": "Tree"}}' in w
               for w in found.warnings), found.warnings
    found = discover("nccl-env", "h01", INVENTORY, {"nccl_envs": {"NCCL_ALGO": "Tree"}})
    assert any("nccl_envs" in w and "did you mean nccl_env?" in w for w in found.warnings), found.warnings
    assert not [w for w in discover("nccl-env", "h01", INVENTORY, {"nccl_env": {"NCCL_ALGO": "Ring"}}).warnings
                if "did you mean" in w]


def test_mapping_variable_given_as_a_string_says_so() -> None:
    from gpuops.errors import GpuopsError

    with pytest.raises(GpuopsError) as caught:
        discover("nccl-env", "h01", INVENTORY, {"nccl_env": '{"NCCL_ALGO":"Tree"}'})
    text = str(caught.value)
    assert "is a mapping" in text and "string" in text and """-e '{"nccl_env": {"NCCL_ALGO": "Tree"}}'""" in text


def test_unknown_gate_feature_exits_2_before_connecting(tmp_path: Path) -> None:
    import subprocess
    import sys

    # An inventory whose only host cannot be reached: a connection attempt would fail differently.
    (tmp_path / "inv.yml").write_text("all:\n  hosts:\n    h01: {ansible_host: 192.0.2.1, ansible_port: 1}\n")
    proc = subprocess.run([sys.executable, "-m", "gpuops.cli", "inspect", "gates", "--feature", "flashinfer_allreduce",
                           "-i", str(tmp_path / "inv.yml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did you mean flashinfer_allreduce_fusion?" in proc.stderr and proc.stdout == ""


def test_inventory_mapping_given_as_a_string_names_the_host() -> None:
    from gpuops.errors import GpuopsError

    with pytest.raises(GpuopsError) as caught:
        discover("nccl-env", "gpu07", dict(INVENTORY, nccl_env="NCCL_ALGO=Tree"), {})
    assert "gpu07: inventory variable nccl_env is a mapping" in str(caught.value)
    # -e wins over the inventory: a good -e value is not refused for the inventory's bad one.
    assert discover("nccl-env", "gpu07", dict(INVENTORY, nccl_env="x"), {"nccl_env": {"NCCL_ALGO": "Ring"}})


def test_launch_flags_can_take_an_inventory_flag_out_and_its_rollback_puts_it_back(roles_path) -> None:
    """tune's run without speculation: the launch-flags role's `launch_drop` takes the inventory's
    `--tp 8` (flag and value) out; flags contributed by other runs stand; the rollback restores it."""
    start = base(roles_path)
    flagged, _ = run(start, "flag-role", roles_path, run_id="run-a")
    dropped, drop_run = run(flagged, "launch-flags", roles_path, {"launch_drop": ["--tp", FLAG]}, run_id="run-b")
    args, _ = launch(dropped)
    assert "--tp" not in args and "8" not in args and "--model-path" in args and "/models/m" in args
    assert FLAG in args  # a run's own contribution is never taken out by another's drop
    desired = json.loads(dropped.files[f"{STATE}/desired.json"].content or "")
    assert desired["contributions"]["launch-flags"] == {"args": [], "env": {}, "drop": ["--tp", FLAG], "run_id": "run-b"}
    assert run(dropped, "launch-flags", roles_path, {"launch_drop": ["--tp", FLAG]}, run_id="run-c")[1]["changed"] == 0
    assert launch(rollback(dropped, drop_run)) == launch(flagged)
    # no drop recorded: the file and launch are what they were before drop existed
    assert "drop" not in json.loads(flagged.files[f"{STATE}/desired.json"].content or "")["contributions"]["flag-role"]


def test_drop_flags_takes_each_flag_with_its_values() -> None:
    from gpuops.release.flags import drop_flags

    words = ["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps=3",
             "--trust-remote-code", "--speculative-draft-model-path", "/d", "--tp", "8"]
    assert drop_flags(words, ["--speculative-algorithm", "--speculative-num-steps", "--speculative-draft-model-path"]) \
        == ["--model-path", "/m", "--trust-remote-code", "--tp", "8"]
    assert drop_flags(words, []) == words
