"""Whether fusion-sm120 has anything to do on a host, decided from its facts (pure).

A mixed fleet is the normal case: an H100 (sm90) or B200 (sm100) already runs FlashInfer's
allreduce fusion, an sm80 box cannot run it at all, a newer release may already admit sm120, and
a release may not have the fusion code. On those hosts the role reports ok, changed=0 and the
reason, in --check and for real, and touches nothing. Where it does apply, the fused kernel
exchanges data through CUDA IPC buffers, which need peer-to-peer access between every pair of TP
ranks: a TP group with a pair lacking P2P is refused unless the operator says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gpuops.errors import GpuopsError

FEATURE = "flashinfer_allreduce_fusion"
_TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")


@dataclass(frozen=True)
class Decision:
    applies: bool
    reason: str = ""


def _sm(capability: str) -> str:
    major, _, minor = capability.partition(".")
    return f"sm{major}{minor or '0'}"


def _capability(target_sm: str) -> str:
    from gpuops.gates.logic import parse_capability

    cc = parse_capability(target_sm)
    if cc is None:
        raise GpuopsError(f"fusion_target_sm {target_sm!r} is not a GPU generation (write e.g. sm120)")
    return f"{cc[0]}.{cc[1]}"


def has_fusion_code(scan: Any) -> bool:
    from gpuops.gates.catalog import load_catalog
    from gpuops.gates.evaluate import feature_gates

    gates = feature_gates(scan, load_catalog().feature(FEATURE))
    return any(fg.role == "runtime" for fg in gates)


def decide_for_gpu(scan: Any, gpu: Mapping[str, Any] | None, target_sm: str) -> Decision:
    """Before any patch is planned: no fusion code, or GPUs that are not the target."""
    release = f"sglang {getattr(scan, 'version', None) or '(version unknown)'}"
    if getattr(scan, "known", False) and not getattr(scan, "errors", None) and not has_fusion_code(scan):
        return Decision(False, f"{release} has no FlashInfer allreduce-fusion code (no runtime gate of the "
                               "feature found): there is nothing to open")
    wanted = _capability(target_sm)
    have = (gpu or {}).get("compute_capability")
    if not have or have == wanted:
        return Decision(True)
    from gpuops.gates.evaluate import judge

    feature = judge(scan, have, (gpu or {}).get("cuda") or "13.0").features.get(FEATURE, {})
    status = feature.get("status")
    sm = _sm(have)
    if status == "open":
        return Decision(False, f"this host's GPUs are {sm}, where {release} already runs the fusion "
                               f"({feature.get('reason')}); fusion-sm120 only opens it for {_sm(wanted)}")
    return Decision(False, f"this host's GPUs are {sm}: fusion-sm120 only opens the fusion for {_sm(wanted)} "
                           f"(here the feature is {status or 'unknown'}: {feature.get('reason') or 'no reason given'}); "
                           f"set fusion_target_sm={sm} to try this GPU")


def tp_group(launch_args: Sequence[Any], env: Mapping[str, Any], gpu_count: int | None) -> tuple[list[int], str]:
    """The GPU indices of the TP group (first ``--tp`` visible GPUs) and how it was found."""
    words = [str(a) for a in launch_args or ()]
    tp: int | None = None
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in _TP_FLAGS:
            text = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if text.isdigit():
                tp = int(text)
    visible = str((env or {}).get("CUDA_VISIBLE_DEVICES") or "")
    devices = [int(d) for d in re.split(r"\s*,\s*", visible) if d.isdigit()] if visible else []
    if not devices:
        devices = list(range(gpu_count or 0))
    if tp is None:
        return devices, f"all {len(devices)} GPUs (no --tp in sglang_args)"
    return devices[:tp], f"TP {tp}"


def p2p_gaps(failed_pairs: Sequence[Sequence[str]], group: Sequence[int]) -> list[str]:
    """The pairs of ``group`` without peer-to-peer ("GPU0-GPU4 (CNS)")."""
    members = {f"GPU{i}" for i in group}
    return [f"{a}-{b} ({status})" for a, b, status in failed_pairs if a in members and b in members]


def p2p_refusal(gpu: Mapping[str, Any] | None, launch_args: Sequence[Any], env: Mapping[str, Any],
                allow: bool) -> tuple[str | None, str | None]:
    """(error, warning): an error when the TP group lacks P2P and ``allow`` is false."""
    gpu = gpu or {}
    if gpu.get("p2p_all_pairs") is not False:
        return None, None
    group, how = tp_group(launch_args, env, gpu.get("gpu_count"))
    gaps = p2p_gaps(gpu.get("p2p_failed_pairs") or [], group)
    if not gaps:
        return None, None
    shown = ", ".join(gaps[:4]) + (f", ... ({len(gaps)} pairs)" if len(gaps) > 4 else "")
    why = (f"peer-to-peer is not possible between {len(gaps)} GPU pair(s) of the TP group ({how}): {shown}; "
           "the fused all-reduce kernel exchanges data through CUDA IPC buffers, which need peer access "
           "between every pair of TP ranks, so it would fail or fall back at run time")
    if allow:
        return None, why + " (going ahead: fusion_allow_without_p2p is true)"
    return why + "; refused: keep TP within a P2P group, or pass -e fusion_allow_without_p2p=true to patch anyway", None
