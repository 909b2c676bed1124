"""The gate audit against real SGLang releases downloaded from PyPI (cached under ~/.cache/gpuops).

The scanner runs as a subprocess with python3 exactly as on a host: the probe's sh script with
$GPUOPS_PY, the release's unpacked wheel on PYTHONPATH (found through importlib, not a path option).
"""

from __future__ import annotations

import dataclasses

import pytest
from labtools import release_scan

from gpuops.gates.evaluate import judge
from gpuops.gates.local import scan_site
from gpuops.gates.scan import GateScan
from gpuops.lab.sglang_cache import sglang_site

pytestmark = pytest.mark.integration

FUSION = "flashinfer_allreduce_fusion"
SM120, SM90, SM100 = ("12.0", "12.8"), ("9.0", "12.8"), ("10.0", "12.8")
_SCANS: dict[str, GateScan] = {}


def scan_of(version: str) -> GateScan:
    """One scan per release per test session (a release is scanned the same way every time)."""
    if version not in _SCANS:
        scan = release_scan(version, with_sources=True)
        assert scan.known, scan.reason
        assert scan.version == version
        _SCANS[version] = scan
    return _SCANS[version]


# release -> (flag, where the SM120 block is: (file, function) of the runtime gates)
EXPECTED = {
    "0.5.8": ("--enable-flashinfer-allreduce-fusion",
              {("srt/layers/communicator.py", "apply_flashinfer_allreduce_fusion")}),
    "0.5.14": ("--flashinfer-allreduce-fusion-backend trtllm",
               {("srt/layers/communicator.py", "apply_flashinfer_allreduce_fusion"),
                ("srt/layers/flashinfer_comm_fusion.py", "_resolve_backend")}),
    "0.5.23": ("--flashinfer-allreduce-fusion-backend trtllm",
               {("srt/layers/flashinfer_comm_fusion.py", "_resolve_backend"),
                ("srt/layers/layer_boundary/residual/add_norm.py", "flashinfer_ar_fusion_applies")}),
}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_fusion_blocked_on_sm120_open_on_sm90_and_sm100(version):
    scan = scan_of(version)
    flag, blocked_at = EXPECTED[version]
    on_120 = judge(scan, *SM120)
    fusion = on_120.features[FUSION]
    assert fusion["status"] == "blocked", fusion["reason"]
    assert fusion["flag"] == flag
    blocked_runtime = {(g["file"], g["function"]) for g in on_120.gates
                       if g["feature"] == FUSION and g["role"] == "runtime" and g["status"] == "blocked"}
    assert blocked_runtime == blocked_at
    for file, _ in blocked_at:
        assert f"{file}:" in fusion["reason"]
    for facts in (SM90, SM100):
        other = judge(scan, *facts).features[FUSION]
        assert other["status"] == "open", (facts, other["reason"])
        assert other["flag"] == flag
    # `inspect host` scans without sources: the same flag.
    assert judge(dataclasses.replace(scan, sources={}), *SM120).features[FUSION]["flag"] == flag


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_auto_enable_gate_found_by_what_it_sets(version):
    scan = scan_of(version)
    report = judge(scan, *SM120)
    auto = [g for g in report.gates if g["feature"] == FUSION and g["role"] == "auto_enable"]
    assert len(auto) == 1
    # `admits` spans the architectures the release itself names: 0.5.23 tests `get_device_sm() == 107`.
    sm10x = ["sm100", "sm103", "sm107"] if version == "0.5.23" else ["sm100", "sm103"]
    assert auto[0]["admits"] == ["sm90"] + sm10x
    assert auto[0]["status"] == "blocked"
    assert any("model_arch in" in c["text"] for c in auto[0]["clauses"])


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_mnnvl_gates_are_hardware_and_never_decide_the_feature(version):
    report = judge(scan_of(version), *SM90)
    hardware = [g for g in report.gates if g["feature"] == FUSION and g["role"] == "hardware"]
    if version == "0.5.8":
        assert hardware == []  # no MNNVL backend in that release
        return
    assert {g["function"] for g in hardware} == {"_mnnvl_supported", "_resolve_backend"}
    assert report.features[FUSION]["status"] == "open"


def test_predicate_meanings_come_from_the_release():
    scan = scan_of("0.5.23")
    entries = {(p["file"], p["name"]): p for p in scan.predicates}
    sm120 = entries[("srt/utils/common.py", "is_sm120_supported")]
    assert sm120["majors"] == [12] and sm120["min_cuda"] == [12, 8]
    assert entries[("srt/utils/common.py", "is_blackwell_supported")]["majors"] == [10, 11, 12]
    assert scan.platform_attrs["is_sm100"] == "is_sm100_supported"


def test_is_blackwell_meant_sm10x_only_in_an_old_release():
    """0.5.7's auto-enable used is_blackwell_supported (SM10x and SM12x there), so it admits SM120
    while its runtime check does not: the feature is still blocked on SM120."""
    report = judge(scan_of("0.5.7"), *SM120)
    auto = [g for g in report.gates if g["feature"] == FUSION and g["role"] == "auto_enable"]
    assert [g["status"] for g in auto] == ["open"]
    assert "sm120" in auto[0]["admits"]
    assert report.features[FUSION]["status"] == "blocked"


@pytest.mark.parametrize("version", ["0.5.10", "0.5.19"])
def test_releases_the_tests_were_not_written_for(version):
    scan = scan_of(version)
    assert judge(scan, *SM120).features[FUSION]["status"] == "blocked"
    assert judge(scan, *SM90).features[FUSION]["status"] == "open"


def test_release_without_fusion_code_is_unknown():
    scan = scan_of("0.4.0")
    fusion = judge(scan, *SM90).features[FUSION]
    assert fusion["status"] == "unknown"
    assert "no FlashInfer" in fusion["reason"] and "0.4.0" in fusion["reason"]


def test_server_clauses_say_which_hold():
    """0.5.14's auto-enable on an H200 serving Kimi-K2.5 with TP 1: the GPU admits it, tp_size does not."""
    scan = scan_of("0.5.14")
    server = {"args": {"tp_size": 1, "nnodes": 1, "enable_dp_attention": False, "moe_a2a_backend": "none",
                       "flashinfer_allreduce_fusion_backend": None},
              "architecture": "KimiK25ForConditionalGeneration"}
    report = judge(scan, *SM90, server=server)
    auto = next(g for g in report.gates if g["feature"] == FUSION and g["role"] == "auto_enable")
    holds = {c["text"]: c["holds"] for c in auto["clauses"]}
    assert holds["self.tp_size > 1"] is False
    assert holds["self.flashinfer_allreduce_fusion_backend is None"] is True
    assert holds['self.moe_a2a_backend == "none"'] is True
    assert [v for k, v in holds.items() if k.startswith("model_arch in")] == [True]
    reason = report.features[FUSION]["reason"]
    # TP 1 decides first (an all-reduce path of one GPU), and what the launch said is kept beside it.
    assert "not in effect in the running server: TP 1" in reason, reason
    assert "launched with flashinfer_allreduce_fusion_backend=None (off)" in reason, reason


def test_sources_are_returned_for_the_fusion_files_only():
    scan = scan_of("0.5.23")
    assert set(scan.sources) == {
        "srt/arg_groups/overrides.py",
        "srt/layers/flashinfer_comm_fusion.py",
        "srt/layers/layer_boundary/residual/add_norm.py",
    }
    assert "def _resolve_backend" in scan.sources["srt/layers/flashinfer_comm_fusion.py"]


# 0.5.23 with 16 workers: dsa_backend.py (the call site proving ``device_sm_major`` is the SM major)
# and flash_mla_sm120.py (the gate) land in different workers; the worker once read the call site
# bare and lost the three gates of _validate_flashinfer_sparse_mla_backend (736 gates, not 739).
@pytest.mark.parametrize("version, jobs", [("0.5.14", 3), ("0.5.23", 16)])
def test_forked_workers_give_exactly_the_serial_result(version, jobs):
    # Both scans are kept across runs (labtools.release_scan): any change of the scanner scans both again.
    serial = release_scan(version, jobs=1)
    forked = release_scan(version, jobs=jobs)
    assert forked.known and serial.known
    if version == "0.5.23":
        lost = [g for g in serial.gates if g["file"] == "kernels/ops/attention/flash_mla_sm120.py"
                and g["function"] == "_validate_flashinfer_sparse_mla_backend"]
        assert len(lost) == 3
    assert forked.gates == serial.gates
    assert forked.predicates == serial.predicates
    assert forked.platform_attrs == serial.platform_attrs
    assert forked.files_parsed == serial.files_parsed and forked.errors == serial.errors


def test_a_fusion_file_that_does_not_parse_is_unknown_never_open(tmp_path):
    """0.5.8 with its communicator.py (the runtime gate) broken: the auto-enable gate alone would
    read "open" on an H200; the audit must say it cannot tell."""
    import os
    import shutil

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    site = tmp_path / "site"
    shutil.copytree(sglang_site("0.5.8"), site, copy_function=link_or_copy)
    broken = site / "sglang" / "srt" / "layers" / "communicator.py"
    text = broken.read_text()
    broken.unlink()  # never write through a link into the cache
    broken.write_text(text.replace("def apply_flashinfer_allreduce_fusion(batch_size: int):",
                                   "def apply_flashinfer_allreduce_fusion(batch_size: int:"))
    scan = scan_site(site)
    assert [e["file"] for e in scan.errors] == ["srt/layers/communicator.py"]
    fusion = judge(scan, *SM90).features[FUSION]
    assert fusion["status"] == "unknown"
    assert "srt/layers/communicator.py" in fusion["reason"] and "does not parse" in fusion["reason"]
