"""Stack consistency on lab hosts (real SGLang dist-info metadata, simulated package versions):
a host whose description pins another stack than its release requires, with torch built for a
newer CUDA than its driver and no FlashInfer while fusion is asked for; and a host on another
release than its description's, which the lab gives that release's own pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuops.lab.gpu_description import BUILTIN_DIR

pytestmark = pytest.mark.integration


def test_stack_mismatches_are_reported(lab_factory, run_gpuops, tmp_path: Path) -> None:
    from gpuops.lab.hosts import LabSpec

    description = yaml.safe_load((BUILTIN_DIR / "rtx-pro-6000-ws-x4.yaml").read_text())
    description["cuda_driver_version"] = "12.4"
    description["packages"] = {"sglang": "0.5.8", "sgl-kernel": "0.3.20", "torch": "2.9.1+cu128"}  # no flashinfer
    description["server"]["cmdline"] += " --enable-flashinfer-allreduce-fusion"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(description))
    lab = lab_factory(LabSpec(gpu=str(broken), sglang="0.5.8", names=("broken",)),
                      LabSpec(gpu="h100-x8", sglang="0.5.14", names=("newer",)))
    proc = run_gpuops("inspect", "host", "-i", str(lab.inventory_path), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    problems = "\n".join(hosts["broken"]["stack_problems"])
    assert "sglang 0.5.8 requires flashinfer-python==0.6.1, which is not installed" in problems
    assert "sglang 0.5.8 requires sgl-kernel==0.3.21; installed: 0.3.20" in problems
    assert "torch is built for CUDA 12.8 but the driver supports CUDA 12.4" in problems
    assert "flashinfer is not installed, but the server is launched with enable_flashinfer_allreduce_fusion" in problems
    assert hosts["broken"]["facts"]["software"]["sglang"]["requires"] == [
        "flashinfer_python==0.6.1", "sgl-kernel==0.3.21", "torch==2.9.1"]
    # Another release than the description's: the lab installs what that release pins.
    software = hosts["newer"]["facts"]["software"]
    assert software["sglang"]["version"] == "0.5.14" and software["flashinfer"]["version"] == "0.6.12"
    assert software["sglang_kernel"]["version"] == "0.4.4" and software["sgl_kernel"] is None
    assert hosts["newer"]["stack_problems"] == []
    text = run_gpuops("inspect", "host", "-v", "-i", str(lab.inventory_path), "-l", "broken", timeout=300).stdout
    assert "STACK    torch is built for CUDA 12.8" in text
