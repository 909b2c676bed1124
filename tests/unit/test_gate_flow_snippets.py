"""Capability values as data flow, meanings resolved in scope, and never a silent guess: the gate
scanner on one small hand-written package (written here, never copied from SGLang), run as a
subprocess exactly as on a host."""

from __future__ import annotations

import pytest

from gpuops.gates.local import scan_site
from gpuops.gates.logic import GpuTarget, PredicateBook, admits, cap_verdict, undecided
from gpuops.gates.scan import GateScan

from test_gate_scanner_snippets import make_site

FILES = {
    # Module-level capability values (one under a module-level `if`), compared in functions.
    "srt/flow/module_values.py": """
        import torch
        from sglang.srt.utils import get_device_sm, is_cuda

        _is_cuda = is_cuda()
        _device_sm = get_device_sm()
        if _is_cuda:
            CUDA_CAPABILITY = torch.cuda.get_device_capability()

        def chained():
            if 90 <= _device_sm < 120:
                return 1

        def indexed():
            if _is_cuda and CUDA_CAPABILITY[0] == 12:
                return 2
        """,
    # The same value imported by another module.
    "srt/flow/importer.py": """
        from sglang.srt.flow.module_values import _device_sm

        def f():
            if _device_sm != 90:
                raise RuntimeError("needs sm90")
        """,
    # An upper-case alias used inside call arguments; a predicate as a keyword argument.
    "srt/flow/upper.py": """
        from sglang.srt.utils import is_sm120_supported

        _IS_SM120 = is_sm120_supported()

        class Plan:
            def build(self, n):
                self.rows = plan(n=n, cap=64 if _IS_SM120 else None)
                run(flag=is_sm120_supported())
        """,
    # A capability passed as a parameter (every call site passes one) and one that is not.
    "srt/flow/params.py": """
        import torch

        def _check(budget, device_capability):
            if device_capability[0] < 9:
                raise ValueError("needs sm90+")

        def _unproven(budget, cap):
            return cap[0] >= 10

        def caller(w):
            cc = torch.cuda.get_device_capability(w)
            _check(1, device_capability=cc)
            _unproven(1, (9, 0))
            _unproven(2, cc)
        """,
    # Arithmetic, arch strings through a small helper, dict keys, self attributes.
    "srt/flow/shapes.py": """
        import torch

        _PINNED = {(9, 0): "a", (10, 0): "b"}

        def _arch():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}"

        def arith():
            major, minor = torch.cuda.get_device_capability()
            sm = major * 10 + minor
            return sm >= 100

        def arch_string():
            arch = _arch()
            if arch == "sm90":
                return 1

        def pinned():
            cap = torch.cuda.get_device_capability()
            return cap in _PINNED

        class Runner:
            def __init__(self, device):
                self.device_capability = torch.cuda.get_device_capability(device)[0]

            def run(self):
                if self.device_capability >= 10:
                    return 1
        """,
    # Short predicates of a few statements; one gpuops cannot read.
    "srt/flow/short_preds.py": """
        import torch

        def _is_sm10x():
            major, _ = torch.cuda.get_device_capability()
            return major == 10

        def _is_sm12x():
            from somewhere import opaque_arch
            return opaque_arch().major >= 12

        def readable():
            if _is_sm10x():
                return 1

        def unreadable():
            if _is_sm12x():
                return 2

        def unreadable_guard():
            if not _is_sm12x():
                raise RuntimeError("sm12x only")
        """,
    # A platform class (its own predicate meanings) and a bool parameter named like a predicate.
    "multimodal_gen/platforms/interface.py": """
        import torch

        class Platform:
            @classmethod
            def is_cuda_static(cls):
                return True

            @classmethod
            def is_blackwell(cls):
                if not cls.is_cuda_static():
                    return False
                return torch.cuda.get_device_capability()[0] == 10

            @classmethod
            def is_sm120(cls):
                return torch.cuda.get_device_capability()[0] == 12
        """,
    "multimodal_gen/platforms/__init__.py": """
        from sglang.multimodal_gen.platforms.interface import Platform

        current_platform = Platform()
        """,
    "multimodal_gen/loader.py": """
        from sglang.multimodal_gen.platforms import current_platform

        def load(spec):
            if not current_platform.is_blackwell() or not spec.fp4:
                raise ValueError("fp4 needs Blackwell")

        def sm12(spec):
            return current_platform.is_sm120()

        def block(x, is_blackwell):
            if is_blackwell:
                return x
        """,
    # srt's own is_blackwell, for contrast (majors 10, 11, 12 in this package's utils).
    "srt/flow/srt_blackwell.py": """
        from sglang.srt.utils import is_blackwell_supported

        def f():
            if is_blackwell_supported():
                return 1
        """,
    # A table keyed by the major, a class-level set, a module attribute of another module, a
    # predicate wrapped in try/except, a branch that does the work and then returns.
    "srt/flow/tables.py": """
        import torch
        from sglang.srt.flow.table_data import SIZES

        class Comm:
            _MULTIMEM = {9: [4, 8], 10: [8]}
            supported = {(9, 0), (10, 0)}

            def __init__(self, ws):
                self.major = torch.cuda.get_device_capability()[0]
                if ws not in SIZES[self.major]:
                    return
                self.ok = 1

            def multimem(self, ws):
                if ws in self._MULTIMEM[self.major]:
                    return 1

            @classmethod
            def check(cls):
                cap = torch.cuda.get_device_capability()
                if cap not in cls.supported:
                    raise ValueError("unsupported")
        """,
    "srt/flow/table_data.py": """
        SIZES = {
            9: {2: 1},
            10: {2: 1},
        }
        """,
    "srt/flow/wrapper/__init__.py": """
        from .config import *
        """,
    "srt/flow/wrapper/config.py": """
        from sglang.srt.utils import is_sm100_supported

        ENABLE_JIT = True
        WRAPPER_BLACKWELL = ENABLE_JIT and is_sm100_supported()
        """,
    "srt/flow/uses_wrapper.py": """
        import torch

        def _is_sm100_or_newer(x):
            if not x.is_cuda:
                return False
            try:
                return torch.cuda.get_device_capability(x.device)[0] >= 10
            except RuntimeError:
                return False

        def f(x, explicit):
            from sglang.srt.flow import wrapper
            from sglang.srt.utils import is_sm90_supported

            supported = wrapper.WRAPPER_BLACKWELL or (wrapper.ENABLE_JIT and is_sm90_supported() and explicit)
            if not supported:
                disable()
            if _is_sm100_or_newer(x):
                return 1
            if is_sm90_supported():
                build_sm90(x)
                return
            return 2
        """,
    "srt/flow/sm107.py": """
        from sglang.srt.utils import get_device_sm

        def f():
            return get_device_sm() == 107
        """,
}

EXTRA_COMMON = '''
is_blackwell_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[10, 11, 12], cuda_version=(12, 8))
)
'''


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> GateScan:
    site = make_site(tmp_path_factory.mktemp("flow"), FILES)
    common = site / "sglang" / "srt" / "utils" / "common.py"
    common.write_text(common.read_text() + EXTRA_COMMON)
    result = scan_site(site)
    assert result.known, result.reason
    return result


def gate_at(scan: GateScan, file: str, line: int):
    found = [g for g in scan.gates if g["file"] == file and g["line"] == line]
    assert len(found) == 1, [(g["file"], g["line"], g["text"]) for g in scan.gates if g["file"] == file]
    return found[0]


def verdicts(scan: GateScan, gate) -> str:
    """o/b/u on sm90, sm100, sm120 (CUDA 12.9)."""
    book = PredicateBook(scan)
    return "".join(cap_verdict(gate, book, GpuTarget(major, 0, (12, 9))).status[0] for major in (9, 10, 12))


CASES = [
    ("srt/flow/module_values.py", 11, "oob", ["sm90", "sm100", "sm103", "sm107", "sm110"]),
    ("srt/flow/module_values.py", 15, "bbo", ["sm120", "sm121"]),
    ("srt/flow/importer.py", 5, "obb", ["sm90"]),
    ("srt/flow/upper.py", 8, "bbo", ["sm120", "sm121"]),
    ("srt/flow/upper.py", 9, "bbo", ["sm120", "sm121"]),
    ("srt/flow/params.py", 5, "ooo", ["sm90", "sm100", "sm103", "sm107", "sm110", "sm120", "sm121"]),
    ("srt/flow/shapes.py", 13, "boo", ["sm100", "sm103", "sm107", "sm110", "sm120", "sm121"]),
    ("srt/flow/shapes.py", 17, "obb", ["sm90"]),
    ("srt/flow/shapes.py", 22, "oob", ["sm90", "sm100"]),
    ("srt/flow/shapes.py", 29, "boo", ["sm100", "sm103", "sm107", "sm110", "sm120", "sm121"]),
    ("srt/flow/short_preds.py", 13, "bob", ["sm100", "sm103", "sm107"]),
    ("multimodal_gen/loader.py", 5, "bob", ["sm100", "sm103", "sm107"]),
    ("multimodal_gen/loader.py", 9, "bbo", ["sm120", "sm121"]),
    ("srt/flow/srt_blackwell.py", 5, "boo", ["sm100", "sm103", "sm107", "sm110", "sm120", "sm121"]),
    ("srt/flow/sm107.py", 5, "bbb", ["sm107"]),
    ("srt/flow/tables.py", 11, "oob", ["sm90", "sm100", "sm103", "sm107"]),
    ("srt/flow/tables.py", 16, "oob", ["sm90", "sm100", "sm103", "sm107"]),
    ("srt/flow/tables.py", 22, "oob", ["sm90", "sm100"]),
    ("srt/flow/uses_wrapper.py", 17, "obo", ["sm80", "sm86", "sm89", "sm90", "sm110", "sm120", "sm121"]),
    ("srt/flow/uses_wrapper.py", 19, "boo", ["sm100", "sm103", "sm107", "sm110", "sm120", "sm121"]),
    ("srt/flow/uses_wrapper.py", 21, "obb", ["sm90"]),
]


@pytest.mark.parametrize("file,line,expected,admitted", CASES, ids=[f"{f}:{n}" for f, n, _, _ in CASES])
def test_capability_flow_and_scope(scan, file, line, expected, admitted):
    gate = gate_at(scan, file, line)
    assert verdicts(scan, gate) == expected, gate["text"]
    assert admits(gate, PredicateBook(scan)) == admitted


def test_a_parameter_is_a_capability_only_when_every_call_site_passes_one(scan):
    assert not [g for g in scan.gates if g["file"] == "srt/flow/params.py" and g["line"] == 9]


def test_a_bool_parameter_named_like_a_predicate_is_not_one(scan):
    assert not [g for g in scan.gates if g["file"] == "multimodal_gen/loader.py" and g["line"] == 12]


def test_predicate_definitions_are_not_gates(scan):
    assert not [g for g in scan.gates if g["file"] == "multimodal_gen/platforms/interface.py"]
    assert not [g for g in scan.gates if g["file"] == "srt/flow/short_preds.py" and g["line"] < 11]


def test_an_unreadable_predicate_is_unknown_never_open_and_never_admits_nothing(scan):
    book = PredicateBook(scan)
    for line in (17, 21):
        gate = gate_at(scan, "srt/flow/short_preds.py", line)
        verdict = cap_verdict(gate, book, GpuTarget(9, 0, (12, 9)))
        assert verdict.status == "unknown"
        assert any("opaque_arch().major >= 12" in why and "_is_sm12x" in why for why in verdict.unknowns)
        assert admits(gate, book), "an unknown atom must not make the gate admit no GPU"
        assert undecided(gate, book) == [name for name, _, _ in book.candidates]


def test_admits_spans_what_the_release_names(scan):
    names = [name for name, _, _ in PredicateBook(scan).candidates]
    assert {"sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm107", "sm110", "sm120", "sm121"} <= set(names)


def test_forked_scan_is_the_serial_scan(tmp_path):
    site = make_site(tmp_path, FILES)
    serial = scan_site(site, jobs=1)
    forked = scan_site(site, jobs=2)
    assert serial.gates == forked.gates and serial.predicates == forked.predicates


def test_a_branch_that_does_the_work_then_returns_is_not_a_guard(scan):
    assert gate_at(scan, "srt/flow/uses_wrapper.py", 21)["kind"] == "if"


def test_a_predicate_body_inside_try_is_a_definition_not_a_gate(scan):
    assert not [g for g in scan.gates if g["file"] == "srt/flow/uses_wrapper.py" and g["line"] < 11]
