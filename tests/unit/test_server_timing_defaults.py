"""The server's timing defaults (health wait, one /health question, stop grace) fit a real SGLang
server, and every manager and the role use the same ones (issue 36, defect 7: the old 60 s health
wait, 2-3 s probes and 5-10 s grace were the lab's stand-in numbers)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import yaml
from labtools import fixtures_path

from gpuops.lab.lab_files import inventory_data
from gpuops.lab.systemd_host import GROUP_VARS as SYSTEMD_LAB_VARS
from gpuops.plan.modules import service_handler
from gpuops.plan.roles import project_root
from gpuops.remote import process_manager, service_docker, service_systemd
from gpuops.remote.apply_service import Service
from gpuops.remote.service_base import DEFAULT_HEALTH_TIMEOUT_S, DEFAULT_STOP_GRACE_S, HEALTH_PROBE_TIMEOUT_S

# A real SGLang 0.5.16 server on the lent H200 with a 45 M-parameter model, as recorded.
REAL = fixtures_path() / "real" / "h200-x1" / "sglang-0.5.16"
SLOWEST_COLD_START_S = 171  # start to /health 200 over the cold starts (145-171 s; warm: 63-65 s)
DRAIN_GONE_S = 8.2          # SIGTERM to the main pid: every process gone (its stop.json lost the per-pid times)
LARGE_MOE_LOAD_S = 10 * 60  # a large MoE model's weights load for 10-20 minutes on top


def test_the_defaults_fit_the_recorded_real_server_with_room_for_a_large_model() -> None:
    start = json.loads((REAL / "start.json").read_text())
    health = json.loads((REAL / "http" / "health.json").read_text())
    assert start["health_ms"] / 1000 <= SLOWEST_COLD_START_S
    assert DEFAULT_HEALTH_TIMEOUT_S >= SLOWEST_COLD_START_S + LARGE_MOE_LOAD_S
    # /health runs a 1-token generation, then sleeps 1 s: ~1002 ms on an idle server.
    answers_s = [ms / 1000 for ms in [*start["health_poll_ms"], health["elapsed_ms"]]]
    assert min(answers_s) >= 1.0 and HEALTH_PROBE_TIMEOUT_S >= 5 * max(answers_s)
    assert DEFAULT_STOP_GRACE_S >= 3 * DRAIN_GONE_S


def test_every_manager_and_the_role_use_the_same_defaults() -> None:
    defaults = yaml.safe_load((project_root() / "roles" / "sglang-service" / "defaults.yml").read_text())
    assert (defaults["gpuops_health_timeout"], defaults["gpuops_stop_grace"]) == (DEFAULT_HEALTH_TIMEOUT_S,
                                                                                  DEFAULT_STOP_GRACE_S)
    spec = service_handler.spec  # type: ignore[attr-defined]
    assert (spec.arg("health_timeout").default, spec.arg("grace").default) == (DEFAULT_HEALTH_TIMEOUT_S,
                                                                                DEFAULT_STOP_GRACE_S)
    service = Service({"manager": "process"}, process_manager, None)
    assert (service.health_timeout, service.grace) == (DEFAULT_HEALTH_TIMEOUT_S, DEFAULT_STOP_GRACE_S)
    assert service_docker.DockerService({}).grace == DEFAULT_STOP_GRACE_S
    assert service_systemd.SystemdService({}).grace == DEFAULT_STOP_GRACE_S
    assert inspect.signature(process_manager.start).parameters["health_timeout"].default == DEFAULT_HEALTH_TIMEOUT_S
    assert inspect.signature(process_manager.stop).parameters["grace"].default == DEFAULT_STOP_GRACE_S
    # Documented where the variables are.
    table = (project_root() / "roles" / "README.md").read_text()
    assert f"| `gpuops_health_timeout` | `{DEFAULT_HEALTH_TIMEOUT_S}` |" in table
    assert f"| `gpuops_stop_grace` | `{DEFAULT_STOP_GRACE_S}` |" in table


def test_the_lab_keeps_its_short_values_in_its_own_inventories(tmp_path: Path) -> None:
    """The stand-in starts in a blink: the lab's inventories say so, so that no lab test waits longer
    because the product's defaults fit a real server."""
    lab = inventory_data(tmp_path, [], "me", "python3")["all"]["children"]["lab"]["vars"]
    for group in (lab, SYSTEMD_LAB_VARS):
        assert group["gpuops_health_timeout"] <= 60 and group["gpuops_stop_grace"] <= 5, group
