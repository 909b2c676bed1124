"""Each task module declares its arguments beside its planner (plan/modules.py: SPECS), and that
one declaration is what the role loader checks, what the planner checks once rendered, and what
roles/README.md documents."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from gpuops.plan import compose, modules
from gpuops.plan.argspec import TABLE_MARK, with_module_table
from gpuops.plan.modules import PLANNERS, SPECS, modules_markdown, service_handler
from gpuops.plan.planner import discover
from gpuops.plan.roles import RoleError, load_role, project_root


def write_role(base: Path, tasks: str, defaults: str = "") -> None:
    role = base / "r"
    role.mkdir(parents=True)
    (role / "tasks.yml").write_text(tasks)
    if defaults:
        (role / "defaults.yml").write_text(defaults)


def load_error(tmp_path: Path, tasks: str) -> str:
    write_role(tmp_path, tasks)
    with pytest.raises(RoleError) as info:
        load_role("r", [tmp_path])
    message = str(info.value)
    assert "\n" not in message  # one line
    return message


def test_readme_module_table_is_the_one_generated_from_the_specs() -> None:
    readme = (project_root() / "roles" / "README.md").read_text()
    assert TABLE_MARK in readme
    assert with_module_table(readme, modules_markdown()) == readme, "roles/README.md is stale: run scripts/module-docs"


def test_readme_lists_every_argument_of_every_module() -> None:
    readme = (project_root() / "roles" / "README.md").read_text()
    rows = {line.split("|")[1].strip().split()[0].strip("`"): re.split(r"(?<!\\)\|", line)[2]
            for line in readme.splitlines() if line.startswith("| `")}
    for name, spec in SPECS.items():
        assert name in rows, f"roles/README.md has no row for {name}"
        for arg in spec.args:
            assert f"`{arg.name}`" in rows[name], f"roles/README.md: {name} does not list {arg.name}"


def test_every_module_a_task_can_name_has_its_code() -> None:
    assert set(SPECS) == set(PLANNERS) | {"include_role", "service"}
    assert all(PLANNERS[name].spec is SPECS[name] for name in PLANNERS)
    assert service_handler.spec is SPECS["service"] and SPECS["service"].handler_only


@pytest.mark.parametrize("name", sorted(PLANNERS) + ["service"])
def test_every_argument_the_code_reads_is_declared(name: str) -> None:
    # The planners read their arguments as args["x"] / args.get("x"): each must be in the spec, so
    # the spec cannot fall behind the code (compose's code lives in plan/compose.py).
    function = service_handler if name == "service" else PLANNERS[name]
    source = inspect.getsource(function)
    if name == "compose":
        source += inspect.getsource(compose.plan_compose)
    read = set(re.findall(r"\bargs(?:\.get\(|\[)\"(\w+)\"", source))
    assert read, f"{name}: no argument reads found"
    assert read <= set(SPECS[name].names), f"{name} reads undeclared {sorted(read - set(SPECS[name].names))}"


def test_unknown_argument_names_the_task_and_the_closest_valid_name(tmp_path: Path) -> None:
    message = load_error(tmp_path, "- name: the unit\n  template: {src: a.j2, dset: /etc/x}\n")
    assert "r/tasks.yml, task 1 (the unit): unknown key 'dset' for template" in message
    assert "did you mean 'dest'?" in message


def test_unknown_module_names_the_closest_module(tmp_path: Path) -> None:
    message = load_error(tmp_path, "- templat: {src: a, dest: /b}\n")
    assert "unknown module or key 'templat'" in message and "did you mean 'template'?" in message


def test_missing_required_argument(tmp_path: Path) -> None:
    message = load_error(tmp_path, "- lineinfile: {path: /etc/limits}\n")
    assert message.endswith("task 1: lineinfile needs line")


@pytest.mark.parametrize("task, expected", [
    ("- env: {dest: /x, entries: [NCCL_DEBUG=INFO]}\n", "entries of env must be a mapping, not list"),
    ("- gate_patch: {launch_args: --tp 8}\n", "launch_args of gate_patch must be a list, not str"),
    ("- lineinfile: {path: /x, line: y, create: [true]}\n", "create of lineinfile must be true or false, not list"),
    ("- template: {src: a, dest: {x: 1}}\n", "dest of template must be a string, not dict"),
    ("- template: {src: a, dest: /x, mode: true}\n", "mode of template must be a file mode"),
    ("- assert: {that: [1, 2]}\n", "that of assert must be an expression or a list of them"),
])
def test_a_literal_of_the_wrong_type_is_refused_at_load(tmp_path: Path, task: str, expected: str) -> None:
    assert expected in load_error(tmp_path, task)


def test_a_template_is_checked_once_rendered(tmp_path: Path) -> None:
    # "{{ x }}" may render to anything: the loader lets it through, the planner checks what it became.
    write_role(tmp_path, "- name: env file\n  env: {dest: /x, entries: \"{{ wanted }}\"}\n", defaults="wanted: [a, b]\n")
    load_role("r", [tmp_path])
    with pytest.raises(RoleError, match=r"h01: .*task 1 \(env file\): entries of env must be a mapping, not list"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])
    assert discover("r", "h01", {"wanted": {"NCCL_DEBUG": "INFO"}}, {}, roles_path=[tmp_path]).paths == ("/x",)


def test_shorthands_still_load(tmp_path: Path) -> None:
    write_role(tmp_path, "- assert: \"1 == 1\"\n- fail: stop\n  when: false\n- assert: [\"1 == 1\"]\n")
    role = load_role("r", [tmp_path])
    assert [dict(t.args) for t in role.tasks] == [{"that": "1 == 1"}, {"msg": "stop"}, {"that": ["1 == 1"]}]


def test_the_shipped_roles_pass_their_specs() -> None:
    for manager in ("process", "systemd", "docker"):
        for role in ("sglang-service", "nccl-env", "fusion-sm120"):
            discover(role, "h01", {"sglang_manager": manager, "gpuops_state_dir": "/s"}, {})
    assert modules.INCLUDE_ROLE.shorthand == "name"


def test_declared_defaults_reach_the_planner_only_for_arguments_left_out() -> None:
    spec = SPECS["gate_patch"]
    filled = spec.with_defaults({"python": "/opt/py", "allow_without_p2p": None})
    assert filled == {"python": "/opt/py", "allow_without_p2p": None, "target_sm": "sm120",
                      "feature": "flashinfer_allreduce_fusion", "allow_without_kernel": False}
    # One place for a default: the README's table shows the spec's, the planner gets the spec's.
    readme = (project_root() / "roles" / "README.md").read_text()
    assert "`target_sm` (default `sm120`)" in readme and "`style` (`sh` \\| `docker`, default `sh`)" in readme
