"""The roles that ship: they load, use only known modules, and plan for every manager (pure)."""

from __future__ import annotations

import pytest

from gpuops.plan.planner import discover
from gpuops.plan.modules import SPECS
from gpuops.plan.roles import load_role, load_role_tree, project_root

SHIPPED = ("sglang-service", "nccl-env", "fusion-sm120")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_roles_load(name: str) -> None:
    roles = load_role_tree(name)
    assert name in roles and "sglang-service" in roles
    for role in roles.values():
        assert all(task.module in SPECS for task in role.tasks)
        assert all(task.where.startswith(f"roles/{role.name}/") for task in role.tasks)


def test_fusion_role_includes_the_service_role_with_its_flag() -> None:
    role = load_role("fusion-sm120")
    modules = [t.module for t in role.tasks]
    assert modules == ["gate_patch", "include_role"]
    assert role.tasks[0].register == "fusion" and role.tasks[0].notify == ("restart sglang",)
    # docker: the derived image (and the inventory image it stands in for) joins the flag.
    assert role.tasks[1].vars == {"sglang_contribute_args": "{{ fusion.launch_flags }}",
                                  "sglang_contribute_image": "{{ fusion.image | default('') }}",
                                  "sglang_contribute_image_base": "{{ fusion.image_base | default('') }}"}
    assert role.tasks[1].when == "fusion.applies"


def test_service_role_defines_the_restart_handler() -> None:
    role = load_role("sglang-service")
    assert [h.name for h in role.handlers] == ["restart sglang"]
    assert role.handlers[0].module == "service"


@pytest.mark.parametrize("manager, expected", [
    ("process", {"desired.json", "sglang.env", "sglang-launch.sh"}),
    ("systemd", {"desired.json", "sglang.env", "sglang.service", "gpuops-env.conf"}),
    ("docker", {"desired.json", "sglang.docker.env", "sglang-docker-run.sh"}),
])
def test_each_manager_touches_its_own_files(manager: str, expected: set[str]) -> None:
    found = discover("sglang-service", "h01", {"sglang_manager": manager, "gpuops_state_dir": "/s"}, {})
    assert {p.rsplit("/", 1)[1] for p in found.paths} == expected


def test_fusion_discovery_asks_for_the_gate_scan() -> None:
    found = discover("fusion-sm120", "h01", {"gpuops_state_dir": "/s"}, {})
    assert found.needs_gate_scan
    assert not discover("nccl-env", "h01", {"gpuops_state_dir": "/s"}, {}).needs_gate_scan


def test_readme_documents_every_module_and_role() -> None:
    text = (project_root() / "roles" / "README.md").read_text()
    for name in list(SPECS) + list(SHIPPED):
        assert f"`{name}`" in text
