"""What a plan reads of the host is typed no narrower than it is checked (issue 40): the GPU summary
(``apply/host_gather.gpu_summary``, kept between runs and read back) is ``GpuSummary``, a mapping of
objects that each planner reads through ``plan.model``'s ``summary_*`` readers. A summary gathered
from real probe answers reads back as it was written; a damaged one gives values of the declared
types, never the damage itself (a reader that passed a value on unchecked fails here)."""

from __future__ import annotations

import json

from facts_fixtures import RTX8, fixture_text, ok

from gpuops.apply.host_gather import gpu_summary
from gpuops.facts.container_python import is_container_facts, parse_container
from gpuops.facts.gpu import parse_banner, parse_query
from gpuops.facts.software import parse_python_packages
from gpuops.facts.topology import parse_p2p, parse_topo
from gpuops.plan.model import summary_count, summary_flag, summary_mapping, summary_pairs, summary_text

PACKAGES = {"python": {"executable": "/usr/bin/python3.12", "version": "3.12.3"},
            "packages": {"torch": {"version": "2.9.1", "cuda": "12.8", "source": "metadata"},
                         "flashinfer-python": {"version": "0.6.1", "source": "metadata"}},
            "kernels": {"flashinfer": {"archs": ["sm90", "sm100"]}}}


def _summary() -> dict[str, object]:
    return gpu_summary({
        "gpu.query": parse_query(ok(fixture_text(RTX8, "query.csv"))),
        "gpu.banner": parse_banner(ok("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |\n")),
        "gpu.topo": parse_topo(ok(fixture_text(RTX8, "topo.txt"))),
        "gpu.p2p": parse_p2p(ok(fixture_text(RTX8, "p2p.txt"))),
        "software.python": parse_python_packages(ok(json.dumps(PACKAGES))),
    })


def test_a_gathered_summary_reads_back_as_written() -> None:
    summary = json.loads(json.dumps(_summary()))  # as kept_facts keeps it and reads it back
    assert summary_text(summary, "compute_capability") == summary["compute_capability"] == "12.0"
    assert summary_text(summary, "cuda") == summary["cuda"] == "12.8"
    assert summary_count(summary, "gpu_count") == summary["gpu_count"] == 8
    assert summary_flag(summary, "nvlink") is summary["nvlink"]
    assert summary_flag(summary, "p2p_all_pairs") is summary["p2p_all_pairs"]
    assert summary_pairs(summary) == summary["p2p_failed_pairs"]
    assert summary_mapping(summary, "kernel_reads") == summary["kernel_reads"] == PACKAGES["kernels"]
    assert summary_mapping(summary, "kernel_versions") == summary["kernel_versions"]


def test_a_damaged_summary_gives_values_of_the_declared_types() -> None:
    damaged = {"compute_capability": 12.0, "cuda": ["12.8"], "gpu_count": True, "nvlink": "yes",
               "p2p_all_pairs": 0, "p2p_failed_pairs": [["GPU0", 1, None], "GPU2", 5], "kernel_reads": ["x"],
               "kernel_versions": "0.6.1"}
    assert summary_text(damaged, "compute_capability") is None and summary_text(damaged, "cuda") is None
    assert summary_count(damaged, "gpu_count") is None
    assert summary_flag(damaged, "nvlink") is None and summary_flag(damaged, "p2p_all_pairs") is None
    assert summary_pairs(damaged) == [["GPU0", "1", "None"]]
    assert summary_mapping(damaged, "kernel_reads") is None and summary_mapping(damaged, "kernel_versions") is None
    for read in (summary_text, summary_count, summary_flag, summary_mapping):
        assert read(None, "cuda") is None and read({}, "cuda") is None
    assert summary_pairs(None) == []


def test_only_a_container_answer_of_its_shape_reaches_the_plan() -> None:
    answer = parse_container(ok(json.dumps([{"Name": "/sglang", "Id": "c1", "Image": "sha256:ab",
                                             "Config": {"Image": "lmsysorg/sglang:v0.5.21"}, "State": {"Running": True}}])
                                + "\n" + json.dumps([{"Config": {"Labels": {"gpuops.patch": "x"}}}])))
    assert is_container_facts(answer) and answer is not None and answer["name"] == "sglang" and answer["running"]
    assert not is_container_facts({"name": "sglang", "running": "yes", "labels": {}})
    assert not is_container_facts(None) and not is_container_facts(["sglang"])
