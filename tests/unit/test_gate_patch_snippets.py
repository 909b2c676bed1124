"""The fusion patch planner on small hand-written layouts (scanned with the real scanner): each
widening style, what it must leave alone, and what it must refuse."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_gate_scanner_snippets import make_site

from gpuops.gates.evaluate import judge
from gpuops.gates.local import scan_site
from gpuops.gates.patch import UnrecognisedLayout, plan_gate_patch

FUSION = "flashinfer_allreduce_fusion"
PLATFORM = """
_PLATFORM_PROBES = {"is_sm90": "is_sm90_supported", "is_sm100": "is_sm100_supported",
                    "is_sm120": "is_sm120_supported"}


def get_platform():
    return None
"""


def plan_for(tmp_path: Path, files: dict[str, str], common: str | None = None):
    site = make_site(tmp_path, files)
    if common is not None:
        (site / "sglang" / "srt" / "utils" / "common.py").write_text(textwrap.dedent(common))
    scan = scan_site(site, with_sources=True)
    assert scan.known, scan.reason
    return scan, plan_gate_patch(scan, scan.sources, "flashinfer_allreduce_fusion", "sm120")


def rescan_after(tmp_path: Path, scan, plan):
    site = Path(scan.root).parent
    for change in plan.changes:
        (site / "sglang" / change.path).write_text(change.after)
    return scan_site(site, with_sources=True)


def test_platform_guard_widened_with_the_platform_attribute(tmp_path):
    scan, plan = plan_for(tmp_path, {
        "srt/runtime_context.py": PLATFORM,
        "srt/layers/fusion.py": """
            from sglang.srt.runtime_context import get_platform

            def _resolve_backend(backend, is_multi_node=False):
                \"\"\"Resolve the FlashInfer allreduce fusion backend.\"\"\"
                if not (get_platform().is_sm90 or get_platform().is_sm100):
                    raise ValueError("FlashInfer allreduce fusion requires SM90 or SM10X")
                if is_multi_node and not get_platform().is_sm100:
                    raise ValueError("multi-node needs MNNVL")
                return backend
            """})
    (change,) = plan.changes
    assert "if not (get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120):" in change.after
    assert not any(line.startswith("+") and "import" in line for line in change.diff().splitlines())
    # The multi-node guard is closed on SM120 whenever multi-node fusion is asked for (it needs an
    # MNNVL fabric): listed as staying closed, never widened.
    assert [(c.line, c.function) for c in plan.left_closed] == [(8, "_resolve_backend")]
    assert "if is_multi_node and not get_platform().is_sm100:" in change.after
    rescanned = rescan_after(tmp_path, scan, plan)
    assert judge(rescanned, "12.0", "12.8").features[FUSION]["status"] == "open"
    assert not plan_gate_patch(rescanned, rescanned.sources, "flashinfer_allreduce_fusion", "sm120").changed


def test_multi_node_alternative_is_left_alone(tmp_path):
    scan, plan = plan_for(tmp_path, {"srt/server_args.py": """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        class ServerArgs:
            def adjust(self, model_arch):
                if (
                    self.flashinfer_allreduce_fusion_backend is None
                    and (is_sm90_supported() or is_sm100_supported())
                    and (self.nnodes == 1 or is_sm100_supported())
                ):
                    self.flashinfer_allreduce_fusion_backend = "auto"

        def apply_flashinfer_allreduce_fusion(n):
            return is_sm90_supported() and n > 0
        """})
    after = plan.changes[0].after
    assert "and (is_sm90_supported() or is_sm100_supported() or is_sm120_supported())" in after
    assert "and (self.nnodes == 1 or is_sm100_supported())" in after  # untouched
    assert "return (is_sm90_supported() or is_sm120_supported()) and n > 0" in after
    assert "from sglang.srt.utils import is_sm90_supported, is_sm100_supported, is_sm120_supported\n" in after
    assert after.count("is_sm120_supported\n") == 1
    # This layout never names "trtllm": the value falls back to the catalog's "auto".
    assert plan.launch_args == ("--flashinfer-allreduce-fusion-backend", "auto")


def test_module_qualified_call_needs_no_import(tmp_path):
    _, plan = plan_for(tmp_path, {"srt/layers/communicator.py": """
        import sglang.srt.utils as u

        def apply_flashinfer_allreduce_fusion(batch_size):
            return u.is_sm100_supported() and batch_size > 0
        """})
    after = plan.changes[0].after
    assert "return (u.is_sm100_supported() or u.is_sm120_supported()) and batch_size > 0" in after
    assert after.startswith("\nimport sglang.srt.utils as u\n\ndef")


def test_alias_added_next_to_its_sibling(tmp_path):
    scan, plan = plan_for(tmp_path, {"srt/layers/communicator.py": """
        from sglang.srt.utils import (
            is_cuda,
            is_sm100_supported,
        )

        _is_cuda = is_cuda()
        _is_sm100_supported = _is_cuda and is_sm100_supported()

        def apply_flashinfer_allreduce_fusion(batch_size):
            return _is_sm100_supported and batch_size > 0
        """})
    after = plan.changes[0].after
    assert "    is_sm100_supported,\n    is_sm120_supported,\n)" in after
    assert "_is_sm100_supported = _is_cuda and is_sm100_supported()\n_is_sm120_supported = _is_cuda and is_sm120_supported()\n" in after
    assert "return (_is_sm100_supported or _is_sm120_supported) and batch_size > 0" in after
    rescanned = rescan_after(tmp_path, scan, plan)
    assert judge(rescanned, "12.0", "12.8").features[FUSION]["status"] == "open"
    assert judge(rescanned, "12.0", "12.4").features[FUSION]["status"] == "blocked"  # the predicate wants CUDA 12.8
    assert not plan_gate_patch(rescanned, rescanned.sources, "flashinfer_allreduce_fusion", "sm120").changed


def test_alias_name_taken_by_something_else_is_refused(tmp_path):
    with pytest.raises(UnrecognisedLayout, match="_is_sm120_supported already exists with another meaning"):
        plan_for(tmp_path, {"srt/layers/communicator.py": """
            from sglang.srt.utils import is_sm100_supported

            _is_sm100_supported = is_sm100_supported()
            _is_sm120_supported = False

            def apply_flashinfer_allreduce_fusion(batch_size):
                return _is_sm100_supported and batch_size > 0
            """})


def test_imported_alias_is_refused(tmp_path):
    with pytest.raises(UnrecognisedLayout, match="cannot widen"):
        plan_for(tmp_path, {"srt/layers/communicator.py": """
            from sglang.srt.layers.other import _is_sm100_supported

            def apply_flashinfer_allreduce_fusion(batch_size):
                return _is_sm100_supported and batch_size > 0
            """})


def test_raw_capability_comparison_is_refused(tmp_path):
    with pytest.raises(UnrecognisedLayout, match="raw compute-capability comparison"):
        plan_for(tmp_path, {"srt/layers/communicator.py": """
            import torch

            def apply_flashinfer_allreduce_fusion(batch_size):
                return torch.cuda.get_device_capability()[0] in (9, 10) and batch_size > 0
            """})


def test_release_without_an_sm120_predicate_is_refused(tmp_path):
    common = """
        from functools import partial

        def _check(device_capability_majors, cuda_version):
            return False

        is_sm100_supported = partial(_check, device_capability_majors=[10], cuda_version=(12, 8))
        """
    with pytest.raises(UnrecognisedLayout, match="defines no predicate for sm120"):
        plan_for(tmp_path, {"srt/layers/communicator.py": """
            from sglang.srt.utils import is_sm100_supported

            def apply_flashinfer_allreduce_fusion(batch_size):
                return is_sm100_supported() and batch_size > 0
            """}, common=common)


def test_nothing_to_do_when_already_open(tmp_path):
    _, plan = plan_for(tmp_path, {"srt/layers/communicator.py": """
        from sglang.srt.utils import is_sm90_supported, is_sm120_supported

        def apply_flashinfer_allreduce_fusion(batch_size):
            return (is_sm90_supported() or is_sm120_supported()) and batch_size > 0
        """})
    assert not plan.changed and plan.widened == ()
    assert len(plan.already_open) == 1
    assert plan.launch_args == ()  # this layout names no launch setting
