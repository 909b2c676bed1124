"""fusion-sm120's applicability, planned from real scans of real releases (pure planning: the
facts a gather would bring, no host): every case where the role has nothing to do is ok,
changed=0 with the reason; the P2P refusal and its override."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from labtools import release_scan

from gpuops.errors import GpuopsError
from gpuops.gates.local import scan_site
from gpuops.lab.sglang_cache import sglang_site
from gpuops.plan.model import FileState, PlanFacts
from gpuops.plan.planner import discover, plan_role

pytestmark = pytest.mark.integration

INVENTORY = {"sglang_manager": "process", "gpuops_state_dir": "/srv/gpuops",
             "sglang_args": ["--model-path", "/models/m", "--tp", "8"]}
P2P_OK = {"p2p_all_pairs": True, "p2p_failed_pairs": [], "gpu_count": 8}
CNS = {"p2p_all_pairs": False, "gpu_count": 8,
       "p2p_failed_pairs": [[f"GPU{a}", f"GPU{b}", "CNS"] for a in range(4) for b in range(4, 8)]}
_SCANS: dict = {}


def scan_of(version: str, site: Path | None = None):
    key = str(site or version)
    if key not in _SCANS:
        _SCANS[key] = scan_site(site, with_sources=True) if site else release_scan(version, with_sources=True)
    return _SCANS[key]


def plan(scan, cc: str, p2p: dict, extra: dict | None = None):
    paths = discover("fusion-sm120", "h01", INVENTORY, extra or {}).paths
    facts = PlanFacts(host="h01", files={p: FileState(path=p, exists=False) for p in paths}, gate_scan=scan,
                      gpu={"compute_capability": cc, "cuda": "12.8", **p2p})
    return plan_role("fusion-sm120", facts, INVENTORY, extra or {})


@pytest.mark.parametrize("version, cc, says", [
    ("0.5.8", "9.0", "already runs FlashInfer allreduce"),   # H100/H200: SGLang runs it there
    ("0.5.23", "10.0", "already runs FlashInfer allreduce"),  # B200
    ("0.5.8", "8.0", "only opens FlashInfer allreduce + residual + RMSNorm fusion for sm120"),  # A100: not the target
    ("0.4.0", "12.0", "has no FlashInfer allreduce + residual + RMSNorm fusion code"),  # nothing to open
])
def test_nothing_to_do_is_ok_with_the_reason(version: str, cc: str, says: str) -> None:
    result = plan(scan_of(version), cc, P2P_OK)
    assert result.changed == 0 and not result.handlers
    assert any(says in note and note.startswith("nothing to do on this host") for note in result.notes), result.notes


def test_a_release_that_already_admits_sm120_is_left_alone(tmp_path: Path) -> None:
    """A release whose gates admit sm120 by themselves (made here from 0.5.8 with the patch planner's
    own edits, as a newer release would ship them) and no earlier gpuops run: nothing to do."""
    from gpuops.lab.site import link_tree

    original = plan(scan_of("0.5.8"), "12.0", P2P_OK)
    patched = [c for c in original.changes if c.kind == "patch"]
    assert patched
    site = tmp_path / "site"
    link_tree(sglang_site("0.5.8"), site)
    root = str(scan_of("0.5.8").root)
    for change in patched:
        target = site / "sglang" / os.path.relpath(change.path, root)
        fresh = target.with_suffix(".new")
        fresh.write_text(change.after)
        os.replace(fresh, target)  # a new inode: the cached release's hard-linked file is untouched
    result = plan(scan_of("0.5.8", site), "12.0", P2P_OK)
    assert result.changed == 0
    assert any("already admits sm120" in note for note in result.notes), result.notes


def test_p2p_gaps_in_the_tp_group_are_refused_unless_allowed() -> None:
    scan = scan_of("0.5.8")
    with pytest.raises(GpuopsError) as refused:
        plan(scan, "12.0", CNS)
    text = str(refused.value)
    assert "16 GPU pair(s) of the TP group (TP 8)" in text and "IPC" in text and "fusion_allow_without_p2p=true" in text
    allowed = plan(scan, "12.0", CNS, {"fusion_allow_without_p2p": True})
    assert allowed.changed > 0 and any("going ahead" in w for w in allowed.warnings)
    # TP 4 within one socket: no pair of the group lacks P2P, so nothing to refuse.
    inventory_tp4 = dict(INVENTORY, sglang_args=["--model-path", "/m", "--tp", "4"])
    paths = discover("fusion-sm120", "h01", inventory_tp4, {}).paths
    facts = PlanFacts(host="h01", files={p: FileState(path=p, exists=False) for p in paths}, gate_scan=scan,
                      gpu={"compute_capability": "12.0", "cuda": "12.8", **CNS})
    assert plan_role("fusion-sm120", facts, inventory_tp4, {}).changed > 0


@pytest.mark.parametrize("release, pinned, refused", [
    ("0.5.8", "0.6.1", True), ("0.5.14", "0.6.12", True), ("0.5.20", "0.6.18", False), ("0.5.23", "0.7.2", False),
])
def test_the_pinned_flashinfer_known_only_by_its_version_decides_by_the_version_rule(release: str, pinned: str,
                                                                                    refused: bool) -> None:
    """A lab host (or any host) whose FlashInfer is only its .dist-info: the FlashInfer each real
    release pins (what the lab installs beside it: lab/site.release_stack) decides by the version
    rule. fusion-sm120 is refused on sm120 below 0.6.17, the first that builds the fused kernel for
    major 12, naming both versions; at or above it nothing refuses. (The kernel check alone for each
    release; the whole plan for 0.5.8, whose scan this module shares.)"""
    from gpuops.gates.catalog import load_catalog
    from gpuops.lab.site import release_stack
    from gpuops.plan.applicability import kernel_refusal

    assert release_stack(sglang_site(release), {"flashinfer-python": "x"})["flashinfer-python"] == pinned
    gpu = {**P2P_OK, "kernel_reads": {"nvcc": None}, "kernel_versions": {"flashinfer": pinned, "sglang": release}}
    error, warning = kernel_refusal(gpu, load_catalog().feature("flashinfer_allreduce_fusion"), "sm120", False,
                                    "fusion_allow_without_kernel")
    assert warning is None
    if not refused:
        assert error is None
        return
    assert error is not None and "\n" not in error
    assert f"FlashInfer {pinned} lacks the fused all-reduce + RMSNorm kernel (trtllm_comm) for sm120 by its " \
           "version (version rule: FlashInfer 0.6.17 is the first with it for sm120" in error, error
    assert "refused: install flashinfer-python 0.6.17 or later" in error
    if release == "0.5.8":
        with pytest.raises(GpuopsError, match="lacks the fused all-reduce"):
            plan(scan_of(release), "12.0", gpu)
