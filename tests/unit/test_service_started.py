"""sglang-service keeps the server running (Ansible's `state: started`): the `server` module, planned
from the gather's answer whether a server runs on the host's port."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuops.apply.probes import parse_server, server_probe
from gpuops.errors import GpuopsError
from gpuops.gather import ProbeOutput
from gpuops.plan.planner import discover, plan_role
from test_plan import BASE_VARS, empty_facts, facts_after, write_role


def _in_place() -> object:
    """A host whose launch files are already what sglang-service renders."""
    facts = empty_facts("sglang-service", BASE_VARS)
    return facts_after(plan_role("sglang-service", facts, BASE_VARS, {}), facts)


@pytest.mark.parametrize("role", ["sglang-service", "nccl-env"])
def test_the_role_asks_the_gather_whether_the_server_runs(role: str) -> None:
    assert discover(role, "h01", BASE_VARS, {}).needs_server_state  # nccl-env includes sglang-service


def test_a_stopped_server_is_started_by_the_restart_handler_with_nothing_to_write() -> None:
    plan = plan_role("sglang-service", dataclasses.replace(_in_place(), server_running=False), BASE_VARS, {})
    assert plan.changes == () and plan.starts
    assert [h.name for h in plan.handlers] == ["restart sglang"]
    assert plan.handlers[0].service.port == 30000 and plan.handlers[0].service.manager == "process"


@pytest.mark.parametrize("running", [True, None], ids=["running", "not gathered"])
def test_a_running_or_unknown_server_is_left_alone(running: bool | None) -> None:
    plan = plan_role("sglang-service", dataclasses.replace(_in_place(), server_running=running), BASE_VARS, {})
    assert plan.changes == () and plan.handlers == () and not plan.starts


def test_a_stopped_server_with_changes_restarts_once() -> None:
    facts = dataclasses.replace(empty_facts("sglang-service", BASE_VARS), server_running=False)
    plan = plan_role("sglang-service", facts, BASE_VARS, {})
    assert plan.changes and plan.starts and [h.name for h in plan.handlers] == ["restart sglang"]


def test_a_started_task_must_notify_a_handler(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- name: up\n  server: {state: started}\n")
    with pytest.raises(GpuopsError, match="must notify the handler that starts the server"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])


@pytest.mark.parametrize("stdout, running", [("pid=4242\n", True), ("pid=\n", False)])
def test_the_probe_reads_the_preambles_find(stdout: str, running: bool) -> None:
    assert "$GPUOPS_SERVER_PID" in server_probe().script
    assert parse_server(ProbeOutput(stdout=stdout, stderr="", exit_status=0)) is running


@pytest.mark.parametrize("stdout, status", [("", 0), ("pid=1\n", 1), ("garbage", 0)])
def test_an_answer_that_is_not_the_probes_fails_it(stdout: str, status: int) -> None:
    with pytest.raises(ValueError):
        parse_server(ProbeOutput(stdout=stdout, stderr="", exit_status=status))


def test_a_state_other_than_started_is_refused(tmp_path: Path) -> None:
    write_role(tmp_path, "r", "- name: down\n  server: {state: stopped}\n  notify: h\n",
               handlers="- name: h\n  service: {manager: process, name: s, state_dir: /s, port: 1}\n")
    with pytest.raises(GpuopsError, match="state must be started, not 'stopped'"):
        discover("r", "h01", {}, {}, roles_path=[tmp_path])
