"""What the real H200 device run taught us, kept as tests (benchmarks/results/h200-x1/).

The capture there came from the GPU machine's own nvidia-smi/torch/pip in the same call as
`gpuops inspect host` over a local connection; these tests pin that gpuops' parsers agree with
what the machine's own tools said, and that the JSON document kept the documented shape.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from gpuops.facts.gpu import parse_query_csv

CAPTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-x1"


def _torch_truth() -> dict[str, str]:
    # e.g. "torch 2.11.0+cu130 cuda 13.0 nccl (2, 28, 9) cap (9, 0) NVIDIA H200 1"
    line = (CAPTURE / "torch.txt").read_text().splitlines()[1]
    m = re.match(r"torch (\S+) cuda (\S+) nccl \((\d+), (\d+), (\d+)\) cap \((\d+), (\d+)\) (.+) (\d+)$", line)
    assert m, line
    return {
        "torch": m.group(1), "cuda": m.group(2), "nccl": ".".join(m.group(3, 4, 5)),
        "cc": f"{m.group(6)}.{m.group(7)}", "name": m.group(8), "count": m.group(9),
    }


def test_query_csv_of_the_device_parses_to_what_torch_saw() -> None:
    truth = _torch_truth()
    gpus = parse_query_csv((CAPTURE / "query.csv").read_text())
    assert len(gpus) == int(truth["count"]) == 1
    gpu = gpus[0]
    assert gpu.name == truth["name"] == "NVIDIA H200"
    assert gpu.compute_capability == truth["cc"] == "9.0"
    assert gpu.memory_total_mib == 143771


def _replayed_device(tmp_path: Path, monkeypatch) -> dict:
    """`inspect host --json` facts, computed now by gpuops' code, of a local host that is the device
    as captured: its nvidia-smi replays the real H200 capture (the lab's replayer over
    tests/fixtures), and its python's site holds the packages (name, version) that the device's pip listed,
    with torch's version.py as the torch wheel writes it."""
    from gpuops.facts.collect import host_json
    from gpuops.inspection import inspect_hosts
    from gpuops.inventory import Host
    from gpuops.lab import fake_nvidia_smi
    from gpuops.lab.gpu_description import load_description
    from gpuops.transport import ConnectOptions

    truth = _torch_truth()
    desc = tmp_path / "gpu.json"
    desc.write_text(json.dumps(dict(load_description("h200-x1").replay)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nGPUOPS_LAB_GPU="{desc}" exec "{sys.executable}" "{fake_nvidia_smi.__file__}" "$@"\n')
    smi.chmod(0o755)
    site = tmp_path / "site"
    for line in (CAPTURE / "pip.txt").read_text().splitlines():
        name, version = line.split()[:2]
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\n__version__ = '{truth['torch']}'\ncuda: Optional[str] = '{truth['cuda']}'\nhip = None\n")
    python = tmp_path / "python3"  # -S: this machine's own site-packages (its torch) stay out of view
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    host = Host(name="localhost", address=None, port=None, user=None, key_file=None, connection="local",
                groups=("all",), vars={"sglang_port": 9, "sglang_python": str(python)})
    outcome = inspect_hosts([host], ConnectOptions(), with_gates=False)["localhost"]
    doc = host_json(outcome)
    assert doc["ok"] is True, doc["error"]
    return doc["facts"]


def test_inspect_of_the_replayed_device_agrees_with_torch_pip_and_the_device_run(tmp_path, monkeypatch) -> None:
    truth = _torch_truth()
    facts = _replayed_device(tmp_path, monkeypatch)
    gpu = facts["gpus"][0]
    assert facts["gpu_count"] == int(truth["count"]) == 1
    assert (gpu["name"], gpu["compute_capability"]) == (truth["name"], truth["cc"])
    assert (gpu["compute_capability"], gpu["sm"], gpu["arch"]) == ("9.0", "sm90", "Hopper")
    assert facts["cuda_driver_version"] == truth["cuda"] == "13.0"
    assert facts["interconnect"]["nvlink"] is False
    software = facts["software"]
    assert software["torch"]["cuda"] == truth["cuda"]
    assert software["torch"]["version_full"] == truth["torch"]
    assert truth["torch"].startswith(software["torch"]["version"])
    assert software["nccl"]["version"] == truth["nccl"]
    pip_versions = dict(line.split()[:2] for line in (CAPTURE / "pip.txt").read_text().splitlines())
    assert pip_versions["torch"] == software["torch"]["version"]
    # What gpuops computes now is what it computed on the device itself (the kept --json document).
    device = json.loads((CAPTURE / "inspect.json").read_text())["hosts"]["localhost"]
    assert device["ok"] is True and device["error"] is None
    kept = device["facts"]
    assert facts["gpus"] == kept["gpus"]
    for key in ("gpu_count", "compute_capability", "sm", "arch", "driver_version", "cuda_driver_version"):
        assert facts[key] == kept[key], key
    assert facts["interconnect"]["nvlink"] == kept["interconnect"]["nvlink"]
    for package in ("torch", "nccl"):
        for field in ("version", "source") + (("cuda",) if package == "torch" else ()):
            assert software[package][field] == kept["software"][package][field], (package, field)
