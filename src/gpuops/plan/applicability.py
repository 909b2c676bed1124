"""Whether a gate_patch task has anything to do on a host, decided from its facts (pure).

A mixed fleet is the normal case: for FlashInfer's allreduce fusion (fusion-sm120), an H100 (sm90)
or B200 (sm100) already runs it, an sm80 box cannot run it at all, a newer release may already
admit sm120, and a release may not have the fusion code. On those hosts the role reports ok,
changed=0 and the reason, in --check and for real, and touches nothing. Which feature is judged
comes from the task (its catalog entry); where the entry says the patched feature needs
peer-to-peer (``patch: needs_p2p``: the fused kernel exchanges data through CUDA IPC buffers), a TP
group with a pair lacking P2P is refused unless the operator says otherwise.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from gpuops.errors import GpuopsError
from gpuops.gates.catalog import Feature
from gpuops.gates.fits import p2p_gaps
from gpuops.gates.scan import GateScan
from gpuops.gates.evaluate import feature_gates, judge
from gpuops.gates.fits import tp_group as group_of
from gpuops.gates.kernels import KernelStatus, judge_feature
from gpuops.gates.logic import parse_capability
from gpuops.plan.model import GpuSummary, summary_count, summary_flag, summary_mapping, summary_pairs, summary_text
from gpuops.remote.sglang_argv import first_of, parse_flags
from gpuops.frozen import frozen



@frozen
class Decision:
    """Whether a gate_patch task has anything to do on a host, and if not, why (the role then reports ok with
    that reason and touches nothing)."""

    applies: bool
    reason: str = ""
    other_gpu: str | None = None  # the host's GPU generation ("sm90") when it is not the target


def _sm(capability: str) -> str:
    major, _, minor = capability.partition(".")
    return f"sm{major}{minor or '0'}"


def _capability(target_sm: str) -> str:
    cc = parse_capability(target_sm)
    if cc is None:
        raise GpuopsError(f"target_sm {target_sm!r} is not a GPU generation (write e.g. sm120)")
    return f"{cc[0]}.{cc[1]}"


def has_feature_code(scan: GateScan, feature: Feature) -> bool:
    return any(fg.role == "runtime" for fg in feature_gates(scan, feature))


def decide_for_gpu(scan: GateScan, gpu: GpuSummary | None, target_sm: str, feature: Feature,
                   role: str) -> Decision:
    """Before any patch is planned: no code of the feature, or GPUs that are not the target."""
    release = f"sglang {scan.version or '(version unknown)'}"
    if scan.known and not scan.errors and not has_feature_code(scan, feature):
        return Decision(False, f"{release} has no {feature.title} code (no runtime gate of the "
                               "feature found): there is nothing to open")
    wanted = _capability(target_sm)
    have = summary_text(gpu, "compute_capability")
    if not have or have == wanted:
        return Decision(True)

    judged = judge(scan, have, summary_text(gpu, "cuda") or "13.0").features.get(feature.name, {})
    status = judged.get("status")
    sm = _sm(have)
    if status == "open":
        return Decision(False, f"this host's GPUs are {sm}, where {release} already runs {feature.title} "
                               f"({judged.get('reason')}); {role} only opens it for {_sm(wanted)}", sm)
    return Decision(False, f"this host's GPUs are {sm}: {role} only opens {feature.title} for {_sm(wanted)} "
                           f"(here the feature is {status or 'unknown'}: {judged.get('reason') or 'no reason given'})",
                    sm)


def tp_group(launch_args: Sequence[object], env: Mapping[str, object], gpu_count: int | None) -> tuple[list[int], str]:
    """The GPU indices of the TP group (first ``--tp`` visible GPUs: ``fits.tp_group``) and how it was found."""

    text = first_of(parse_flags([str(a) for a in launch_args or ()])[0], "tp_size")
    tp = int(text) if isinstance(text, str) and text.isdigit() else None
    devices = group_of(str((env or {}).get("CUDA_VISIBLE_DEVICES") or ""), gpu_count, tp)
    if tp is None:
        return devices, f"all {len(devices)} GPUs (no --tp in sglang_args)"
    return devices, f"TP {tp}"


def p2p_refusal(gpu: GpuSummary | None, launch_args: Sequence[object], env: Mapping[str, object],
                allow: bool, needs_p2p: str, switch: str) -> tuple[str | None, str | None]:
    """(error, warning): an error when the TP group lacks P2P and ``allow`` is false;
    ``needs_p2p`` says why the feature needs it (the catalog's ``patch: needs_p2p``), ``switch``
    is the variable that allows it anyway (``fusion_allow_without_p2p``)."""
    if summary_flag(gpu, "p2p_all_pairs") is not False:
        return None, None
    group, how = tp_group(launch_args, env, summary_count(gpu, "gpu_count"))
    gaps = p2p_gaps(summary_pairs(gpu), group)
    if not gaps:
        return None, None
    shown = ", ".join(gaps[:4]) + (f", ... ({len(gaps)} pairs)" if len(gaps) > 4 else "")
    why = f"peer-to-peer is not possible between {len(gaps)} GPU pair(s) of the TP group ({how}): {shown}; {needs_p2p}"
    if allow:
        return None, why + f" (going ahead: {switch} is true)"
    return why + f"; refused: keep TP within a P2P group, or pass -e {switch}=true to patch anyway", None


def kernel_refusal(gpu: GpuSummary | None, feature: Feature, target_sm: str, allow: bool,
                   switch: str) -> tuple[str | None, str | None]:
    """(error, warning): an error when the library that runs the patched feature's kernel cannot
    build it for ``target_sm`` on this host (the catalog's ``kernels:`` needs, judged from the
    host's installed tree by gates/kernels.py) and ``allow`` is false: widening SGLang's gate
    would only move the failure to the server's start-up (FlashInfer 0.6.1 on sm120: "No supported
    CUDA architectures found for major versions [9, 10]" at CUDA-graph capture, then a rollback).
    A need that cannot be told (the package's files are not on the host) is a warning."""

    versions = summary_mapping(gpu, "kernel_versions") or {}
    verdicts = judge_feature(feature, summary_mapping(gpu, "kernel_reads"),
                             {k: v if isinstance(v, str) else None for k, v in versions.items()}, _capability(target_sm))
    blocked = [v for v in verdicts if v.status is KernelStatus.BLOCKED]
    unknown = [v for v in verdicts if v.status is KernelStatus.UNKNOWN]
    if blocked:
        why = "; ".join(v.reason for v in blocked)
        if allow:
            return None, f"{why} (going ahead: {switch} is true; the server will likely fail to start and be rolled back)"
        needed = ", ".join(f"{_DISTRIBUTION[v.need.provider]} {v.first} or later" for v in blocked if v.first)
        fix = f"install {needed}" if needed else "install a build that has it"
        return (f"{why}; widening SGLang's gate would only make the server fail at start-up; refused: {fix}, "
                f"or pass -e {switch}=true to patch anyway"), None
    if unknown:
        return None, "kernel library: " + "; ".join(v.reason for v in unknown)
    return None, None


_DISTRIBUTION = {"flashinfer": "flashinfer-python", "sglang": "sglang", "sgl_kernel": "sgl-kernel"}
