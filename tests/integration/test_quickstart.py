"""README's Quickstart, end to end: `./demo` on one fresh lab host shaped like the field report's
machine, on the field box's release (SGLang 0.5.8), following what `gpuops advise` prints there: the
fusion refused, `apply sglang-release -e sglang_version=0.5.23` as a transaction (from the lab's
wheelhouse, no extra variable), `apply pcie-allreduce`, bench before and after, rollback to 0.5.8."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _steps(out: str) -> dict[str, str]:
    """Each `==> step` title (its first words, up to a colon) and what it printed."""
    found: dict[str, str] = {}
    for chunk in ANSI.sub("", out).split("\n==> ")[1:]:
        title, _, body = chunk.partition("\n")
        found[title] = body
    return found


def _step(steps: dict[str, str], start: str) -> str:
    (body,) = [b for t, b in steps.items() if t.startswith(start)]
    return body


@pytest.mark.timeout(900)  # a lab host, a real venv + pip install of the release's wheelhouse, on a shared machine
def test_demo_follows_advise_on_the_field_box(tmp_path: Path) -> None:
    env = dict(os.environ, GPUOPS_DEMO_DIR=str(tmp_path / "lab"), GPUOPS_SKIP_TORCH="1")
    proc = subprocess.run([str(REPO / "demo")], cwd=REPO, env=env, capture_output=True, text=True, timeout=880)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    steps = _steps(out)
    # The host is what the field report describes, and gpuops says so, on one screen: a line a feature
    # (status, the reason that decides it, the next command), every line within 120 characters.
    first = _step(steps, "gpuops inspect host: facts")
    assert re.search(r"NVIDIA RTX PRO 6000 Blackwell Server Edition\s+12\.0\s+sm120", first)
    assert "no NVLink" in first
    lines = first.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert len(lines) <= 45, len(lines)
    fusion = [line for line in lines if " flashinfer_allreduce_fusion: " in line]
    assert fusion == ["BLOCKED  flashinfer_allreduce_fusion: needs FlashInfer 0.6.17+  "
                      "-> gpuops apply sglang-release -e sglang_version=0.5.23"], fusion
    assert "BLOCKED  pcie_ipc_allreduce: needs SGLang 0.5.21+ (has 0.5.8)  -> gpuops apply sglang-release " \
           "-e sglang_version=0.5.23" in first
    # The field box's release (0.5.8, its real FlashInfer 0.6.1): fusion-sm120 is refused before
    # anything changes, naming the first FlashInfer that can.
    refused = _step(steps, "gpuops apply fusion-sm120")
    assert "FAILED" in refused and "FlashInfer 0.6.17 is the first that builds it for major 12" in refused
    assert re.search(r"h01 : ok=0 changed=0 failed=1", refused)
    # advise shows the way: the release with the PCIe IPC all-reduce first, the fusion needing a newer FlashInfer.
    advice_old = _step(steps, "gpuops advise: the ways to cut")
    assert "1. SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): after an upgrade" in advice_old
    first_command = re.search(r"^   \$ (.*)$", advice_old, re.M)
    assert first_command and first_command.group(1) == "gpuops apply sglang-release -e sglang_version=0.5.23"
    assert "evidence (published): 5.3 us vs NCCL's 205.1 us" in advice_old
    assert "2. FlashInfer all-reduce + RMSNorm fusion (fusion-sm120): after an upgrade" in advice_old
    # ... and the demo runs that command as printed: a new environment from the lab's wheelhouse, one transaction.
    release = _step(steps, "gpuops apply sglang-release -e sglang_version=0.5.23")
    assert re.search(r"h01: ok \(finished, run \S+\)", release), release
    assert re.search(r"environment \S+/envs/sglang-0\.5\.23-\w+ built with venv \+ pip", release), release
    assert "ran handler: restart sglang" in release and "server healthy" in release
    assert re.search(r"h01 : ok=\d+ changed=3 failed=0", release)
    # On 0.5.23 (FlashInfer 0.7.2): pcie-allreduce first, applied, in effect by the server's own log line.
    current = _step(steps, "gpuops advise: on SGLang 0.5.23")
    assert "1. SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): apply now" in current
    assert "+SGLANG_ENABLE_PCIE_IPC_ALLREDUCE='1'" in _step(steps, "gpuops apply pcie-allreduce --check")
    applied = _step(steps, "gpuops apply pcie-allreduce: switch it on")
    assert 'in effect: the server logged "FlashInfer PCIe-IPC all-reduce enabled (world=8' in applied
    # Benchmarks before (0.5.8, NCCL) and after (0.5.23, PCIe IPC), compared.
    rates = [float(x) for x in re.findall(r"h01: ([\d.]+) output tok/s", out)]
    assert len(rates) == 2 and all(r > 0 for r in rates) and rates[1] > rates[0]
    compared = out.split("differs from")[1]
    assert "env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: (unset) -> '1'" in compared
    assert "sglang version: '0.5.8' -> '0.5.23'" in compared, compared[:3000]
    # Every figure from the stand-in says so: the summaries and the compare table mark every figure
    # and verdict, and the report's plots carry the stamp.
    assert len(re.findall(r"output tok/s, .*\(SIMULATED: stand-in model rtx-pro-6000-pcie-x8 v\d+\)", out)) == 2
    table = _step(steps, "gpuops results compare").split("differs from")[0]
    rate_row = next(line for line in table.splitlines() if line.startswith("output tokens/s"))
    assert re.search(r"[\d.]+ \(sim\)\s+[\d.]+ \(sim\) \+[\d.]+% better \(sim\)", rate_row), rate_row
    assert not re.search(r"(better|worse)(?! \(sim\))", table)
    report = (tmp_path / "lab-results" / "report.html").read_text()
    assert len(report) > 10_000 and "SIMULATED." in report and "(sim)" in report
    # The second apply changed nothing; advise then has the PCIe IPC all-reduce in effect.
    assert re.search(r"h01 : ok=\d+ changed=0 failed=0", _step(steps, "gpuops apply pcie-allreduce again"))
    assert "SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm): in effect" in _step(steps, "gpuops advise: the PCIe IPC")
    # Two rollbacks, newest first: the switch-on, then the release; the host serves 0.5.8 again.
    undone = _step(steps, "gpuops history, then gpuops rollback twice")
    assert re.findall(r"undid run \S+: previous server configuration restarted and healthy", undone) and \
        len(re.findall(r"h01 : ok=0 changed=\d+ failed=0", undone)) == 2, undone
    last = _step(steps, "gpuops inspect host: SGLang 0.5.8 again")
    assert "sglang 0.5.8, flashinfer 0.6.1" in last and "pcie_ipc_allreduce: needs SGLang 0.5.21+" in last
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in last
    assert out.rstrip().endswith("demo: done")
    assert not (tmp_path / "lab").exists()  # lab down removed it
