"""The fusion patch planner on real SGLang releases: plan, apply the after-texts to a copy of the
release, scan the copy again (as a host would) and judge it for SM120."""

from __future__ import annotations

import os
import py_compile
import shutil
from pathlib import Path

import pytest
from labtools import release_scan

from gpuops.errors import GpuopsError
from gpuops.gates.evaluate import judge
from gpuops.gates.local import scan_site
from gpuops.gates.patch import GatePatchPlan, UnrecognisedLayout, plan_gate_patch
from gpuops.gates.scan import GateScan
from gpuops.lab.sglang_cache import sglang_site

pytestmark = pytest.mark.integration

FUSION = "flashinfer_allreduce_fusion"
_SCANS: dict[str, GateScan] = {}

LAUNCH = {
    "0.5.8": ("--enable-flashinfer-allreduce-fusion",),
    "0.5.14": ("--flashinfer-allreduce-fusion-backend", "trtllm"),
    "0.5.23": ("--flashinfer-allreduce-fusion-backend", "trtllm"),
}


def scan_of(version: str) -> GateScan:
    if version not in _SCANS:
        scan = release_scan(version, with_sources=True)
        assert scan.known, scan.reason
        _SCANS[version] = scan
    return _SCANS[version]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # unchanged files are shared with the cache, never written
    except OSError:
        shutil.copy2(src, dst)


def patched_copy(version: str, plan: GatePatchPlan, tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(sglang_site(version), site, copy_function=_link_or_copy)
    for change in plan.changes:
        path = site / "sglang" / change.path
        assert path.read_text() == change.before
        path.unlink()  # break the link before writing: the cached release must stay pristine
        path.write_text(change.after)
    return site


@pytest.mark.parametrize("version", sorted(LAUNCH))
def test_patch_opens_fusion_on_sm120_and_nothing_else(version, tmp_path):
    scan = scan_of(version)
    plan = plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")
    assert plan.changed
    assert plan.launch_args == LAUNCH[version]
    assert plan.predicate == "is_sm120_supported"
    assert {w.role for w in plan.widened} == {"runtime", "auto_enable"}
    assert all("sm120" in w.after for w in plan.widened)

    site = patched_copy(version, plan, tmp_path)
    for change in plan.changes:
        py_compile.compile(str(site / "sglang" / change.path), doraise=True,
                           cfile=str(tmp_path / "compiled.pyc"))
    rescanned = scan_site(site, with_sources=True)
    assert rescanned.known and rescanned.version == version

    on_120 = judge(rescanned, "12.0", "12.8")
    fusion = on_120.features[FUSION]
    assert fusion["status"] == "open", fusion["reason"]
    deciding = [g for g in on_120.gates if g["feature"] == FUSION and g["role"] in ("runtime", "auto_enable")]
    assert deciding and all(g["status"] == "open" and "sm120" in g["admits"] for g in deciding)
    hardware = [g for g in on_120.gates if g["feature"] == FUSION and g["role"] == "hardware"]
    assert all(g["status"] == "blocked" for g in hardware)
    assert len(plan.left_closed) == len(hardware)
    if version != "0.5.8":
        assert {g["function"] for g in hardware} == {"_mnnvl_supported", "_resolve_backend"}
        assert any("left closed" in n and "_mnnvl_supported" in n for n in plan.notes)
    # Hopper and datacenter Blackwell are exactly as before.
    assert judge(rescanned, "9.0", "12.8").features[FUSION]["status"] == "open"
    assert judge(rescanned, "10.0", "12.8").features[FUSION]["status"] == "open"
    # Idempotent: planning on the patched release changes nothing.
    again = plan_gate_patch(rescanned, rescanned.sources, "flashinfer_allreduce_fusion", "sm120")
    assert not again.changed and again.widened == ()
    assert set(again.already_open) >= {w.id for w in plan.widened}
    assert again.launch_args == plan.launch_args


def test_patch_mirrors_the_release_style_0_5_23():
    scan = scan_of("0.5.23")
    plan = plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")
    diff = plan.diff()
    assert "+_is_sm120_supported = _is_cuda and get_platform().is_sm120\n" in diff
    assert "-    if not (get_platform().is_sm90 or get_platform().is_sm100):\n" in diff
    assert "+    if not (get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120):\n" in diff
    assert "import" not in "".join(l for l in diff.splitlines(True) if l.startswith("+") and not l.startswith("+++"))


def test_patch_adds_the_import_only_where_needed_0_5_8():
    scan = scan_of("0.5.8")
    plan = plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")
    by_file = {c.path: c for c in plan.changes}
    communicator = by_file["srt/layers/communicator.py"]
    assert communicator.after.count("is_sm120_supported,\n") == 1  # added to the existing import
    assert "_is_sm120_supported = _is_cuda and is_sm120_supported()\n" in communicator.after
    server_args = by_file["srt/server_args.py"]
    added = [l for l in server_args.diff().splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert added == ["+            and (is_sm90_supported() or is_sm100_supported() or is_sm120_supported())"]


def test_release_without_an_sm120_predicate_is_refused():
    scan = scan_of("0.4.10")
    with pytest.raises(UnrecognisedLayout, match="defines no predicate for sm120"):
        plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")


def test_release_without_fusion_is_refused():
    scan = scan_of("0.4.0")
    with pytest.raises(UnrecognisedLayout, match="no runtime gate of FlashInfer allreduce"):
        plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")


def test_source_that_changed_since_the_scan_is_refused():
    scan = scan_of("0.5.8")
    sources = dict(scan.sources)
    sources["srt/layers/communicator.py"] = sources["srt/layers/communicator.py"].replace(
        "(_is_sm90_supported or _is_sm100_supported)", "(_is_sm90_supported  or  _is_sm100_supported)")
    with pytest.raises(UnrecognisedLayout, match="differs from the scan"):
        plan_gate_patch(scan, sources, "flashinfer_allreduce_fusion", "sm120")


def test_missing_source_is_refused():
    scan = scan_of("0.5.14")
    sources = {k: v for k, v in scan.sources.items() if k != "srt/layers/flashinfer_comm_fusion.py"}
    with pytest.raises(UnrecognisedLayout, match="flashinfer_comm_fusion.py was not provided"):
        plan_gate_patch(scan, sources, "flashinfer_allreduce_fusion", "sm120")


def test_bad_target_is_a_user_error():
    scan = scan_of("0.5.14")
    with pytest.raises(GpuopsError, match="not a GPU generation"):
        plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "rtx-pro")
