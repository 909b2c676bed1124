"""README's Quickstart, end to end: `./demo` on a fresh lab host shaped like the field report's machine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # two lab hosts, two releases unpacked with their FlashInfer, on a shared machine
def test_demo_walks_the_whole_job(tmp_path: Path) -> None:
    env = dict(os.environ, GPUOPS_DEMO_DIR=str(tmp_path / "lab"), GPUOPS_SKIP_TORCH="1")
    proc = subprocess.run([str(REPO / "demo")], cwd=REPO, env=env, capture_output=True, text=True, timeout=880)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    # The host is what the field report describes, and gpuops says so.
    assert re.search(r"NVIDIA RTX PRO 6000 Blackwell Server Edition\s+12\.0\s+sm120", out)
    assert "no NVLink" in out
    # The field box's release (0.5.8, its real FlashInfer 0.6.1): the fusion is blocked by the gate AND the
    # kernel library, and fusion-sm120 is refused before anything changes, naming the first FlashInfer that can.
    field, _, current = out.partition("lab up: the same machine on a current release")
    inspect_part, _, refusal = field.partition("apply fusion-sm120: refused before anything changes")
    assert re.search(r"BLOCKED\s+flashinfer_allreduce_fusion: .*srt/layers/communicator\.py:\d+.*FlashInfer 0\.6\.1 "
                     r"cannot build", inspect_part)
    refused, _, advice_old = refusal.partition("gpuops advise: the ways to cut")
    assert "FAILED" in refused and "FlashInfer 0.6.17 is the first that builds it for major 12" in refused
    assert re.search(r"h01 : ok=0 changed=0 failed=1", refused)
    # advise shows the way: the release with the PCIe IPC all-reduce first, the fusion needing a newer FlashInfer.
    assert "1. SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): after an upgrade" in advice_old
    assert "$ gpuops apply sglang-release -e sglang_version=0.5.23" in advice_old
    assert "evidence (published): 5.3 us vs NCCL's 205.1 us" in advice_old
    assert "2. FlashInfer all-reduce + RMSNorm fusion (fusion-sm120): after an upgrade" in advice_old
    assert "fusion-sm120 needs a newer FlashInfer" in advice_old
    # On 0.5.23 (FlashInfer 0.7.2): pcie-allreduce first, applied, in effect by the server's own log line.
    assert "1. SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): apply now" in current
    assert "+SGLANG_ENABLE_PCIE_IPC_ALLREDUCE='1'" in current
    assert 'in effect: the server logged "FlashInfer PCIe-IPC all-reduce enabled (world=8' in current
    # Benchmarks before and after, compared: tokens/s figures and the configuration difference.
    rates = [float(x) for x in re.findall(r"h01: ([\d.]+) output tok/s", out)]
    assert len(rates) == 2 and all(r > 0 for r in rates) and rates[1] > rates[0]
    assert "env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: (unset) -> '1'" in out.split("differs from")[1]
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
    idempotent, _, last_advice = out.split("idempotent")[-1].partition("the PCIe IPC all-reduce in effect")
    assert re.search(r"h01 : ok=\d+ changed=0 failed=0", idempotent)
    assert "SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): in effect" in last_advice
    assert not (tmp_path / "lab").exists() and not (tmp_path / "lab-current").exists()  # lab down removed both
