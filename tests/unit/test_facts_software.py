"""Software facts: the stdlib helper really runs (with this python) over a site dir built here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.facts.software import (
    parse_host_system,
    parse_python_packages,
    python_packages_probe,
    remote_source,
)
from gpuops.gather import ProbeOutput


def _dist(site: Path, name: str, version: str, package: str | None, files: dict[str, str] | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if package:
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "__init__.py").write_text("raise RuntimeError('never import me')\n")
        for rel, text in (files or {}).items():
            (site / package / rel).write_text(text)




def _run_helper(site: Path, python: str = sys.executable) -> ProbeOutput:
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    proc = subprocess.run([python, "-S", "-c", remote_source()], capture_output=True, text=True, env=env, timeout=60)
    return ProbeOutput(proc.stdout, proc.stderr, proc.returncode)


@pytest.mark.parametrize("version", [None, "3.8"], ids=["this-python", "python3.8"])  # hosts may be 3.8
def test_helper_reads_versions_paths_and_torch_cuda_without_importing(tmp_path: Path, version: str | None) -> None:
    from labtools import require_python

    python = require_python(version) if version else sys.executable
    site = tmp_path / "site"
    _dist(site, "sglang", "0.5.8", "sglang")
    _dist(site, "flashinfer-python", "0.6.1", "flashinfer")
    _dist(site, "sgl-kernel", "0.3.21", "sgl_kernel")
    _dist(site, "torch", "2.9.1+cu128", "torch", {
        "version.py": "from typing import Optional\n__version__ = '2.9.1+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n",
    })
    _dist(site, "nvidia-nccl-cu12", "2.27.5", None)
    out = _run_helper(site, python)
    assert out.exit_status == 0, out.stderr
    facts = parse_python_packages(out)
    assert facts.known
    assert facts.python_executable == python or Path(facts.python_executable).resolve() == Path(python).resolve()
    sglang = facts.packages["sglang"]
    assert (sglang.version, sglang.source) == ("0.5.8", "metadata")
    assert sglang.path == str(site / "sglang")
    assert facts.packages["flashinfer-python"].version == "0.6.1"
    assert facts.packages["sgl-kernel"].path == str(site / "sgl_kernel")
    torch = facts.packages["torch"]
    assert (torch.version, torch.cuda) == ("2.9.1+cu128", "12.8")
    assert (facts.nccl.version, facts.nccl.source) == ("2.27.5", "nvidia-nccl-cu12")


def test_cu13_nccl_wins_and_old_style_torch_version_file(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # as pip installs it from the CUDA index: metadata "2.11.0", torch.__version__ "2.11.0+cu130"
    _dist(site, "torch", "2.11.0", "torch", {"version.py": "__version__ = '2.11.0+cu130'\ncuda = '13.0'\n"})
    _dist(site, "nvidia-nccl-cu13", "2.28.9", None)
    _dist(site, "nvidia-nccl-cu12", "2.27.5", None)
    facts = parse_python_packages(_run_helper(site))
    assert facts.packages["torch"].cuda == "13.0"
    assert facts.packages["torch"].version == "2.11.0"  # what pip shows
    assert facts.packages["torch"].version_full == "2.11.0+cu130"  # torch.__version__
    assert facts.nccl.version == "2.28.9" and facts.nccl.source == "nvidia-nccl-cu13"
    assert facts.packages["sglang"] is None


def test_a_source_tree_without_metadata_is_read_from_version_py(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("import torch  # would fail here\n")
    (site / "sglang" / "version.py").write_text('__version__ = "0.5.23"\n')
    facts = parse_python_packages(_run_helper(site))
    assert (facts.packages["sglang"].version, facts.packages["sglang"].source) == ("0.5.23", "version.py")


def test_cpu_torch_has_no_cuda(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _dist(site, "torch", "2.9.1+cpu", "torch", {"version.py": "cuda: Optional[str] = None\n"})
    assert parse_python_packages(_run_helper(site)).packages["torch"].cuda is None


def test_no_python_is_unknown_with_reason() -> None:
    probe = python_packages_probe()
    proc = subprocess.run(["/bin/sh", "-c", "GPUOPS_PY=; GPUOPS_PY_REASON='no python >= 3.8 found'\n" + probe.script],
                          capture_output=True, text=True, timeout=30)
    facts = probe.parse(ProbeOutput(proc.stdout, proc.stderr, proc.returncode))
    assert facts.known is False
    assert facts.reason == "no python on this host (no python >= 3.8 found)"


def test_broken_helper_output_is_unknown() -> None:
    assert parse_python_packages(ProbeOutput("not json", "", 0)).known is False
    crashed = parse_python_packages(ProbeOutput("", "Traceback...\nSyntaxError: invalid syntax\n", 1))
    assert crashed.known is False and "SyntaxError" in crashed.reason


def test_host_system_parses_os_release_quotes() -> None:
    out = ProbeOutput(
        'kernel=6.8.0-57-generic\nmachine=x86_64\nos="Ubuntu 24.04.3 LTS"\npython3=/usr/bin/python3\n'
        "python3_version=3.12.3\nchosen_python=/opt/venv/bin/python\nchosen_python_reason=host var sglang_python\n",
        "", 0,
    )
    system = parse_host_system(out)
    assert system.os == "Ubuntu 24.04.3 LTS"
    assert (system.kernel, system.python3_version, system.chosen_python) == ("6.8.0-57-generic", "3.12.3", "/opt/venv/bin/python")


def test_helper_is_stdlib_only_and_py38_syntax() -> None:
    source = remote_source()
    import ast

    ast.parse(source, "software_remote.py", feature_version=(3, 8))
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"fcntl", "glob", "json", "os", "platform", "re", "stat", "struct", "sys", "importlib"}
    # With nothing installed, it still prints one JSON document naming every package it looks for.
    out = _run_helper_empty()
    doc = json.loads(out.stdout)
    assert set(doc) == {"python", "packages", "nccl"}
    assert doc["packages"] and all(value is None for value in doc["packages"].values())
    assert doc["python"]["executable"] == sys.executable and doc["nccl"] is None


def _run_helper_empty() -> ProbeOutput:
    env = dict(os.environ, PYTHONPATH=os.devnull, PYTHONNOUSERSITE="1")
    proc = subprocess.run([sys.executable, "-S", "-c", remote_source()], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return ProbeOutput(proc.stdout, proc.stderr, proc.returncode)
