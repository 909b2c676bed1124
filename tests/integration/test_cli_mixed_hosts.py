"""One failing host beside succeeding ones, through the CLI: exit 1, the good host's work done.

README: "Hosts run in parallel; one failing never stops the others" and "Exit status: 0 when every
host succeeded, 1 when one failed". Two ways to fail are mixed in: a host that cannot be reached at
all, and a host whose server crashes on the new configuration (rolled back on its own).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from labtools import server_info, tree_hashes

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket closes


def _inventory_with(lab, tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(lab.inventory_path.read_text())
    hosts = data["all"]["children"]["lab"]["hosts"]
    edit(hosts)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _add_unreachable(hosts: dict) -> None:
    first = next(iter(hosts.values()))
    hosts["gone"] = {**first, "ansible_port": _closed_port()}


def test_apply_with_a_crashing_and_an_unreachable_host_beside_a_good_one(lab_factory, run_gpuops,
                                                                         tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=2)
    good, crashing = lab.hosts

    def edit(hosts: dict) -> None:
        env = dict(hosts[crashing.name].get("sglang_env") or {})
        hosts[crashing.name]["sglang_env"] = {**env, "GPUOPS_STANDIN_CRASH_IF": "NCCL_MIN_NCHANNELS=8"}
        _add_unreachable(hosts)

    inventory = _inventory_with(lab, tmp_path, edit)
    crashing_before = tree_hashes(crashing.dir, skip_runs=True)
    done = run_gpuops("apply", "nccl-env", "-i", str(inventory), "--json", "-e", '{"nccl_env": {"NCCL_MIN_NCHANNELS": 8}}',
                      "-e", "gpuops_health_timeout=30", "-e", "gpuops_stop_grace=5", env={"XDG_STATE_HOME": ""})
    assert done.returncode == 1, done.stdout + done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert sorted(hosts) == sorted([good.name, crashing.name, "gone"])
    assert hosts[good.name]["ok"] is True and hosts[good.name]["status"] == "finished", hosts[good.name]
    assert "NCCL_MIN_NCHANNELS" in json.dumps(server_info(good.server_port))  # done, and running with it
    assert "NCCL_MIN_NCHANNELS='8'" in (good.state_dir / "sglang.env").read_text()
    assert hosts[crashing.name]["ok"] is False and hosts[crashing.name]["status"] == "rolled_back", hosts[crashing.name]
    assert tree_hashes(crashing.dir, skip_runs=True) == crashing_before
    assert "NCCL_MIN_NCHANNELS" not in json.dumps(server_info(crashing.server_port))  # the old server, back
    assert hosts["gone"]["ok"] is False and "connection refused" in hosts["gone"]["error"], hosts["gone"]


def test_bench_with_an_unreachable_host_and_a_dead_server_beside_a_good_one(lab_factory, run_gpuops,
                                                                            tmp_path: Path) -> None:
    lab = lab_factory(gpu="rtx-pro-6000-x8", sglang=None, count=2, server_env={"GPUOPS_STANDIN_TTFT_MS": "5"})
    good, serverless = lab.hosts

    def edit(hosts: dict) -> None:
        hosts[serverless.name]["sglang_port"] = _closed_port()  # its server is not where the inventory says
        _add_unreachable(hosts)

    inventory = _inventory_with(lab, tmp_path, edit)
    results = tmp_path / "results"
    done = run_gpuops("bench", "--remote", "-i", str(inventory), "--suite", "decode", "--output-len", "8",
                      "--num-requests", "1", "--warmup", "0", "--json", "--results-dir", str(results))
    assert done.returncode == 1, done.stdout + done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert sorted(hosts) == sorted([good.name, serverless.name, "gone"])
    line = hosts[good.name]
    assert line["ok"] is True and line["result_id"], line
    stored = json.loads(Path(line["result_file"]).read_text())
    assert stored["summary"]["completed"] == 1 and stored["summary"]["output_tokens"] == 8
    assert hosts[serverless.name]["ok"] is False and "cannot reach the server" in hosts[serverless.name]["error"]
    assert hosts["gone"]["ok"] is False and "connection refused" in hosts["gone"]["error"]
    assert hosts[serverless.name]["result_id"] is None and hosts["gone"]["result_id"] is None
