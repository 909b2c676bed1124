"""Stack consistency (facts/software_stack.py): the installed SGLang's own pins against what is
installed, torch's CUDA against the driver's, FlashInfer missing while wanted."""

from __future__ import annotations

from gpuops.facts.software import PackageInfo, PythonPackages
from gpuops.facts.software_stack import flashinfer_wanted, parse_requirement, satisfies, stack_problems

PINS_058 = ("flashinfer_python==0.6.1", "sgl-kernel==0.3.21", "torch==2.9.1")
PINS_0514 = ("flashinfer_python[cu13]==0.6.12", "sglang-kernel==0.4.4", "torch==2.11.0")


def packages(sglang: str, requires: tuple[str, ...], **versions: str | None) -> PythonPackages:
    found = {"sglang": PackageInfo(sglang, "/site/sglang", "metadata", requires=requires)}
    for name, version in versions.items():
        dist = name.replace("_", "-")
        found[dist] = PackageInfo(version, f"/site/{name}", "metadata", cuda="12.8" if dist == "torch" else None) if version else None
    return PythonPackages(known=True, packages=found)


def test_parse_and_compare() -> None:
    assert parse_requirement("flashinfer_python[cu13]==0.6.12; sys_platform == 'linux'") == ("flashinfer-python", [("==", "0.6.12")])
    assert satisfies("2.9.1+cu128", "==", "2.9.1") and not satisfies("2.9.0", "==", "2.9.1")
    assert satisfies("0.0.10", ">=", "0.0.9.post1")


def test_consistent_stack_has_no_problem() -> None:
    pk = packages("0.5.8", PINS_058, flashinfer_python="0.6.1", sgl_kernel="0.3.21", torch="2.9.1+cu128")
    assert stack_problems(pk, "13.0") == []


def test_each_mismatch_is_reported() -> None:
    # The lab's old behaviour: 0.5.8's stack under sglang 0.5.14.
    pk = packages("0.5.14", PINS_0514, flashinfer_python="0.6.1", sgl_kernel="0.3.21", torch="2.9.1+cu128")
    problems = stack_problems(pk, "12.4")
    text = "\n".join(problems)
    assert "sglang 0.5.14 requires flashinfer-python==0.6.12; installed: 0.6.1" in text
    assert "requires sglang-kernel==0.4.4, but sgl-kernel 0.3.21 is installed instead" in text
    assert "requires torch==2.11.0; installed: 2.9.1+cu128" in text
    assert "torch is built for CUDA 12.8 but the driver supports CUDA 12.4 at most" in text
    assert len(problems) == 4


def test_flashinfer_missing_while_wanted() -> None:
    pk = packages("0.5.8", ("sgl-kernel==0.3.21",), sgl_kernel="0.3.21", torch="2.9.1+cu128")
    features = {"flashinfer_allreduce_fusion": {"status": "open", "in_effect": False}}
    wanted = flashinfer_wanted(features, {"attention_backend": "flashinfer"})
    problems = stack_problems(pk, "13.0", wanted)
    assert problems == ["flashinfer is not installed, but flashinfer_allreduce_fusion is open; the server is "
                        "launched with attention_backend=flashinfer: it cannot run"]
    assert stack_problems(pk, "13.0", flashinfer_wanted({"x": {"status": "blocked"}}, {"tp_size": 8})) == []
