"""README's Quickstart, end to end: `./demo` on a fresh lab host shaped like the field report's machine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_demo_walks_the_whole_job(tmp_path: Path) -> None:
    env = dict(os.environ, GPUOPS_DEMO_DIR=str(tmp_path / "lab"), GPUOPS_SKIP_TORCH="1")
    proc = subprocess.run([str(REPO / "demo")], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    # The host is what the field report describes, and gpuops says so.
    assert re.search(r"NVIDIA RTX PRO 6000 Blackwell Server Edition\s+12\.0\s+sm120", out)
    assert "no NVLink" in out
    # The fusion gate: blocked with file:line before, open after, with the release's flag on.
    before, _, after = out.partition("apply fusion-sm120: patch the gates")
    assert re.search(r"BLOCKED\s+flashinfer_allreduce_fusion: .*srt/layers/communicator\.py:\d+", before)
    assert re.search(r"OPEN\s+flashinfer_allreduce_fusion", after)
    assert "enable_flashinfer_allreduce_fusion=True" in after
    # Check mode showed a diff that widens the gate with the release's own predicate.
    assert "+    is_sm120_supported," in before
    # Benchmarks before and after, compared: tokens/s figures and the configuration difference.
    rates = [float(x) for x in re.findall(r"h01: ([\d.]+) output tok/s", out)]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert "enable_flashinfer_allreduce_fusion: False -> True" in out
    # Every figure from the stand-in says so: the lab names the model, the summaries and the compare
    # table mark every figure and verdict, and the report's plots carry the stamp.
    assert re.search(r"h01 .* rtx-pro-6000-pcie-x8 v\d+ \(calibrated\)", out)
    assert len(re.findall(r"output tok/s, .*\(SIMULATED: stand-in model rtx-pro-6000-pcie-x8 v\d+\)", out)) == 2
    table = out.split("results compare (before vs after)")[1].split("differs from")[0]
    rate_row = next(line for line in table.splitlines() if line.startswith("output tokens/s"))
    assert re.search(r"[\d.]+ \(sim\)\s+[\d.]+ \(sim\) \+[\d.]+% better \(sim\)", rate_row), rate_row
    assert not re.search(r"(better|worse)(?! \(sim\))", table)
    assert "(sim): simulated by the lab's stand-in server, model rtx-pro-6000-pcie-x8" in table
    # The report exists and the second apply changed nothing.
    report = (tmp_path / "lab-results" / "report.html").read_text()
    assert len(report) > 10_000 and "SIMULATED." in report and "(sim)" in report
    assert out.rstrip().endswith("demo: done")
    assert re.search(r"h01 : ok=\d+ changed=0 failed=0", out.split("idempotent")[-1])
    assert not (tmp_path / "lab").exists()  # lab down removed it
