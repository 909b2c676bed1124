"""inspect's one line a feature (gates/report.py): status, the one reason that decides it, the next
command; on the field box's verdicts (recorded from the Quickstart's lab host: real SGLang 0.5.8 and
FlashInfer 0.6.1 source) and the real SGLang 0.5.16 on an H200."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gpuops.advise import advise_host
from gpuops.gates.evaluate import GateReport
from gpuops.gates.report import deciding_reason, feature_line, render_gate_summary
from gpuops.output import brief, make_console

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIELD = json.loads((FIXTURES / "recorded" / "inspect" / "field-box-0.5.8.json").read_text())
H200 = json.loads((FIXTURES / "real" / "h200-x1" / "sglang-0.5.16" / "gpuops" / "inspect.json").read_text())
UPGRADE = "gpuops apply sglang-release -e sglang_version=0.5.23"


def _field_report() -> GateReport:
    return GateReport(FIELD["gates"], FIELD["features"], version=FIELD["version"], gpu=FIELD["gpu"])


def _rendered(next_commands: dict[str, str], detail: bool) -> list[str]:
    out = io.StringIO()
    render_gate_summary(_field_report(), make_console(out, force_terminal=False), next_commands, detail=detail)
    return out.getvalue().splitlines()


def _field_next() -> dict[str, str]:
    # What advise's ways print first on the field box (its facts are not in the trimmed recording;
    # tests/integration/test_quickstart.py reads these lines off the lab host itself).
    return {"flashinfer_allreduce_fusion": UPGRADE, "pcie_ipc_allreduce": UPGRADE}


def test_field_box_a_line_a_feature_with_the_reason_that_decides_it() -> None:
    lines = _rendered(_field_next(), detail=False)
    assert len(lines) == len(FIELD["features"]) + 1  # and the count line
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    by_name = {line.split()[1].rstrip(":"): line for line in lines[:-1]}
    # The fusion: both SGLang's gate and FlashInfer close it; the library decides (patching the gate
    # alone would not run), and the upgrade is the next command, whole.
    assert by_name["flashinfer_allreduce_fusion"] == f"BLOCKED  flashinfer_allreduce_fusion: needs FlashInfer 0.6.17+  -> {UPGRADE}"
    assert by_name["pcie_ipc_allreduce"] == f"BLOCKED  pcie_ipc_allreduce: needs SGLang 0.5.21+ (has 0.5.8)  -> {UPGRADE}"
    # A gate alone: what it admits, where (the file's name and line; the path is behind -v).
    assert by_name["fa3"] == "BLOCKED  fa3: SGLang's gate admits sm80, sm86, sm87, sm89, sm90 only (attention_registry.py:131)"
    # What the host's shape does not fit, before anything else.
    assert by_name["custom_allreduce"].startswith("BLOCKED  custom_allreduce: TP 8 over PCIe only: SGLang turns it off")
    # Blocked first, then unknown, then open.
    statuses = [line.split()[0] for line in lines[:-1]]
    assert statuses == sorted(statuses, key=["BLOCKED", "UNKNOWN", "OPEN"].index)
    assert lines[-1].endswith("; -v for detail") and "127" not in lines[-1]  # trimmed: only these gates


def test_detail_keeps_every_word_and_where_each_gate_is() -> None:
    lines = _rendered(_field_next(), detail=True)
    fusion = FIELD["features"]["flashinfer_allreduce_fusion"]
    assert f"BLOCKED  flashinfer_allreduce_fusion: {fusion['reason']}" in lines
    assert any(line.strip().startswith("runtime: srt/layers/communicator.py:93 in apply_flashinfer_allreduce_fusion")
               for line in lines)
    assert f"         next: {UPGRADE}" in lines and "         flag: --enable-flashinfer-allreduce-fusion" in lines


def test_real_h200_lines() -> None:
    name, host = next(iter(H200["hosts"].items()))
    commands = advise_host(name, host).next_commands()
    lines = {n: feature_line(n, f, {}, commands.get(n)) for n, f in host["features"].items()}
    assert all(len(line) <= 120 for line in lines.values()), lines
    assert lines["pcie_ipc_allreduce"] == "BLOCKED  pcie_ipc_allreduce: needs SGLang 0.5.21+ (has 0.5.16)"
    assert lines["deepgemm"].startswith("OPEN     deepgemm: in effect: ")
    assert lines["flashinfer_allreduce_fusion"].startswith("OPEN     flashinfer_allreduce_fusion: the runtime checks "
                                                           "admit sm90; not in effect")


def test_the_command_is_never_shortened_the_reason_is() -> None:
    fusion = dict(FIELD["features"]["flashinfer_allreduce_fusion"], kernels=[])  # the gate's long reason
    command = "gpuops apply fusion-sm120 -e fusion_allow=true"
    line = feature_line("flashinfer_allreduce_fusion", fusion, {}, command)
    assert line.endswith(f"  -> {command}") and len(line) == 120, line
    longer = feature_line("flashinfer_allreduce_fusion", fusion, {}, command + " -e another_variable=its_long_value")
    assert longer.endswith(command + " -e another_variable=its_long_value") and ": blocked on sm120...  -> " in longer, longer
    assert deciding_reason(fusion, {}).startswith("blocked on sm120 at srt/layers/communicator.py:93")


def test_brief_drops_asides_then_cuts() -> None:
    assert brief("short (aside)", 20) == "short (aside)"
    assert brief("P2P fails between 16 pairs (GPU0-GPU4 (CNS), ...): falls back to NCCL", 50) == \
        "P2P fails between 16 pairs: falls back to NCCL"
    assert brief("x" * 200, 120) == "x" * 117 + "..."
