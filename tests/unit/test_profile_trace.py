"""The host-side reading of SGLang's profiler traces (remote/trace_stream, profile_summary,
kernel_groups): real 0.5.16 traces recorded on the H200 against a reading of the same files by
another route (a whole json.load, the kernels picked per pass by hand); the collectives' kernel
names as the real libraries define them; and every bound: a trace too large, a gzip bomb, a gzip cut
short, a file that is not a trace, hostile kernel names, too many events."""

from __future__ import annotations

import gzip
import json
import re
import statistics
import subprocess
import zipfile
from pathlib import Path

import pytest

from gpuops.remote import kernel_groups, trace_stream
from gpuops.remote.profile_summary import clean, summarize_trace

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-x1" / "sglang-0.5.16" / "profile"
SPANNED = ("decode-cudagraph", "decode-nograph", "verify-ngram")


def _trace(folder: str, stage: str | None = None) -> Path:
    pattern = f"*-{stage}.trace.json.gz" if stage else "*-TP-0.trace.json.gz"
    (found,) = sorted((REAL / folder).glob(pattern))
    return found


def _independent(path: Path) -> dict[str, list[dict[str, float]]]:
    """Per stage, each pass's wall (ms), GEMM calls and GPU time (ms), read with a full json.load:
    a pass's kernels are those whose correlation a runtime call inside its span on its thread made."""
    events = json.load(gzip.open(path))["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step[")]
    calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out: dict[str, list[dict[str, float]]] = {}
    for span in spans:
        mode = span["name"][5:].split(" ")[0].rstrip("]")
        mine = {c["args"]["correlation"] for c in calls
                if c["tid"] == span["tid"] and span["ts"] <= c["ts"] <= span["ts"] + span["dur"]}
        kernels = [k for k in gpu if k.get("args", {}).get("correlation") in mine]
        if not kernels:
            continue
        wall = max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)
        out.setdefault(mode, []).append({"wall": wall / 1000.0, "gemm": sum(k["name"].startswith("nvjet") for k in kernels),
                                         "gpu_ms": sum(k["dur"] for k in kernels) / 1000.0})
    return out


@pytest.mark.parametrize("folder", SPANNED)
def test_real_traces_read_as_an_independent_reading_of_the_same_file(folder: str) -> None:
    path = _trace(folder)
    summary = summarize_trace(str(path), steps=8)
    expected = _independent(path)
    assert summary["step_spans"] == 8 and set(summary["stages"]) == set(expected)
    for mode, passes in expected.items():
        stage = summary["stages"][mode]
        assert stage["passes"] == len(passes)
        assert stage["wall_ms"]["median"] == pytest.approx(statistics.median(p["wall"] for p in passes), abs=1e-3)
        assert stage["groups"]["gemm"]["calls_per_forward"] == pytest.approx(statistics.mean(p["gemm"] for p in passes))
        total = sum(g["ms_per_forward"] for g in stage["groups"].values())
        assert total == pytest.approx(statistics.mean(p["gpu_ms"] for p in passes), abs=2e-3)


def test_a_launch_bound_pass_shows_as_gpu_idle() -> None:
    """The CUDA-graph question: without graphs the same decode pass waits on its launches."""
    graphs = summarize_trace(str(_trace("decode-cudagraph")))["stages"]["DECODE"]
    eager = summarize_trace(str(_trace("decode-nograph")))["stages"]["DECODE"]
    assert eager["busy_ms"]["median"] == pytest.approx(graphs["busy_ms"]["median"], rel=0.2)
    assert eager["idle_ms"]["median"] > 3 * graphs["idle_ms"]["median"]
    assert eager["wall_ms"]["median"] > 3 * graphs["wall_ms"]["median"]


def test_the_verify_pass_is_named_as_the_release_names_it() -> None:
    from gpuops.bench.suite_profile import lead_stage, sentence

    stages = summarize_trace(str(_trace("verify-ngram")))["stages"]
    assert set(stages) == {"EXTEND", "TARGET_VERIFY"} and lead_stage(stages, "verify") == "TARGET_VERIFY"
    assert stages["TARGET_VERIFY"]["groups"]["attention"]["calls_per_forward"] > 0  # SGLang's triton _fwd_kernel
    head = {"stage": "TARGET_VERIFY", "wall_ms": stages["TARGET_VERIFY"]["wall_ms"]["median"], "idle_ms": 0.5}
    assert sentence(head).startswith("verify pass ") and "no all-reduce" in sentence(head)


def test_a_by_stage_trace_without_spans_is_cut_into_the_steps_asked_for() -> None:
    """0.5.16 asked for GPU activity only writes no step spans: the -DECODE file holds num_steps (6)."""
    path = _trace("by-stage", "DECODE")
    summary = summarize_trace(str(path), steps=6)
    stage = summary["stages"]["DECODE"]
    assert summary["step_spans"] == 0 and stage["passes"] == 6 and "no step spans" in summary["passes_from"]
    gpu = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    total = sum(g["ms_per_forward"] for g in stage["groups"].values()) * 6
    assert total == pytest.approx(sum(e["dur"] for e in gpu) / 1000.0, abs=0.01)
    extend = summarize_trace(str(_trace("by-stage", "EXTEND")), steps=6)["stages"]["EXTEND"]
    assert extend["passes"] == 1  # as many as ran, which the file does not say


# --- the collectives' names, from the real libraries ---------------------------------------------

# NCCL's src/device/generate.py (NVIDIA/nccl 081eafa): ncclDevKernel_<coll>[_<redop>_<ty>]_<ALGO>_<PROTO>,
# the specialised ones Sum + RING|TREE + LL; SendRecv and Generic bare; NCCL <= 2.18's ncclKernel_ order.
NCCL = {
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("allreduce", "NCCL RING_LL"),
    "ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevKernelArgsStorage<4096ul>)": ("allreduce", "NCCL TREE_LL"),
    "ncclDevKernel_AllReduce_Sum_f16_NVLS_TREE_SIMPLE": ("allreduce", "NCCL NVLS_TREE_SIMPLE"),
    "ncclDevKernel_AllReduce_Sum_bf16_COLLNET_DIRECT_SIMPLE": ("allreduce", "NCCL COLLNET_DIRECT_SIMPLE"),
    "ncclKernel_AllReduce_RING_LL128_Sum_half(ncclWorkElem)": ("allreduce", "NCCL RING_LL128"),
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("collective", "NCCL RING_LL AllGather"),
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": ("collective", "NCCL RING_LL ReduceScatter"),
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": ("collective", "NCCL SendRecv"),
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": ("collective", "NCCL Generic"),
}


@pytest.mark.parametrize("name", sorted(NCCL))
def test_nccl_kernels_by_collective_algorithm_and_protocol(name: str) -> None:
    assert kernel_groups.classify(name) == NCCL[name]


def _wheel_header(version: str, member: str) -> str:
    """A header of the real FlashInfer wheel (the cache keeps the wheel beside its unpacked site)."""
    from gpuops.lab.sglang_cache import flashinfer_site

    (wheel,) = sorted((flashinfer_site(version).parent / "download").glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode()


@pytest.mark.parametrize("header, namespace, expected", [
    ("pcie_ipc_all_reduce.cuh", "flashinfer::comm::pcie_ipc", kernel_groups.PCIE_IPC_ALLREDUCE),
    ("trtllm_allreduce_fusion.cuh", "flashinfer::trtllm_allreduce_fusion", kernel_groups.FUSED_ALLREDUCE)])
def test_flashinfer_all_reduce_kernels_as_its_wheel_defines_them(header: str, namespace: str, expected: str) -> None:
    text = _wheel_header("0.7.1", f"flashinfer/data/include/flashinfer/comm/{header}")
    kernels = re.findall(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(", text)
    assert len(kernels) >= 2
    for kernel in kernels:  # as a trace shows it: demangled, with its template arguments
        assert kernel_groups.classify(f"void {namespace}::{kernel}<__nv_bfloat16>(args)") == ("allreduce", expected)


def test_sglang_custom_all_reduce_kernels_as_sgl_kernel_builds_them() -> None:
    from gpuops.lab.sglang_cache import sgl_kernel_site

    libraries = sorted((sgl_kernel_site("0.3.21") / "sgl_kernel" / "sm100").glob("common_ops*.so"))
    symbols = sorted(set(re.findall(rb"_ZN6sglang\d+cross_device_reduce_\w+", libraries[0].read_bytes())))
    demangled = subprocess.run(["c++filt"], input=b"\n".join(symbols), capture_output=True, check=True).stdout.decode()
    names = demangled.splitlines()
    assert len(names) >= 8 and all(n.startswith("void sglang::cross_device_reduce_") for n in names), names[:2]
    for name in names:
        assert kernel_groups.classify(name) == ("allreduce", kernel_groups.CUSTOM_ALLREDUCE)


def test_other_kernels_by_what_they_are() -> None:
    assert kernel_groups.classify("Memcpy DtoD (Device -> Device)", "gpu_memcpy") == ("memcpy", None)
    assert kernel_groups.classify("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(x)")[0] == "norm_activation"
    assert kernel_groups.classify("nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN")[0] == "gemm"
    assert kernel_groups.classify("_fwd_kernel_stage1")[0] == "attention"
    assert kernel_groups.classify("void moe_align_block_size_kernel<int>(x)")[0] == "moe"
    assert kernel_groups.classify("void at::native::reduce_kernel<512, 1, ArgMaxOps<float>>(x)")[0] == "sampling"
    assert kernel_groups.classify("store_kvcache")[0] == "other"


# --- bounds and hostile traces -------------------------------------------------------------------

def _write(path: Path, events: list, header: str = '{"schemaVersion": 1, "traceEvents": ') -> Path:
    with gzip.open(path, "wt") as handle:
        handle.write(header + json.dumps(events) + "}")
    return path


def _kernel(name: str, ts: float, correlation: int = 1) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 10.0,
            "args": {"correlation": correlation}}


def test_a_trace_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big-TP-0.trace.json.gz"
    with open(big, "wb") as handle:  # 300 MB, sparse: no disk, no time
        handle.truncate(300 << 20)
    with pytest.raises(trace_stream.TraceError, match="too large"):
        summarize_trace(str(big))


def test_a_trace_that_decompresses_past_the_limit_stops_there(tmp_path: Path) -> None:
    """300 MB of JSON in a small gzip: read in chunks, stopped at the decompressed bound."""
    bomb = tmp_path / "bomb-TP-0.trace.json.gz"
    one = json.dumps(_kernel("k", 1.0)) + ", "
    chunk = (one * ((1 << 20) // len(one) + 1)).encode()
    with gzip.open(bomb, "wb", compresslevel=1) as handle:
        handle.write(b'{"traceEvents": [')
        for _ in range((300 << 20) // len(chunk)):
            handle.write(chunk)
        handle.write(b"{}]}")
    with pytest.raises(trace_stream.TraceError, match="more than 8 MiB of JSON"):
        summarize_trace(str(bomb), limits={"json_limit": 8 << 20})
    with pytest.raises(trace_stream.TraceError, match="more than 1000 events"):
        summarize_trace(str(bomb), limits={"events": 1000})


def test_a_gzip_cut_short_is_one_line(tmp_path: Path) -> None:
    whole = _write(tmp_path / "a-TP-0.trace.json.gz", [_kernel("k", float(i)) for i in range(20000)])
    cut = tmp_path / "cut-TP-0.trace.json.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(trace_stream.TraceError, match="cut short") as caught:
        summarize_trace(str(cut))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "is not a Chrome trace"), ('{"schemaVersion": 1}', "no traceEvents"),
    ('{"traceEvents": [{"cat": "kernel"}, ', "cut short"), ('{"traceEvents": 7}', "expected '\\['")])
def test_a_file_that_is_not_a_trace_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "x-TP-0.trace.json"
    path.write_text(text)
    with pytest.raises(trace_stream.TraceError, match=why):
        summarize_trace(str(path))


def test_a_fifo_in_place_of_a_trace_is_never_opened_for_reading(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "f-TP-0.trace.json.gz"
    os.mkfifo(fifo)
    with pytest.raises(trace_stream.TraceError, match="not a regular file"):
        summarize_trace(str(fifo))


def test_hostile_kernel_names_travel_sanitised_and_bounded(tmp_path: Path) -> None:
    hostile = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL\x1b]52;c;cGF3bmVk\x07\x1b[2J" + "A" * 5000
    events = [{"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": 50.0},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0,
               "args": {"correlation": 1}},
              _kernel(hostile, 100.0), _kernel("gemm\u202eevil", 120.0),
              {"cat": "kernel", "name": ["not", "a", "name"], "ts": "soon"}, {"cat": 7}, "not an event"]
    summary = summarize_trace(str(_write(tmp_path / "h-TP-0.trace.json.gz", events)))
    names = [k["name"] for k in summary["stages"]["DECODE"]["top_kernels"]]
    assert all(n.isprintable() and len(n) <= 200 for n in names), names
    assert any(n.startswith("ncclDevKernel_AllReduce_Sum_bf16_RING_LL\\x1b]52") for n in names)
    assert summary["stages"]["DECODE"]["groups"]["allreduce"]["calls_per_forward"] == 1
    assert clean("a\x1bb\nc") == "a\\x1bb\\x0ac"
