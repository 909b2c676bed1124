"""What the real H200 device run taught us, kept as tests (benchmarks/results/h200-x1/).

The capture there came from the GPU machine's own nvidia-smi/torch/pip in the same call as
`gpuops inspect host` over a local connection; these tests pin that gpuops' parsers agree with
what the machine's own tools said, and that the JSON document kept the documented shape.
"""

from __future__ import annotations

import json
import re
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


def test_inspect_json_from_the_device_agrees_with_torch_and_pip() -> None:
    truth = _torch_truth()
    doc = json.loads((CAPTURE / "inspect.json").read_text())
    host = doc["hosts"]["localhost"]
    assert host["ok"] is True and host["error"] is None
    facts = host["facts"]
    gpu = facts["gpus"][0]
    assert (gpu["compute_capability"], gpu["sm"], gpu["arch"]) == ("9.0", "sm90", "Hopper")
    assert facts["cuda_driver_version"] == "13.0"
    assert facts["interconnect"]["nvlink"] is False
    software = facts["software"]
    assert software["torch"]["cuda"] == truth["cuda"]
    assert truth["torch"].startswith(software["torch"]["version"])
    assert software["nccl"]["version"] == truth["nccl"]
    pip_versions = dict(line.split()[:2] for line in (CAPTURE / "pip.txt").read_text().splitlines())
    assert pip_versions["torch"] == software["torch"]["version"]
    assert facts["server"]["running"] is False
