"""lab clone's pure half: a host's facts JSON -> a GPU description the lab can start."""

from __future__ import annotations

from pathlib import Path

from gpuops.lab import fake_nvidia_smi
from gpuops.lab.clone import description_from_facts
from gpuops.lab.gpu_description import parse_description


def facts(count: int = 2) -> dict:
    names = [f"GPU{i}" for i in range(count)]
    return {
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "compute_capability": "9.0",
                  "memory_total_mib": 81559, "memory_used_mib": 5, "pci_bus_id": f"00000000:{i + 16:02X}:00.0",
                  "pcie_gen": 5, "pcie_width": 16, "power_limit_w": 700.0, "clocks_max_sm_mhz": 1980,
                  "driver_version": "570.1"} for i in range(count)],
        "driver_version": "570.1",
        "cuda_driver_version": "12.8",
        "interconnect": {
            "nvlink": True,
            "link_counts": {"NV18": 1},
            "matrix": {a: {b: ("X" if a == b else "NV18") for b in names} for a in names},
            "numa": {n: {"cpu_affinity": "0-7", "numa_node": "0"} for n in names},
            "p2p_matrix": {a: {b: ("X" if a == b else "OK") for b in names} for a in names},
        },
        "software": {"sglang": {"version": "0.5.14"}, "torch": {"version": "2.9.1+cu128", "cuda": "12.8"},
                     "flashinfer": None, "nccl": {"version": "2.27.5", "source": "nvidia-nccl-cu12"}},
        "server": {"argv": ["/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m x", "--tp", "2",
                            "--port", "30000"],
                   "port": 30000,
                   "env": {"NCCL_ALGO": "Ring", "HF_TOKEN": "hf_abc", "NCCL_IB_AUTH_KEY": "k", "PATH": "/bin"}},
    }


def test_description_round_trips_into_the_replayer() -> None:
    data = description_from_facts(facts(), "gpu-a")
    desc = parse_description(data, Path("gpu-a-lab.yaml"))
    assert desc.gpu_count == 2 and desc.compute_capability == "9.0"
    _, csv = fake_nvidia_smi.run(["--query-gpu=uuid,pci.bus_id,memory.used", "--format=csv,noheader"], desc.replay)
    assert csv == "GPU-0, 00000000:10:00.0, 5 MiB\nGPU-1, 00000000:11:00.0, 5 MiB\n"
    assert desc.replay["topology"] == [["X", "NV18"], ["NV18", "X"]]
    assert desc.packages == {"sglang": "0.5.14", "torch": "2.9.1+cu128", "nvidia-nccl-cu12": "2.27.5"}
    assert desc.server.args == ("--model-path", "/m x", "--tp", "2", "--port", "30000")


def test_only_tuning_environment_is_copied_never_credentials() -> None:
    env = description_from_facts(facts(), "gpu-a")["server"]["env"]
    assert env == {"NCCL_ALGO": "Ring"}


def test_no_running_server_means_no_server() -> None:
    data = facts()
    data["server"] = {"argv": None, "env": None}
    assert "server" not in description_from_facts(data, "gpu-a")


def test_a_server_launched_with_sglang_serve_is_cloned_with_its_flags() -> None:
    """gpuops launches `PYTHON ENV/bin/sglang serve FLAGS` where the release recommends it (docs/deploy.md)."""
    data = facts()
    data["server"]["argv"] = ["/venv/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "/m x", "--tp", "2",
                              "--port", "30000"]
    desc = parse_description(description_from_facts(data, "gpu-a"), Path("gpu-a-lab.yaml"))
    assert desc.server is not None and desc.server.args == ("--model-path", "/m x", "--tp", "2", "--port", "30000")
