"""What the host must be like for SGLang to run a feature, beyond its GPU generation (pure).

Some of SGLang's all-reduce paths are decided by the shape of the host and the launch, not by a
capability gate: the PCIe IPC all-reduce serves world sizes 2, 4 and 8, bf16 only, not with
deterministic inference, on PCIe-only hosts with peer-to-peer between the TP group's GPUs; the
custom all-reduce turns itself off on more than two PCIe-only GPUs ("not supported on more than
two PCIe-only GPUs"); torch symmetric-memory all-reduce has sizes only for the capability majors
its table lists. The catalog says so per feature (``fits:``, ``catalog.Fit``), with where the
release says it (``at:``); the software probe reads those lines (and the table's keys) from the
host's SGLang, and each fit is judged here against the host's facts.

A feature without GPU-generation gates (``gates: []``) is decided by its kernel needs and its fits
(``decide``), and whether it is in effect by its switch (flag or environment) in the running server.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from gpuops.gates.catalog import Feature, Fit
from gpuops.gates.in_effect import asks_for, lone_gpu, reported_state
from gpuops.gates.kernels import KernelStatus, KernelVerdict, close
from gpuops.gates import kernels
from gpuops.frozen import frozen


@frozen
class HostShape:
    """The facts fits are judged against (None: not known, e.g. no server runs)."""

    tp_size: int | None = None
    dtype: str | None = None           # the served model's dtype ("bfloat16")
    deterministic: bool | None = None  # --enable-deterministic-inference
    nvlink: bool | None = None         # any NVLink between the host's GPUs
    p2p_gaps: tuple[str, ...] | None = None  # pairs of the TP group without peer-to-peer
    capability: str | None = None
    server_args: Mapping[str, Any] | None = None  # the running server's flags (None: no server)
    server_env: Mapping[str, str] | None = None
    # What the running server reports about itself (inspect's ``server.reported``: route, resolved
    # settings, error); None where it reports nothing. Its word comes first for in_effect.
    server_report: Mapping[str, Any] | None = None
    weights: str | None = None         # how the served model's weights are stored (``weight_format``)


@frozen
class FitVerdict:
    """One fit of a feature judged against the host's shape: whether it holds (None: cannot tell), why, and
    where the release says so."""

    fit: Fit
    holds: bool | None
    reason: str
    where: str | None = None  # "sglang/srt/...:77" on the host

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.fit.kind, "holds": self.holds, "reason": self.reason, "where": self.where}


def _anchor(fit: Fit, kernels: Mapping[str, Any] | None) -> tuple[str | None, str | None, Any]:
    """(file:line, line text, dict entry) of the first ``at`` candidate found on the host."""
    package = (kernels or {}).get("sglang") if isinstance(kernels, Mapping) else None
    files = package.get("files") if isinstance(package, Mapping) else None
    if not isinstance(files, Mapping):
        return None, None, None
    for file, pattern in fit.at:
        entry = files.get(file)
        if not isinstance(entry, Mapping) or not entry.get("exists"):
            continue
        if fit.kind == "capability_major_in":
            dicts = entry.get("dicts")
            found = dicts.get(str(fit.value)) if isinstance(dicts, Mapping) else None
            if isinstance(found, list) and len(found) == 2 and isinstance(found[0], int):
                return f"sglang/{file}:{found[0]}", None, found[1]
            continue
        anchors = entry.get("anchors")
        hit = anchors.get(pattern) if isinstance(anchors, Mapping) else None
        if isinstance(hit, list) and len(hit) == 2 and isinstance(hit[0], int):
            return f"sglang/{file}:{hit[0]}", str(hit[1]), None
    return None, None, None


def _ints(text: str | None) -> list[int] | None:
    match = re.search(r"[\[(]([\d,\s]+)[\])]", text or "")
    if not match:
        return None
    values = [int(v) for v in re.findall(r"\d+", match.group(1))]
    return values or None


def _names(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _dtype(text: str | None) -> str | None:
    low = str(text or "").lower().removeprefix("torch.")
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}.get(low, low or None)


def weight_format(model_known: bool, quant_method: str | None, block: Sequence[int] | None,
                  quantization: str | None) -> str | None:
    """How the served model's weights are stored, as a ``weights`` fit reads it: ``fp8_block``
    (config.json's FP8 quantization with a ``weight_block_size``), the quant method's name (config.json's,
    else the server's ``--quantization``: online quantization, never block-wise), ``unquantized``
    (neither), or None when the model's config.json was not read."""
    if quant_method:
        return "fp8_block" if quant_method == "fp8" and block else quant_method
    if quantization:
        return quantization
    return "unquantized" if model_known else None


# Weight formats known not to be FP8 block-quantized; any other method (compressed-tensors...) may be.
_NOT_BLOCK_FP8 = ("unquantized", "fp8")
_WEIGHTS_SAID = {"fp8_block": "FP8 block-quantized", "fp8": "FP8 without weight blocks"}


def judge_fit(fit: Fit, shape: HostShape, kernels: Mapping[str, Any] | None) -> FitVerdict:
    where, text, keys = _anchor(fit, kernels)
    cite = f" ({where})" if where else ""
    if fit.kind == "tp_size":
        sizes = _ints(text) or [int(v) for v in fit.value]
        if shape.tp_size is None:
            return FitVerdict(fit, None, f"serves TP {_names(sizes)}{cite}; this host's TP is not known", where)
        ok = shape.tp_size in sizes
        return FitVerdict(fit, ok, f"TP {shape.tp_size} {'is' if ok else 'is not'} among the sizes it serves "
                                   f"({_names(sizes)}){cite}", where)
    if fit.kind == "tp_at_most_without_nvlink":
        limit = int(fit.value)
        if shape.tp_size is None or shape.nvlink is None:
            return FitVerdict(fit, None, f"off on more than {limit} PCIe-only GPUs{cite}; this host's TP or "
                                         "interconnect is not known", where)
        ok = shape.tp_size <= limit or shape.nvlink
        how = "NVLink" if shape.nvlink else "PCIe only"
        return FitVerdict(fit, ok, f"TP {shape.tp_size} over {how}: SGLang turns it off on more than {limit} "
                                   f"PCIe-only GPUs{cite}" if not ok else
                          f"TP {shape.tp_size} over {how}{cite}", where)
    if fit.kind == "dtype":
        wanted = [_dtype(v) for v in fit.value]
        if shape.dtype is None:
            return FitVerdict(fit, None, f"serves {_names(wanted)} models only{cite}; the served model's dtype is not known",
                              where)
        ok = _dtype(shape.dtype) in wanted
        return FitVerdict(fit, ok, f"the model is {_dtype(shape.dtype)}; it serves {_names(wanted)} only{cite}", where)
    if fit.kind == "deterministic":
        if shape.deterministic is None:
            return FitVerdict(fit, None, f"not with deterministic inference{cite}; no server to read its flags from",
                              where)
        ok = shape.deterministic is bool(fit.value)
        said = "runs with" if shape.deterministic else "runs without"
        return FitVerdict(fit, ok, f"the server {said} deterministic collectives (--enable-deterministic-inference, "
                                   "or SGLANG_USE_1STAGE_ALLREDUCE where set)"
                                   + ("" if ok else f"; deterministic inference turns it off{cite}"), where)
    if fit.kind == "interconnect":
        if shape.nvlink is None:
            return FitVerdict(fit, None, "for PCIe-only hosts; this host's interconnect is not known", where)
        ok = shape.nvlink is False
        return FitVerdict(fit, ok, "this host is PCIe-only" if ok else
                          "for PCIe-only hosts; NVLink all-reduce is already fast (this host has NVLink)", where)
    if fit.kind == "p2p":
        if shape.p2p_gaps is None:
            return FitVerdict(fit, None, "needs peer-to-peer between the TP group's GPUs; not known here", where)
        if shape.p2p_gaps:
            shown = ", ".join(shape.p2p_gaps[:4]) + (f", ... ({len(shape.p2p_gaps)} pairs)" if len(shape.p2p_gaps) > 4 else "")
            return FitVerdict(fit, False, f"needs peer-to-peer between the TP group's GPUs (CUDA IPC); "
                                          f"{len(shape.p2p_gaps)} pair(s) lack it: {shown}", where)
        return FitVerdict(fit, True, "peer-to-peer between every pair of the TP group's GPUs", where)
    if fit.kind == "capability_major_in":
        major = str(shape.capability or "").partition(".")[0]
        if keys is None:
            return FitVerdict(fit, None, f"cannot read {fit.value} in the release", where)
        if not major.isdigit():
            return FitVerdict(fit, None, f"sizes for capability majors {_names(keys)}{cite}; the GPU's is not known",
                              where)
        ok = int(major) in keys
        return FitVerdict(fit, ok, f"{fit.value} has sizes for capability majors {_names(keys)}{cite}"
                                   + ("" if ok else f"; none for {major}: SGLang falls back to NCCL"), where)
    if fit.kind == "weights":
        formats = [str(v) for v in fit.value]
        runs = _names([_WEIGHTS_SAID.get(v, v) for v in formats])
        weights = shape.weights
        if weights is None:
            return FitVerdict(fit, None, f"runs for {runs} weights{cite}; the served model's are not known", where)
        said = f"unquantized ({_dtype(shape.dtype) or 'dtype unknown'})" if weights == "unquantized" else \
            _WEIGHTS_SAID.get(weights, weights)
        if weights in formats:
            return FitVerdict(fit, True, f"the served model's weights are {said}{cite}", where)
        if weights in _NOT_BLOCK_FP8:
            return FitVerdict(fit, False, f"the served model's weights are {said}; SGLang runs it for {runs} weights "
                                          f"only{cite}", where)
        return FitVerdict(fit, None, f"runs for {runs} weights{cite}; whether {said} weights are is not known here",
                          where)
    return FitVerdict(fit, None, f"unknown fit {fit.kind}", where)


def judge_fits(feature: Feature, shape: HostShape, kernels: Mapping[str, Any] | None) -> list[FitVerdict]:
    return [judge_fit(fit, shape, kernels) for fit in feature.fits]


def decide(feature: Feature, verdict: Mapping[str, Any], needs: Sequence[KernelVerdict],
           fits: Sequence[FitVerdict], shape: HostShape) -> dict[str, Any]:
    """The verdict of a feature without GPU-generation gates: blocked by a need or a fit that fails,
    unknown while a need cannot be told, else open; in effect by its switch in the running server."""
    out = dict(verdict)
    out["kernels"] = [k.to_json() for k in needs]
    out["fits"] = [f.to_json() for f in fits]
    blocked = [k.reason for k in needs if k.status is KernelStatus.BLOCKED]
    failing = [f.reason for f in fits if f.holds is False]
    unknown = [k.reason for k in needs if k.status is KernelStatus.UNKNOWN]
    untold = [f.reason for f in fits if f.holds is None]
    if blocked or failing:
        out["status"] = "blocked"
        out["reason"] = "; ".join(blocked + ([f"does not fit this host: {'; '.join(failing)}"] if failing else []))
    elif unknown:
        out["status"] = "unknown"
        out["reason"] = "cannot tell: " + "; ".join(unknown)
    else:
        out["status"] = "open"
        parts = [k.reason for k in needs] + [f.reason for f in fits if f.holds]
        out["reason"] = "; ".join(parts) or "nothing on its path tests the GPU"
        if untold:
            out["reason"] += "; not known here: " + "; ".join(untold)
    out["reason"] += "; " + switch_text(feature)
    value, why = _in_effect(feature, out["status"], shape)
    out["in_effect"], out["in_effect_reason"] = _server_first(feature, out["status"], shape, value, why)
    lone = lone_gpu(feature, {"reported": shape.server_report, "tp_size": shape.tp_size}) \
        if shape.server_args is not None else None
    if lone is not None:
        out["in_effect"], out["in_effect_reason"] = False, f"{lone} (apart from that: {out['in_effect_reason']})"
    return out


def fold_fits(verdict: Mapping[str, Any], fits: Sequence[FitVerdict]) -> dict[str, Any]:
    """A gated feature's verdict with its fits (DeepGEMM's weights): a fit that fails closes it as a
    blocked kernel need does (``kernels.fold``), and it is not in effect whatever the server asks."""
    out = dict(verdict)
    out["fits"] = [f.to_json() for f in fits]
    failing = [f.reason for f in fits if f.holds is False]
    if not failing:
        return out
    said = f"does not fit this host: {'; '.join(failing)}"
    close(out, said, said)
    return out


def _server_first(feature: Feature, status: str, shape: HostShape, judged: bool | None,
                  why: str) -> tuple[bool | None, str]:
    """The server's resolved settings decide where it reports one of the feature's switches (e.g.
    ``disable_custom_all_reduce``), as for gated features (``in_effect.in_effect``); the judgement
    from its flags stays the answer otherwise, and is named beside the server's word."""
    if shape.server_args is None or not shape.server_report:
        return judged, why
    said, text = reported_state(feature, {"reported": shape.server_report})
    if said is None:
        return judged, why
    text = f"{text} in its resolved settings ({shape.server_report.get('route') or '/server_info'})"
    if said and status == "blocked":
        return False, f"{text}, but it does not run on this host (see the reason)"
    if judged is None:
        return said, f"{text} (gpuops' own judgement could not tell: {why})"
    if judged == said:
        return said, f"{text}; gpuops' own judgement agrees: {why}"
    return said, f"{text}, and the server's word is taken; gpuops' own judgement says {'on' if judged else 'off'}: {why}"


def switch_text(feature: Feature) -> str:
    """How a feature is switched, in words ("on by default (off with ...)", "off by default: launch with ...")."""
    inverse = [c.flag for c in feature.flags if c.inverse]
    switches = [c.flag for c in feature.flags if not c.inverse]
    env = " ".join(f"{k}={v}" for k, v in feature.env.items())
    if feature.default == "on":
        return "on by default" + (f" (off with {' or '.join(inverse)})" if inverse else "")
    what = " or ".join([*switches, *([env] if env else [])])
    return f"off by default: launch with {what}" if what else "off by default"


def _in_effect(feature: Feature, status: str, shape: HostShape) -> tuple[bool | None, str]:
    if shape.server_args is None:
        return None, "no running server to tell from"
    args = shape.server_args
    env = shape.server_env or {}
    asked = any(asks_for(c, args.get(c.setting)) for c in feature.flags if not c.inverse) or \
        (bool(feature.env) and all(env.get(k) == v for k, v in feature.env.items()))
    refused = any(asks_for(c, args.get(c.setting)) for c in feature.flags if c.inverse)
    on = (feature.default == "on" and not refused) or (feature.default != "on" and asked)
    if not on:
        return False, "the running server does not switch it on" if feature.default != "on" else \
            "the running server switches it off"
    if status == "blocked":
        return False, "the running server asks for it, but it does not run on this host (see the reason)"
    if status == "open":
        return True, "the running server switches it on and it fits this host" if feature.default != "on" else \
            "on by default, and it fits this host"
    return None, "the running server asks for it; whether it runs cannot be told"


def p2p_gaps(failed_pairs: Sequence[Sequence[str]], group: Sequence[int]) -> tuple[str, ...]:
    """The pairs of ``group`` without peer-to-peer ("GPU0-GPU4 (CNS)")."""
    members = {f"GPU{i}" for i in group}
    return tuple(f"{p[0]}-{p[1]} ({p[2] if len(p) > 2 else 'no P2P'})" for p in failed_pairs
                 if len(p) >= 2 and p[0] in members and p[1] in members)


def tp_group(visible: str | None, gpu_count: int | None, tp: int | None) -> list[int]:
    """The GPU indices of the TP group: the first ``tp`` of CUDA_VISIBLE_DEVICES (else of all the
    host's GPUs); all of them when ``tp`` is not known."""
    devices = [int(d) for d in str(visible or "").split(",") if d.strip().isdigit()] or list(range(gpu_count or 0))
    return devices[:tp] if tp is not None else devices


def deterministic_collectives(flags: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """SGLang's ``_deterministic_collectives_enabled`` (pcie_ipc_ar.py): ``SGLANG_USE_1STAGE_ALLREDUCE``
    when set, else ``--enable-deterministic-inference`` (which sets its own environment)."""
    if "SGLANG_USE_1STAGE_ALLREDUCE" in env:
        return str(env["SGLANG_USE_1STAGE_ALLREDUCE"]).strip().lower() in ("1", "true", "yes", "on")
    flag = flags.get("enable_deterministic_inference")
    return flag is True or (isinstance(flag, str) and flag.strip().lower() in ("1", "true", "yes", "on"))


def fold_stack(report: Any, catalog: Any, reads: Mapping[str, Any] | None, versions: Mapping[str, str | None],
               shape: HostShape) -> Any:
    """``report`` (an ``evaluate.GateReport``) with every feature's kernel needs and fits folded in
    (``kernels.fold``; ``decide`` for a feature without GPU-generation gates)."""
    import dataclasses

    features = {}
    for name, verdict in report.features.items():
        feature = next((f for f in catalog.features if f.name == name), None)
        if feature is None:
            features[name] = dict(verdict)
            continue
        needs = kernels.judge_feature(feature, reads, versions, shape.capability)
        if not report.known:
            features[name] = {**verdict, "kernels": [k.to_json() for k in needs]}
        elif not feature.rules:
            features[name] = decide(feature, verdict, needs, judge_fits(feature, shape, reads), shape)
        elif feature.fits:
            features[name] = fold_fits(kernels.fold(verdict, needs), judge_fits(feature, shape, reads))
        else:
            features[name] = kernels.fold(verdict, needs)
    return dataclasses.replace(report, features=features)
