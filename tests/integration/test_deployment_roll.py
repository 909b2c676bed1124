"""A multi-node SGLang server on lab hosts (the stand-in's --nnodes/--node-rank/--dist-init-addr):
a rolling apply never splits its nodes, and a node of rank > 0 is healthy by /health alone."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from gpuops.lab.hosts import LabSpec
from gpuops.lab.ports import free_port


def _node_args(rank: int, addr: str) -> tuple[str, ...]:
    return ("--model-path", "/models/Kimi-K2.5", "--tp", "16", "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", addr)


def test_serial_1_rolls_the_nodes_of_a_deployment_together(lab_factory: Any, run_gpuops: Any) -> None:
    addr = f"127.0.0.1:{free_port()}"
    lab = lab_factory(LabSpec(count=1, names=("n0",), server_args=_node_args(0, addr)),
                      LabSpec(count=1, names=("n1",), server_args=_node_args(1, addr)))
    extra = json.dumps({"nccl_env": {"NCCL_MIN_NCHANNELS": "4"}, "gpuops_health_timeout": 20})
    proc = run_gpuops("apply", "nccl-env", "-i", str(lab.inventory_path), "--serial", "1", "--json", "-e", extra,
                      "-e", '{"sglang_deployment": "kimi"}', timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["n0"]["status"] == hosts["n1"]["status"] == "finished", hosts
    for name in ("n0", "n1"):
        assert "NCCL_MIN_NCHANNELS='4'" in (lab.host(name).state_dir / "sglang.env").read_text()
    leader = lab.host("n0")
    with urllib.request.urlopen(f"http://127.0.0.1:{leader.server_port}/get_server_info", timeout=10) as reply:
        info = json.loads(reply.read())
    assert info["env"]["NCCL_MIN_NCHANNELS"] == "4" and info["nnodes"] == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{lab.host('n1').server_port}/health", timeout=10) as reply:
        assert reply.status == 200
