"""`gpuops lab describe HOST -i INV`: a description of a (lab) host from its facts, that loads back
as the same shape; credentials stay out. Errors in a description name the field and a valid value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

KEY = "sk-describe-9d8c7b6a"


def test_describe_writes_a_description_that_loads_back(lab_factory, run_gpuops, tmp_path: Path) -> None:
    from gpuops.lab.gpu_description import load_description
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(gpu="h100-x8", sglang="0.5.8", names=("hopper",),
                              server_args=("--model-path", "/models/m", "--tp", "8", "--api-key", KEY),
                              server_env={"SGLANG_HF_TOKEN": "hf_describe_secret"}))
    out = tmp_path / "hopper.yaml"
    proc = run_gpuops("lab", "describe", "hopper", "-i", str(lab.inventory_path), "-o", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("# GPU description of hopper") and "docs/lab-host-description.md" in text
    assert KEY not in text and "hf_describe_secret" not in text
    described = load_description(str(out))
    assert described.compute_capability == "9.0" and described.gpu_count == 8
    data = yaml.safe_load(text)
    assert all("NV18" in row for row in data["topology"][1:2])
    assert "--tp 8" in data["server"]["cmdline"] and data["packages"]["sglang"] == "0.5.8"


def test_description_errors_name_the_field_and_a_valid_value(run_gpuops, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: 2\ngpu_name: X\ncompute_capability: ''\nmemory_mib: 1\ndriver_version: '1'\ncuda_driver_version: '12.8'\n")
    proc = run_gpuops("lab", "up", "--dir", str(tmp_path / "lab"), "--gpu", str(bad), "--no-server", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert 'compute_capability must be "major.minor" in quotes, such as "12.0"' in proc.stderr
    assert "docs/lab-host-description.md" in proc.stderr
    noserver = tmp_path / "noserver.yaml"
    noserver.write_text(bad.read_text().replace("''", '"9.0"'))
    proc = run_gpuops("lab", "up", "--dir", str(tmp_path / "lab2"), "--gpu", str(noserver), "--sglang", "0.5.8", timeout=120)
    assert proc.returncode == 2
    assert "has no `server:` mapping" in proc.stderr and "--no-server" in proc.stderr and "server_args" not in proc.stderr
