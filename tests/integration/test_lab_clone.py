"""`gpuops lab clone HOST`: a lab host shaped like another host, from that host's gathered facts."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from gpuops.lab.clone import description_from_facts
from gpuops.lab.hosts import LabSpec, load_lab

pytestmark = pytest.mark.integration

QUERY = "--query-gpu=index,uuid,name,compute_cap,memory.total,pci.bus_id,power.limit,clocks.max.sm --format=csv"


def test_clone_copies_gpus_topology_sglang_release_and_server_flags(lab_factory, run_gpuops, tmp_path) -> None:
    # The "real" host: 8x H100 with NVLink, SGLang 0.5.14, a server with its own flags and env.
    source = lab_factory(LabSpec(gpu="h100-x8", sglang="0.5.14",
                                 server_args=("--model-path", "/models/m", "--tp", "8", "--enable-flashinfer-allreduce-fusion"),
                                 server_env={"NCCL_ALGO": "Ring", "HF_TOKEN": "hf_secret_value"}))
    clone_dir = tmp_path / "clone-lab"
    done = run_gpuops("lab", "clone", "h01", "-i", str(source.inventory_path), "--dir", str(clone_dir), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    [host] = doc["hosts"]
    assert host["name"] == "h01-lab" and host["sglang"] == "0.5.14" and host["server_healthy"]
    clone = load_lab(clone_dir)
    try:
        def run(lab, name, command):
            return subprocess.run(lab.ssh_command(name, command), capture_output=True, timeout=60).stdout

        for command in (f"nvidia-smi {QUERY}", "nvidia-smi topo -m", "nvidia-smi topo -p2p r"):
            assert run(clone, "h01-lab", command) == run(source, "h01", command), command
        assert run(clone, "h01-lab", "python3 -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'") == b"0.5.14\n"
        desc = yaml.safe_load((clone_dir / "h01-lab" / "gpu-description.yaml").read_text())
        # The source runs 0.5.14 on a description made for 0.5.8: the lab gave it 0.5.14's own pins.
        assert desc["nvlink"]["links"] == 18 and desc["packages"]["torch"] == "2.11.0+cu128"
        assert desc["packages"]["sglang-kernel"] == "0.4.4" and "sgl-kernel" not in desc["packages"]
        assert "--enable-flashinfer-allreduce-fusion" in desc["server"]["cmdline"]
        # Server environment: NCCL kept, a credential never copied.
        assert desc["server"]["env"].get("NCCL_ALGO") == "Ring"
        assert "HF_TOKEN" not in desc["server"]["env"] and "hf_secret_value" not in done.stdout
        assert "hf_secret_value" not in (clone_dir / "inventory.yml").read_text()
    finally:
        clone.stop(remove=True)


def test_description_from_facts_refuses_a_host_without_gpus() -> None:
    from gpuops.errors import GpuopsError

    with pytest.raises(GpuopsError, match="gpu-a: no GPU facts"):
        description_from_facts({"gpus": [], "gpu_status": {"known": False, "reason": "nvidia-smi not found"}}, "gpu-a")
