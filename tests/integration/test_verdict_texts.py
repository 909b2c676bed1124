"""Every verdict text inspect shows, on every release 0.5.7 .. 0.5.23 (real wheels, cached), with
the FlashInfer each pins read by the very software probe a host runs: never "None" (a feature with
no launch flag says what SGLang does instead), and a feature with several kernel paths answers each
under one headline (cutlass_fp8: the block-FP8 GEMM and the CUTLASS MoE runner)."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
from labtools import probe_site, release_scan

from gpuops.gates.catalog import load_catalog
from gpuops.gates.evaluate import judge
from gpuops.gates.fits import HostShape, fold_stack
from gpuops.gates.kernels import versions_of
from gpuops.lab.sglang_cache import flashinfer_site, sglang_site
from gpuops.lab.site import release_stack

pytestmark = pytest.mark.integration

RELEASES = [f"0.5.{n}" for n in range(7, 24)]
# (capability, interconnect, server): the field box with its server, an H100 box, a box with none.
SHAPES = (
    ("12.0", HostShape(tp_size=8, dtype="bfloat16", deterministic=False, nvlink=False, p2p_gaps=("GPU0-GPU4 (CNS)",),
                       capability="12.0", server_args={"tp_size": 8}, server_env={}),
     {"args": {"tp_size": 8}, "architecture": "DeepseekV3ForCausalLM"}),
    ("9.0", HostShape(tp_size=8, dtype="bfloat16", deterministic=False, nvlink=True, p2p_gaps=(), capability="9.0",
                      server_args={"tp_size": 8}, server_env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}),
     {"args": {"tp_size": 8}, "architecture": "DeepseekV3ForCausalLM"}),
    ("12.0", HostShape(capability="12.0", nvlink=False), None),
)
NONE = re.compile(r"\bNone\b")
CODE = re.compile(r"`[^`]*`")  # the release's own code, quoted (`torch.version.hip is not None`)


def texts(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in ("condition", "excerpt"):  # the release's own source text, quoted
                yield from texts(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from texts(item, f"{where}[{i}]")


@pytest.mark.parametrize("version", RELEASES)
def test_no_none_in_any_verdict_text(version: str) -> None:
    site = sglang_site(version)
    pinned = release_stack(site, {}).get("flashinfer-python")
    sites = [site] + ([flashinfer_site(pinned)] if pinned else [])
    packages = probe_site(*sites)
    assert packages.known
    scan = release_scan(version)
    assert scan.known, scan.reason
    catalog = load_catalog()
    for capability, shape, server in SHAPES:
        report = fold_stack(judge(scan, capability, "12.8", server, catalog, {"nvlink": shape.nvlink}), catalog,
                            packages.kernels, versions_of(packages), shape)
        assert set(report.features) == {f.name for f in catalog.features}
        for name, feature in report.features.items():
            assert feature["status"] in ("open", "blocked", "unknown")
            for where, text in texts(feature, name):
                assert not NONE.search(CODE.sub("", text)), f"sglang {version}, {capability}: {where}: {text}"
        for gate in report.gates:
            for key in ("reason", "meaning"):
                text = CODE.sub("", str(gate.get(key) or ""))
                assert not NONE.search(text), f"sglang {version}: gate {gate['id']}: {gate[key]}"
        cutlass = report.features["cutlass_fp8"]
        if cutlass["status"] == "open" and any(p["status"] != "open" for p in cutlass.get("paths") or ()):
            # One honest headline: the open count first, each path's own answer after it.
            assert cutlass["reason"].startswith("open on 1 of 2 paths: "), cutlass["reason"]
            blocked = [p["path"] for p in cutlass["paths"] if p["status"] == "blocked"]
            assert f"{blocked[0]} blocked on sm" in cutlass["reason"]
