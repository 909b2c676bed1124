"""gpuops profile on the lab's field box (8x RTX PRO 6000, PCIe, TP 8, Kimi-K2.5's 61 layers) over
real sshd with real SGLang releases: the stand-in's profiler writes a SIMULATED trace from its speed
model, gpuops reads it on the host and says, as the field report did, "verify pass 30.4 ms: 122
all-reduce calls per verify pass, 25.0 ms (82%)" (it serves with EAGLE-3); advise computes
its saving from that profile (measured, with its id) instead of the published figures; after
`apply pcie-allreduce` a second profile shows the all-reduce share fall; the host keeps serving
and no profile directory is left there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuops.lab.hosts import LabSpec

pytestmark = pytest.mark.integration

QUICK = ("-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5")


@pytest.fixture(scope="module")
def lab(lab_factory):
    return lab_factory(LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("field058",)),
                       LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.23", names=("field0523",)))


def _profile(run_gpuops, lab, host: str, results: Path) -> dict[str, Any]:
    done = run_gpuops("profile", "--remote", "-i", str(lab.inventory_path), "-l", host, "--steps", "3", "--json",
                      "--results-dir", str(results), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["hosts"][host]


def _profile_dirs_left() -> list[str]:
    import tempfile

    return sorted(p.name for p in Path(tempfile.gettempdir()).glob("gpuops-profile-*"))


def test_the_field_box_at_0_5_8_spends_its_decode_pass_in_122_all_reduces(lab, run_gpuops, tmp_path) -> None:
    before = _profile_dirs_left()
    host = _profile(run_gpuops, lab, "field058", tmp_path / "results")
    assert host["ok"] and host["simulated"]
    # the field box serves with EAGLE-3: its passes are target-verify ones, ~30 ms with ~25 in all-reduces
    assert host["sentence"].startswith("verify pass 30.")
    assert "122 all-reduce calls per verify pass, 25.0 ms (82%), NCCL RING_LL" in host["sentence"]
    assert "SIMULATED" in host["sentence"]
    head = host["summary"]["headline"]
    assert head["stage"] == "TARGET_VERIFY" and set(host["summary"]["stages"]) == {"TARGET_VERIFY", "DRAFT_EXTEND_V2"}
    assert len(host["summary"]["traces"]) == 16  # 8 ranks, EXTEND and DECODE
    assert _profile_dirs_left() == before  # the lab's hosts share this machine's /tmp


def test_advise_computes_from_the_profile_and_the_share_falls_after_pcie_allreduce(lab, run_gpuops, tmp_path) -> None:
    results = tmp_path / "results"
    first = _profile(run_gpuops, lab, "field0523", results)
    advised = run_gpuops("advise", "-i", str(lab.inventory_path), "-l", "field0523", "--results-dir", str(results),
                         "--json", timeout=300)
    assert advised.returncode == 0, advised.stdout + advised.stderr
    advice = json.loads(advised.stdout)["hosts"]["field0523"]
    assert advice["allreduces_per_pass"] == 122 and advice["allreduces_from"].startswith("measured: 122 all-reduce")
    pcie = advice["ranked"][0]
    assert pcie["feature"] == "pcie_ipc_allreduce" and pcie["evidence"]["basis"] == "measured"
    assert pcie["evidence"]["profile_id"] == first["result_id"] and not pcie["evidence"]["fallback"]
    measured_ms = first["summary"]["headline"]["allreduce_ms_per_forward"]
    assert pcie["evidence"]["saving_ms_per_pass"] == pytest.approx(measured_ms - 122 * 5.3 / 1000, abs=0.01)
    applied = run_gpuops("apply", "pcie-allreduce", "-i", str(lab.inventory_path), "-l", "field0523", *QUICK,
                         "-e", "pcie_allow_without_p2p=true", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    try:
        second = _profile(run_gpuops, lab, "field0523", results)
        before, after = first["summary"]["headline"], second["summary"]["headline"]
        assert after["allreduce_kind"] == "PCIe IPC all-reduce (FlashInfer)" and before["allreduce_kind"] == "NCCL RING_LL"
        assert after["allreduce_share"] < before["allreduce_share"] / 2 and after["wall_ms"] < before["wall_ms"]
        compared = run_gpuops("results", "compare", first["result_id"], second["result_id"], "--results-dir",
                              str(results), timeout=120)
        assert compared.returncode == 0 and "verify all-reduce share" in compared.stdout, compared.stderr
    finally:
        undo = run_gpuops("rollback", "-i", str(lab.inventory_path), "-l", "field0523", timeout=300)
        assert undo.returncode == 0, undo.stdout + undo.stderr
