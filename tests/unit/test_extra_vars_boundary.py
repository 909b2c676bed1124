"""``-e`` values are checked once, at the boundary, into ``ExtraVars`` (apply/extra_vars.py): a
bad one is one line naming it, before anything is kept, gathered or planned; what flows down is
read-only and each host sees its own variables under it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

import pytest

from gpuops.apply.extra_vars import ExtraVars
from gpuops.errors import GpuopsError
from gpuops.inventory.model import Host


def test_a_mapping_given_as_text_is_refused_at_the_boundary() -> None:
    with pytest.raises(GpuopsError, match=r"^-e nccl_env: nccl_env is a mapping, but it was given as the string"):
        ExtraVars.checked("nccl-env", {"nccl_env": "NCCL_ALGO=Tree"})


def test_a_variable_no_task_reads_is_let_through_for_the_plan_to_warn_about() -> None:
    extra = ExtraVars.checked("nccl-env", {"NCCL_ALGO": "Tree", "nccl_env": {"NCCL_ALGO": "Tree"}})
    assert dict(extra) == {"NCCL_ALGO": "Tree", "nccl_env": {"NCCL_ALGO": "Tree"}}


def test_what_flows_down_is_read_only_and_not_the_callers_dict() -> None:
    values = {"nccl_env": {"NCCL_ALGO": "Tree"}}
    extra = ExtraVars.checked("nccl-env", values)
    values["sglang_port"] = 1
    assert "sglang_port" not in extra
    with pytest.raises(TypeError):
        extra._values["x"] = 1  # type: ignore[index]


def test_each_host_sees_its_inventory_vars_under_the_extra_vars() -> None:
    host = Host(name="h1", address="127.0.0.1", port=22, user="u", key_file=None, connection="ssh", groups=(),
                vars={"sglang_port": 30000, "gpuops_state_dir": "/srv/gpuops"})
    assert ExtraVars({"sglang_port": 30001}).for_host(host) == {"sglang_port": 30001, "gpuops_state_dir": "/srv/gpuops"}


def test_its_repr_names_the_variables_not_their_values() -> None:
    assert repr(ExtraVars({"sglang_api_key": "s3cret"})) == "ExtraVars(['sglang_api_key'])"


def test_the_cli_refuses_a_bad_extra_var_in_one_line_before_anything_is_kept(
        run_gpuops: Callable[..., subprocess.CompletedProcess], tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    # port 9 on loopback: nothing there; the refusal must come before any connection is tried
    inventory.write_text("all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1, ansible_port: 9}\n")
    kept = tmp_path / "kept"
    done = run_gpuops("apply", "nccl-env", "-i", str(inventory), "-e", "nccl_env=NCCL_ALGO=Tree",
                      env={"GPUOPS_CACHE": str(tmp_path)})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "-e nccl_env: nccl_env is a mapping" in lines[0], done.stderr
    assert not kept.exists() or not any(kept.rglob("*")), "the variables were kept (hashed) before they were checked"
