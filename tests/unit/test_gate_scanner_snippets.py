"""The gate scanner on small hand-written packages, run as a subprocess with python3 exactly as on a
host (the probe's sh script, $GPUOPS_PY, the package found through PYTHONPATH)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuops.gates.evaluate import judge
from gpuops.gates.local import scan_site
from gpuops.gates.logic import PredicateBook, admits
from gpuops.gates.scan import GateScan

# The predicates as 0.5.x's utils/common.py defines them (written here, not copied).
COMMON = '''
from functools import lru_cache, partial


def is_cuda():
    return True


def _check_cuda_device_version(device_capability_majors, cuda_version):
    if not is_cuda():
        return False
    return get_device_sm() // 10 in device_capability_majors


def get_device_sm():
    return 0


is_sm120_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[12], cuda_version=(12, 8))
)
is_sm100_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[10], cuda_version=(12, 8))
)
is_sm90_supported = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[9], cuda_version=(12, 3))
)
# Deliberately unlike the built-in table (which says 10, 11, 12): the source must win.
is_blackwell = lru_cache(maxsize=1)(
    partial(_check_cuda_device_version, device_capability_majors=[10], cuda_version=(12, 8))
)
'''


def make_site(tmp_path: Path, files: dict[str, str]) -> Path:
    site = tmp_path / "site"
    pkg = site / "sglang"
    (pkg / "srt" / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "utils" / "__init__.py").write_text("from sglang.srt.utils.common import *\n")
    (pkg / "srt" / "utils" / "common.py").write_text(COMMON)
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return site


def scan_files(tmp_path: Path, files: dict[str, str]) -> GateScan:
    scan = scan_site(make_site(tmp_path, files))
    assert scan.known, scan.reason
    return scan


def gates_in(scan: GateScan, file: str) -> list:
    return [g for g in scan.gates if g["file"] == file]


def only_gate(scan: GateScan, file: str):
    found = gates_in(scan, file)
    assert len(found) == 1, [g["text"] for g in found]
    return found[0]


def test_call_gate_admits_what_the_source_defines(tmp_path):
    scan = scan_files(tmp_path, {"srt/a.py": """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        def use_fast_path(tp_size):
            if (is_sm90_supported() or is_sm100_supported()) and tp_size > 1:
                return True
            return False
        """})
    gate = only_gate(scan, "srt/a.py")
    assert gate["function"] == "use_fast_path"
    assert gate["kind"] == "if"
    assert gate["line"] == 5
    assert admits(gate, PredicateBook(scan)) == ["sm90", "sm100", "sm103"]
    report = judge(scan, "12.0", "12.8")
    judged = next(g for g in report.gates if g["id"] == gate["id"])
    assert judged["status"] == "blocked"
    assert [c["text"] for c in judged["clauses"]] == ["tp_size > 1"]
    assert next(g for g in judge(scan, "9.0", "12.4").gates if g["id"] == gate["id"])["status"] == "open"


def test_module_alias_is_expanded(tmp_path):
    scan = scan_files(tmp_path, {"srt/b.py": """
        from sglang.srt.utils import is_cuda, is_sm100_supported

        _is_cuda = is_cuda()
        _is_sm100_supported = _is_cuda and is_sm100_supported()

        def fused(x):
            return _is_sm100_supported and x
        """})
    gate = only_gate(scan, "srt/b.py")  # the alias definition itself is not a gate
    assert gate["kind"] == "return"
    assert gate["condition"]["args"][0]["op"] == "alias"
    assert admits(gate, PredicateBook(scan)) == ["sm100", "sm103"]


def test_platform_attribute_read_through_the_release_table(tmp_path):
    scan = scan_files(tmp_path, {
        "srt/runtime_context.py": """
            _PLATFORM_PROBES = {"is_sm100": "is_sm100_supported", "is_sm120": "is_sm120_supported"}

            def get_platform():
                return None
            """,
        "srt/c.py": """
            from sglang.srt.runtime_context import get_platform

            def pick():
                if get_platform().is_sm120:
                    return "consumer"
                return "other"
            """})
    assert scan.platform_attrs["is_sm120"] == "is_sm120_supported"
    gate = only_gate(scan, "srt/c.py")
    assert gate["condition"]["atom"]["form"] == "platform"
    assert admits(gate, PredicateBook(scan)) == ["sm120", "sm121"]


@pytest.mark.parametrize("expr, expected", [
    ("torch.cuda.get_device_capability()[0] >= 9", ["sm90", "sm100", "sm103", "sm110", "sm120", "sm121"]),
    ("torch.cuda.get_device_capability() == (12, 0)", ["sm120"]),
    ("get_device_sm() in (100, 103)", ["sm100", "sm103"]),
    ("90 <= get_device_sm() < 100", ["sm90"]),
])
def test_capability_comparisons(tmp_path, expr, expected):
    scan = scan_files(tmp_path, {"srt/d.py": f"""
        import torch
        from sglang.srt.utils import get_device_sm

        def ok():
            return {expr}
        """})
    gate = only_gate(scan, "srt/d.py")
    assert admits(gate, PredicateBook(scan)) == expected


def test_unpacked_capability_in_a_local_name(tmp_path):
    scan = scan_files(tmp_path, {"srt/e.py": """
        import torch

        def choose():
            major, minor = torch.cuda.get_device_capability()
            if major == 12 and minor == 0:
                return "sm120 kernel"
            return None
        """})
    gate = only_gate(scan, "srt/e.py")
    assert admits(gate, PredicateBook(scan)) == ["sm120"]


def test_raise_guard_has_inverted_polarity_and_its_message(tmp_path):
    scan = scan_files(tmp_path, {"srt/f.py": """
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        def _resolve(backend):
            \"\"\"Resolve the backend.\"\"\"
            if not (is_sm90_supported() or is_sm100_supported()):
                raise ValueError("needs SM90 or SM10X " f"(got {backend})")
            return backend
        """})
    gate = only_gate(scan, "srt/f.py")
    assert gate["kind"] == "guard" and gate["polarity"] == -1
    assert gate["effect"]["raises"] == "ValueError"
    assert gate["effect"]["message"] == "needs SM90 or SM10X (got {...})"
    assert gate["doc"] == "Resolve the backend."
    assert admits(gate, PredicateBook(scan)) == ["sm90", "sm100", "sm103"]
    assert judge(scan, "12.0", "12.8").gates[0]["status"] == "blocked"


def test_things_that_are_not_gates(tmp_path):
    scan = scan_files(tmp_path, {"srt/g.py": '''
        """Module doc.
        if is_sm90_supported():
            pass
        """
        import torch

        MESSAGE = "call is_sm90_supported() first"
        sm90_enabled = True
        use_sm90_kernel = False


        def f(capability):
            # if is_sm100_supported(): this comment is not code
            if sm90_enabled and use_sm90_kernel:
                return MESSAGE
            if capability is not None:
                return "is_sm100_supported"
            return torch.cuda.get_device_capability()
        '''})
    assert gates_in(scan, "srt/g.py") == []


def test_source_meaning_wins_over_the_table(tmp_path):
    scan = scan_files(tmp_path, {"srt/h.py": """
        from sglang.srt.utils import is_blackwell

        def fast():
            return is_blackwell()
        """})
    gate = only_gate(scan, "srt/h.py")
    assert gate["condition"]["atom"]["def"] == "srt/utils/common.py"
    assert admits(gate, PredicateBook(scan)) == ["sm100", "sm103"]  # the table would say sm120 too


def test_table_is_the_fallback_for_an_undefined_predicate(tmp_path):
    scan = scan_files(tmp_path, {"srt/i.py": """
        from somewhere_else import is_sm110_supported

        def f():
            return is_sm110_supported()
        """})
    gate = only_gate(scan, "srt/i.py")
    assert gate["condition"]["atom"]["def"] is None
    assert admits(gate, PredicateBook(scan)) == ["sm110"]


def test_unreadable_comparison_is_unknown_not_open(tmp_path):
    scan = scan_files(tmp_path, {"srt/j.py": """
        from sglang.srt.utils import get_device_sm
        from config import MIN_SM

        def f():
            return get_device_sm() >= MIN_SM
        """})
    gate = only_gate(scan, "srt/j.py")
    judged = judge(scan, "12.0", "12.8").gates[0]
    assert judged["id"] == gate["id"] and judged["status"] == "unknown"
    assert "cannot read" in judged["reason"]


def test_unknown_cuda_version_is_unknown_where_it_decides(tmp_path):
    scan = scan_files(tmp_path, {"srt/k.py": """
        from sglang.srt.utils import is_sm120_supported, is_sm90_supported

        def a():
            return is_sm120_supported()

        def b():
            return is_sm90_supported()
        """})
    statuses = {g["function"]: g["status"] for g in judge(scan, "12.0", None).gates}
    assert statuses == {"a": "unknown", "b": "blocked"}  # sm90 is out whatever the CUDA version


def test_file_that_does_not_parse_is_reported(tmp_path):
    scan = scan_files(tmp_path, {
        "srt/layers/communicator.py": "def apply_flashinfer_allreduce_fusion(:\n    return is_sm90_supported()\n",
        "srt/ok.py": "from sglang.srt.utils import is_sm90_supported\nX = [is_sm90_supported() for _ in ()]\n",
    })
    assert [e["file"] for e in scan.errors] == ["srt/layers/communicator.py"]
    assert scan.errors[0]["matches"]  # it names the fusion feature's keywords
    assert gates_in(scan, "srt/ok.py")
    feature = judge(scan, "9.0", "12.8").features["flashinfer_allreduce_fusion"]
    assert feature["status"] == "unknown"
    assert "srt/layers/communicator.py" in feature["reason"] and "does not parse" in feature["reason"]


def test_non_utf8_file_is_an_error_not_a_crash(tmp_path):
    site = make_site(tmp_path, {})
    (site / "sglang" / "srt" / "bad.py").write_bytes(b"x = '\xff is_sm90_supported'\n")
    scan = scan_site(site)
    assert scan.known
    assert {"file": "srt/bad.py", "error": "not UTF-8", "matches": []} in [dict(e) for e in scan.errors]


def test_method_of_a_long_class_keeps_its_qualified_name(tmp_path):
    filler = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(80))
    text = f"""
class ServerArgs:
    tp_size: int = 1
{filler}
    def _adjust(self):
        '''Example in a docstring:
if is_sm90_supported():
    pass
'''
        if is_sm100_supported() and self.tp_size > 1:
            self.enable_x = True
"""
    scan = scan_files(tmp_path, {"srt/l.py": text})
    gate = only_gate(scan, "srt/l.py")
    assert gate["function"] == "ServerArgs._adjust"
    assert gate["effect"]["sets"] == ["enable_x"]
    assert text.splitlines()[gate["line"] - 1].strip() == "if is_sm100_supported() and self.tp_size > 1:"
    assert scan.sources == {}


def test_clauses_judged_against_a_server(tmp_path):
    scan = scan_files(tmp_path, {"srt/server_args.py": """
        from sglang.srt.utils import is_sm90_supported

        class ServerArgs:
            def adjust(self, model_arch):
                if (
                    model_arch in ["DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM"]
                    and is_sm90_supported()
                    and self.tp_size > 1
                    and self.nnodes == 1
                    and not self.enable_dp_attention
                ):
                    self.enable_flashinfer_allreduce_fusion = True
        """})
    server = {"args": {"--tp-size": 1, "nnodes": 1, "enable_dp_attention": False},
              "architecture": "DeepseekV3ForCausalLM"}
    gate = judge(scan, "9.0", "12.4", server=server).gates[0]
    holds = {c["text"]: c["holds"] for c in gate["clauses"]}
    assert holds == {
        'model_arch in ["DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM"]': True,
        "self.tp_size > 1": False,
        "self.nnodes == 1": True,
        "not self.enable_dp_attention": True,
    }
    assert gate["role"] == "auto_enable"


def test_no_sglang_installed_is_unknown(tmp_path):
    scan = scan_site(tmp_path)  # an empty dir on PYTHONPATH
    assert not scan.known
    assert "sglang is not installed" in (scan.reason or "")
    feature = judge(scan, "12.0", "12.8").features["flashinfer_allreduce_fusion"]
    assert feature["status"] == "unknown" and "sglang is not installed" in feature["reason"]


def test_release_without_fusion_code_is_unknown(tmp_path):
    scan = scan_files(tmp_path, {"srt/m.py": """
        from sglang.srt.utils import is_sm90_supported

        def f():
            return is_sm90_supported()
        """})
    feature = judge(scan, "9.0", "12.4").features["flashinfer_allreduce_fusion"]
    assert feature["status"] == "unknown"
    assert "no FlashInfer allreduce + residual + RMSNorm fusion gate found" in feature["reason"]


@pytest.mark.parametrize("version", ["3.8", "3.9"])  # the scanner must run on a host's 3.8
def test_old_python_gives_the_same_scan(tmp_path, version):
    from labtools import require_python

    python = require_python(version)
    files = {"srt/n.py": """
        import torch
        from sglang.srt.utils import is_sm90_supported, is_sm100_supported

        _is_sm100 = is_sm100_supported()

        def f(x):
            if not (is_sm90_supported() or _is_sm100):
                raise ValueError("needs SM90 or SM100")
            cap = torch.cuda.get_device_capability()
            return cap[0] >= 9 and x["key"][0] and torch.cuda.get_device_capability()[1] == 0
        """}
    site = make_site(tmp_path, files)
    new = scan_site(site)
    old = scan_site(site, python=python)
    assert old.known and new.known
    assert old.python.startswith(("3.8", "3.9"))
    assert old.gates == new.gates and len(new.gates) == 2
    assert old.predicates == new.predicates


def test_a_capability_parameter_passed_from_lambdas_is_read_per_caller(tmp_path):
    # Issue 43, fix 14: `_check(cc_major)` compares the major with its parameter, and its only callers
    # are lambdas (`is_hopper_with_cuda_12_3 = lambda: _check(9)`). Their calls are the call sites:
    # the comparison is with one of 8 and 9, false on sm120 for both, so sm120 is shut out.
    scan = scan_files(tmp_path, {"srt/utils/check.py": """
        import torch


        def _check(cc_major):
            return torch.cuda.get_device_capability()[0] == cc_major and tuple(
                map(int, torch.version.cuda.split(".")[:2])
            ) >= (12, 3)


        is_ampere_with_cuda_12_3 = lambda: _check(8)
        is_hopper_with_cuda_12_3 = lambda: _check(9)
        """, "srt/use.py": """
        from sglang.srt.utils.check import is_hopper_with_cuda_12_3

        def pick():
            return "fa3" if is_hopper_with_cuda_12_3() else "triton"
        """})
    check = next(g for g in gates_in(scan, "srt/utils/check.py") if g["function"] == "_check")
    assert check["condition"]["args"][0]["atom"]["any_of"] == [8, 9]
    judged = {g["id"]: g for g in judge(scan, "12.0", "13.0").gates}
    assert judged[check["id"]]["status"] == "blocked"
    assert judged[check["id"]]["admits"] == ["sm80", "sm86", "sm89", "sm90"]
    hopper = next(g for g in gates_in(scan, "srt/utils/check.py") if g["text"] == "_check(9)")
    assert judged[hopper["id"]]["status"] == "blocked"
    # On a Hopper GPU the two callers disagree: undecided, never a guess.
    assert next(g for g in judge(scan, "9.0", "12.4").gates if g["id"] == check["id"])["status"] == "unknown"


def test_a_lambda_predicate_nothing_uses_decides_nothing(tmp_path):
    # Issue 43, fix 14: `is_ampere_with_cuda_12_3 = lambda: _check(8)` that no code in the tree names
    # again is never run: open ("never reached"); its sibling that a module calls stays a loss.
    scan = scan_files(tmp_path, {
        "srt/utils/check.py": """
            import torch


            def _check(cc_major):
                return torch.cuda.get_device_capability()[0] == cc_major


            is_ampere_with_cuda_12_3 = lambda: _check(8)
            is_hopper_with_cuda_12_3 = lambda: _check(9)
            """,
        "srt/use.py": """
            from sglang.srt.utils.check import is_hopper_with_cuda_12_3

            def pick():
                return "fa3" if is_hopper_with_cuda_12_3() else "triton"
            """})
    by_text = {g["text"]: g for g in gates_in(scan, "srt/utils/check.py")}
    assert by_text["_check(8)"]["unused"] == "is_ampere_with_cuda_12_3"
    assert "unused" not in by_text["_check(9)"]
    judged = {g["id"]: g for g in judge(scan, "12.0", "13.0").gates}
    assert judged[by_text["_check(8)"]["id"]]["status"] == "open"
    assert "nothing in the tree uses `is_ampere_with_cuda_12_3`" in judged[by_text["_check(8)"]["id"]]["reason"]
    assert judged[by_text["_check(9)"]["id"]]["status"] == "blocked"


def test_a_short_parameter_holder_counts_only_files_naming_it_as_a_word(tmp_path):
    # Issue 43, fix 14: more than 80 files hold `_check` inside other names (`_check_shape`,
    # `access_check`); only files naming `_check` itself make it too common a name to prove.
    files = {f"srt/pad/m{i}.py": f"def _check_shape_{i}(x):\n    return x\n" for i in range(90)}
    files["srt/utils/check.py"] = """
        import torch


        def _check(cc_major):
            return torch.cuda.get_device_capability()[0] == cc_major


        is_hopper_with_cuda_12_3 = lambda: _check(9)
        """
    files["srt/use.py"] = """
        from sglang.srt.utils.check import is_hopper_with_cuda_12_3

        def pick():
            return "fa3" if is_hopper_with_cuda_12_3() else "triton"
        """
    scan = scan_files(tmp_path, files)
    check = next(g for g in gates_in(scan, "srt/utils/check.py") if g["function"] == "_check")
    assert check["condition"]["atom"]["value"] == 9
    judged = next(g for g in judge(scan, "12.0", "13.0").gates if g["id"] == check["id"])
    assert judged["status"] == "blocked" and judged["admits"] == ["sm90"]
