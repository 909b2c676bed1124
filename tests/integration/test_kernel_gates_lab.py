"""The kernel library's own gates on lab hosts that carry a real FlashInfer beside the SGLang release
that pins it (``LabSpec(flashinfer="pinned")``), over real sshd:

- ``field``: 8x RTX PRO 6000 Server (sm120, PCIe), SGLang 0.5.8 + FlashInfer 0.6.1 (its pin):
  fusion is BLOCKED with FlashInfer's file:line, and fusion-sm120 refuses before touching anything
  (files byte-identical), naming 0.6.1 and 0.6.17; the documented -e override plans the patch.
- ``ws``: 4x RTX PRO 6000 Workstation (sm120, P2P everywhere), SGLang 0.5.23 + FlashInfer 0.7.2:
  the fused kernel builds for major 12, so fusion-sm120 applies; the PCIe IPC all-reduce is open.
- ``hopper``: 8x H100 NVLink (sm90), SGLang 0.5.8 + FlashInfer 0.6.1: 0.6.1 builds for major 9.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labtools import tree_hashes

pytestmark = pytest.mark.integration

FAST = ("-e", "gpuops_health_timeout=300", "-e", "gpuops_stop_grace=5")


@pytest.fixture(scope="module")
def fleet(lab_factory):
    from gpuops.lab.hosts import LabSpec

    return lab_factory(
        LabSpec(gpu="rtx-pro-6000-x8", sglang="0.5.8", names=("field",), flashinfer="pinned"),
        LabSpec(gpu="rtx-pro-6000-ws-x4", sglang="0.5.23", names=("ws",), flashinfer="pinned"),
        LabSpec(gpu="h100-x8", sglang="0.5.8", names=("hopper",), flashinfer="pinned"),
    )


def gpuops_json(run_gpuops, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_gpuops(*args, "--json", timeout=400)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(proc.stdout + proc.stderr) from None


def test_the_hosts_carry_the_real_flashinfer_their_release_pins(fleet) -> None:
    hosts = {h.name: h for h in fleet.hosts}
    for name, version in (("field", "0.6.1"), ("ws", "0.7.2"), ("hopper", "0.6.1")):
        site = hosts[name].site_dir
        assert (site / "flashinfer" / "jit" / "comm.py").is_file()
        assert (site / f"flashinfer_python-{version}.dist-info" / "METADATA").is_file()
        assert not (site / "flashinfer" / "data").exists()  # the C++ sources are not carried


def test_inspect_calls_fusion_blocked_by_flashinfer_with_its_file_line(fleet, run_gpuops) -> None:
    rc, doc = gpuops_json(run_gpuops, "inspect", "host", "-i", str(fleet.inventory_path))
    assert rc == 0, doc
    field = doc["hosts"]["field"]["features"]["flashinfer_allreduce_fusion"]
    assert field["status"] == "blocked"
    assert "FlashInfer 0.6.1 cannot build the fused all-reduce + RMSNorm kernel (trtllm_comm) for sm120" in field["reason"]
    assert "flashinfer/jit/comm.py:61 builds majors [9, 10] only" in field["reason"]
    (need,) = field["kernels"]
    assert need["status"] == "blocked" and need["read"] and need["line"] == 61 and need["first"] == "0.6.17"
    # The Workstation on 0.5.23: FlashInfer 0.7.2 builds it for major 12 (SGLang's own gate still
    # shuts sm120 out: that is what fusion-sm120 widens); the PCIe IPC all-reduce is there.
    ws = doc["hosts"]["ws"]["features"]
    assert ws["flashinfer_allreduce_fusion"]["kernels"][0]["status"] == "open"
    assert ws["pcie_ipc_allreduce"]["status"] == "open", ws["pcie_ipc_allreduce"]
    assert doc["hosts"]["field"]["features"]["pcie_ipc_allreduce"]["status"] == "blocked"
    assert "SGLang 0.5.21 is the first with it" in doc["hosts"]["field"]["features"]["pcie_ipc_allreduce"]["reason"]
    # The H100: 0.6.1 builds the fused kernel for major 9, and SGLang runs it there.
    hopper = doc["hosts"]["hopper"]["features"]["flashinfer_allreduce_fusion"]
    assert hopper["status"] == "open" and hopper["kernels"][0]["status"] == "open", hopper

    # The all-reduce paths SGLang decides by the host's shape, each with the release's file:line.
    field = doc["hosts"]["field"]["features"]
    custom = field["custom_allreduce"]
    assert custom["status"] == "blocked" and custom["in_effect"] is False
    assert "TP 8 over PCIe only: SGLang turns it off on more than 2 PCIe-only GPUs " \
           "(sglang/srt/distributed/device_communicators/custom_all_reduce.py:138)" in custom["reason"]
    assert "on by default (off with --disable-custom-all-reduce)" in custom["reason"]
    symm = field["torch_symm_mem"]
    assert symm["status"] == "blocked" and "capability majors 9, 10" in symm["reason"]
    assert "all_reduce_utils.py:3" in symm["reason"] and "none for 12" in symm["reason"]
    hopper = doc["hosts"]["hopper"]["features"]
    assert hopper["torch_symm_mem"]["status"] == "open", hopper["torch_symm_mem"]
    assert hopper["pcie_ipc_allreduce"]["status"] == "blocked"
    assert "for PCIe-only hosts; NVLink all-reduce is already fast" in hopper["pcie_ipc_allreduce"]["reason"]
    pcie = ws["pcie_ipc_allreduce"]
    assert "pcie_ipc_ar.py:77" in pcie["reason"] and pcie["in_effect"] is False, pcie
    assert "launch with SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1" in pcie["reason"]


def test_fusion_refused_before_touching_anything_where_flashinfer_cannot_build_it(fleet, run_gpuops) -> None:
    inv = str(fleet.inventory_path)
    field = next(h for h in fleet.hosts if h.name == "field")
    before = tree_hashes(field.dir)
    for check in ((), ("--check",)):
        rc, doc = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "field", *check, *FAST)
        report = doc["hosts"]["field"]
        assert rc != 0 and not report["ok"]
        error = report["error"]
        assert "FlashInfer 0.6.1 cannot build" in error and "flashinfer/jit/comm.py:61" in error
        assert "flashinfer-python 0.6.17 or later" in error and "-e fusion_allow_without_kernel=true" in error
        assert "\n" not in error
        assert tree_hashes(field.dir) == before
    # The documented override: the patch is planned (this host also lacks P2P across its sockets).
    rc, doc = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "field", "--check",
                          "-e", "fusion_allow_without_kernel=true", "-e", "fusion_allow_without_p2p=true", *FAST)
    report = doc["hosts"]["field"]
    assert rc == 0 and report["ok"] and report["changed"] > 0, report
    assert any("FlashInfer 0.6.1 cannot build" in w and "fusion_allow_without_kernel is true" in w
               for w in report["warnings"]), report["warnings"]
    assert tree_hashes(field.dir) == before


def test_fusion_applies_where_flashinfer_builds_it_for_the_gpu(fleet, run_gpuops) -> None:
    inv = str(fleet.inventory_path)
    rc, doc = gpuops_json(run_gpuops, "apply", "fusion-sm120", "-i", inv, "-l", "ws", *FAST)
    report = doc["hosts"]["ws"]
    assert rc == 0 and report["ok"] and report["changed"] > 0, report
    assert not any("FlashInfer" in w for w in report["warnings"]), report["warnings"]
