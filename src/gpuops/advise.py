"""`gpuops advise`: for one host, the ranked ways to cut its all-reduce cost, each with its
evidence and the exact command, and why the others do not apply (pure: inspect's JSON of the
host and the results it has stored in, a document out; schema in docs/advise-json.md).

The ways known: SGLang's PCIe IPC all-reduce (role ``pcie-allreduce``; where it fits is
``pcie_ipc.fit``) and FlashInfer's all-reduce + RMSNorm fusion on SM120 (role ``fusion-sm120``,
judged by the gate audit and the kernel library's own reads: ``features`` of ``inspect host
--json``). Evidence is measured on this host when ``gpuops bench`` stored an all-reduce result for
it, else the published figure with its source, marked ``published``; an estimate per forward pass
says what it multiplies.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import field
from typing import Any, Mapping, Sequence

from gpuops import pcie_ipc
from gpuops.bench.record import ResultDocument, at, mapping, objects
from gpuops.gates.in_effect import server_tp_size
from gpuops.gates.fits import switch_text
from gpuops.facts.python_select import GPUOPS_PYTHON_MISSING
from gpuops.frozen import frozen

SCHEMA = 1

# Measured by gpuops on real GPUs, kept in the repo (README "Two GPUs, NVLink"): 2x H200 (SM90)
# over NVLink, TP 2, hidden 7168 bf16, one token in a CUDA graph.
FUSION_MEASURED = ("benchmarks/results/h200-x2/ (2x H200 over NVLink, TP 2; not this host's hardware)",
                   5.13, 10.64)   # fused us, NCCL all-reduce then add+RMSNorm us


class Status(enum.Enum):
    APPLY = "apply"            # fits now: the command applies it
    UPGRADE = "upgrade"        # fits after the named upgrade
    IN_EFFECT = "in_effect"    # already runs
    NOT_FOR_HOST = "not_for_host"
    AVAILABLE = "available"    # runs on this host, not switched on: the launch flag says how
    UNKNOWN = "unknown"        # whether it runs here cannot be told (the reason says what is missing)


# The other all-reduce paths SGLang picks by itself (no gpuops role: said, with why, not ranked),
# and the other gated features that matter for a model, each with why it matters.
OTHER_ALLREDUCE = ("custom_allreduce", "torch_symm_mem", "mnnvl_allreduce")
MODEL_FEATURES = {
    "fa3": "an attention backend: every forward pass runs it",
    "trtllm_attention": "an attention backend (trtllm_mla for MLA models such as DeepSeek V3 / Kimi K2, trtllm_mha "
                        "otherwise): every forward pass runs it",
    "deepgemm": "FP8 GEMM and MoE kernels: they run for FP8 (block-quantized) weights",
    "cutlass_fp8": "FP8 GEMM and MoE kernels: they run for FP8 (block-quantized) weights",
}


@frozen
class Evidence:
    """What backs a way's saving: a figure measured on this host (a stored profile or bench result) or
    elsewhere, or a published one, with its source, and the saving per forward pass the ranking uses."""

    basis: str                 # "measured" (this host: gpuops profile or bench) | "published" | "measured elsewhere"
    text: str
    source: str
    saving_ms_per_pass: float | None = None   # the estimate the ranking uses
    profile_id: str | None = None             # the stored profile the saving is computed from
    fallback: bool = False                    # published figures standing in for a profile of this host


@frozen
class ProfiledAllreduce:
    """This host's all-reduce cost per forward pass, as a stored ``gpuops profile`` measured it."""

    result_id: str
    stage: str                 # the release's forward-mode name (DECODE, TARGET_VERIFY)
    calls: float               # all-reduce calls per pass
    ms: float                  # their time per pass
    share: float | None        # of the pass's wall time
    kind: str | None           # NCCL RING_LL, SGLang custom all-reduce, ...
    simulated: bool            # from the lab's stand-in

    @property
    def label(self) -> str:
        return f"gpuops profile {self.result_id}" + (" (SIMULATED by the lab's stand-in)" if self.simulated else "")


@frozen
class Way:
    """One way to cut the host's all-reduce cost (or another gated feature that matters for its model): where it
    stands on this host, why, the commands that apply it, and the evidence for its benefit."""

    feature: str
    title: str
    status: Status
    why: str
    commands: tuple[str, ...] = ()
    evidence: Evidence | None = None

    def to_json(self) -> dict[str, Any]:
        ev = self.evidence
        return {"feature": self.feature, "title": self.title, "status": self.status.value, "why": self.why,
                "commands": list(self.commands),
                "evidence": None if ev is None else {"basis": ev.basis, "text": ev.text, "source": ev.source,
                                                     "saving_ms_per_pass": ev.saving_ms_per_pass,
                                                     "profile_id": ev.profile_id, "fallback": ev.fallback}}


@frozen
class HostAdvice:
    """``gpuops advise``'s answer for one host: the ways to cut its all-reduce cost, best first, the others with
    why they do not apply, and how many all-reduces a forward pass makes."""

    host: str
    ranked: tuple[Way, ...]          # what to do, best first
    others: tuple[Way, ...] = ()     # in effect already, or not for this host (with why)
    allreduces_per_pass: int | None = None
    allreduces_from: str = ""
    notes: tuple[str, ...] = field(default=())
    features: tuple[Way, ...] = ()   # the other gated features that matter for the model

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "error": None, "allreduces_per_pass": self.allreduces_per_pass,
                "allreduces_from": self.allreduces_from, "ranked": [w.to_json() for w in self.ranked],
                "others": [w.to_json() for w in self.others], "features": [w.to_json() for w in self.features],
                "notes": list(self.notes)}

    def next_commands(self) -> dict[str, str]:
        """Each feature's first command (inspect shows it beside the feature's line)."""
        return {w.feature: w.commands[0] for w in (*self.ranked, *self.others, *self.features) if w.commands}


def _allreduces(model: Mapping[str, Any], server: Mapping[str, Any]) -> tuple[int | None, str]:
    tp, tp_from = server_tp_size(server) if server.get("running") else (None, "")
    if tp == 1:
        return 0, (f"TP 1 ({tp_from}): a TP group of one GPU all-reduces nothing (SGLang's all_reduce returns its "
                   "input at world size 1: srt/distributed/parallel_state.py)")
    layers = model.get("num_hidden_layers") if isinstance(model, Mapping) else None
    if isinstance(layers, int) and layers > 0:
        return 2 * layers, f"2 x num_hidden_layers ({layers}) of the served model's config.json"
    return None, "the served model's config.json was not read"


def _launch_args(server: Mapping[str, Any]) -> list[str]:
    argv = [str(a) for a in server.get("argv") or []]
    if "sglang.launch_server" in argv:
        return argv[argv.index("sglang.launch_server") + 1:]
    return argv


def stack_of(facts: Mapping[str, Any], features: Mapping[str, Any]) -> pcie_ipc.HostStack:
    """``pcie_ipc.HostStack`` from inspect's JSON of a host."""
    software = facts.get("software") or {}
    server = facts.get("server") or {}
    model = facts.get("model") or {}
    reads = software.get("kernels")
    return pcie_ipc.HostStack(
        sglang=(software.get("sglang") or {}).get("version"), flashinfer=(software.get("flashinfer") or {}).get("version"),
        nvlink=(facts.get("interconnect") or {}).get("nvlink"), gpu_count=facts.get("gpu_count"),
        launch_args=_launch_args(server), launch_env={str(k): str(v) for k, v in (server.get("env") or {}).items()},
        model_dtype=model.get("torch_dtype"), p2p_failed_pairs=(facts.get("interconnect") or {}).get("p2p_failed_pairs") or [],
        kernel_reads=reads if isinstance(reads, Mapping) else None)


def measured_nccl(results: Sequence[ResultDocument]) -> tuple[float, float, str] | None:
    """(per call us, per pass ms, result id) of NCCL's smallest message in the newest all-reduce
    result stored for the host, or None."""
    for result in results:
        summary = result.get("summary") or {}
        tokens = summary.get("ranked_at_tokens")
        for variant in summary.get("variants") or []:
            kernel = variant.get("kernel") or ("pcie_ipc" if "PCIe IPC" in str(variant.get("label")) else "nccl")
            if not variant.get("ok") or kernel != "nccl":
                continue
            key = str(tokens)
            latency, step = (variant.get("latency_us") or {}).get(key), mapping(variant.get("step_cost_ms")).get(key)
            if latency is not None and isinstance(step, (int, float, str)):
                return float(latency), float(step), str(result.get("id"))
    return None


def profiled_allreduce(result: ResultDocument | None) -> ProfiledAllreduce | None:
    """The all-reduce figures of a stored profile result: its verify pass (speculative decoding,
    the field's case) else its decode pass; None when it has neither with all-reduces."""
    if not result:
        return None
    stages = mapping((result.get("summary") or {}).get("stages"))
    for name in ("TARGET_VERIFY", "DECODE"):
        stage = mapping(stages.get(name))
        figures = mapping(at(stage, "groups", "allreduce"))
        calls, ms = figures.get("calls_per_forward"), figures.get("ms_per_forward")
        if isinstance(calls, (int, float)) and isinstance(ms, (int, float)) and calls > 0:
            kinds = [c.get("kind") for c in objects(stage.get("collectives")) if c.get("group") == "allreduce"]
            share = figures.get("share")
            return ProfiledAllreduce(str(result.get("id")), name, float(calls), float(ms),
                                     float(share) if isinstance(share, (int, float)) else None,
                                     str(kinds[0]) if kinds else None,
                                     bool((result.get("server") or {}).get("simulated")))
    return None


def _stage_word(stage: str) -> str:
    return {"TARGET_VERIFY": "verify", "DECODE": "decode"}.get(stage, stage.lower())


def _profiled_pcie(profiled: ProfiledAllreduce, published_us: float) -> Evidence:
    count = round(profiled.calls)
    saving = round(profiled.ms - count * published_us / 1000.0, 2)
    share = f" ({profiled.share * 100:.0f}% of the pass)" if profiled.share is not None else ""
    text = (f"measured on this host by {profiled.label}: {profiled.calls:g} all-reduce calls per "
            f"{_stage_word(profiled.stage)} pass, {profiled.ms:.2f} ms{share}"
            + (f", {profiled.kind}" if profiled.kind else "")
            + f"; the PCIe IPC kernel's {published_us} us per 12 KiB call is published ({pcie_ipc.PUBLISHED_SOURCE}): "
              f"about {saving} ms saved per pass (from the measured profile)")
    return Evidence("measured", text, f"results store: profile {profiled.result_id}", saving,
                    profile_id=profiled.result_id)


def _pcie_way(stack: pcie_ipc.HostStack, server: Mapping[str, Any], count: int | None,
              measured: tuple[float, float, str] | None, profiled: ProfiledAllreduce | None = None) -> Way:
    title = "SGLang's PCIe IPC all-reduce (FlashInfer pcie_ipc_comm)"
    decision = pcie_ipc.fit(stack)
    published_us, published_nccl_us = pcie_ipc.PUBLISHED_PER_CALL_US["12 KiB"]
    nccl_tpot, pcie_tpot = pcie_ipc.PUBLISHED_TPOT_MS
    text = (f"{published_us} us vs NCCL's {published_nccl_us} us for a 12 KiB all-reduce; TPOT {nccl_tpot} -> "
            f"{pcie_tpot} ms at TP 8 on 8x SM120")
    saving = None
    if count:
        saving = round(count * (published_nccl_us - published_us) / 1000.0, 2)
        text += f"; x {count} all-reduces per forward pass: about {saving} ms saved per pass (estimate)"
    text += "; published figures, the fallback: no stored profile of this host (gpuops profile)"
    evidence = Evidence("published", text, pcie_ipc.PUBLISHED_SOURCE, saving, fallback=True)
    if profiled is not None:
        evidence = _profiled_pcie(profiled, published_us)
    elif measured is not None and count:
        per_call, per_pass, result_id = measured
        saving = round(per_pass - count * published_us / 1000.0, 2)
        evidence = Evidence("measured", f"NCCL measured on this host: {per_call:.1f} us per call, {per_pass:.2f} ms "
                                        f"per forward pass (gpuops bench allreduce, result {result_id}); the PCIe IPC "
                                        f"kernel's {published_us} us per 12 KiB call is published ({pcie_ipc.PUBLISHED_SOURCE}): "
                                        f"about {saving} ms saved per pass (estimate)", f"results store: {result_id}", saving)
    env = server.get("env") or {}
    switched_on = str(env.get(pcie_ipc.ENABLE_ENV, "")).strip() in ("1", "true", "True")
    if switched_on and (decision.applies or decision.misfit is pcie_ipc.Misfit.NO_P2P):
        return Way("pcie_ipc_allreduce", title, Status.IN_EFFECT,
                   f"the server runs with {pcie_ipc.ENABLE_ENV}=1 ({decision.reason})", (), evidence)
    if decision.applies:
        return Way("pcie_ipc_allreduce", title, Status.APPLY, decision.reason, ("gpuops apply pcie-allreduce",), evidence)
    if decision.misfit is pcie_ipc.Misfit.NO_P2P:
        # As for the fusion: the way is still this one, on a TP group within a P2P group, or told to go ahead.
        return Way("pcie_ipc_allreduce", title, Status.APPLY, decision.reason,
                   ("gpuops apply pcie-allreduce -e pcie_allow_without_p2p=true",), evidence)
    if decision.upgrade is not None and decision.misfit in (pcie_ipc.Misfit.SGLANG_TOO_OLD, pcie_ipc.Misfit.FLASHINFER_LACKS):
        release, flashinfer = decision.upgrade
        # After the upgrade the host's files are the new release's: judged by its versions.
        after = pcie_ipc.fit(dataclasses.replace(stack, sglang=release, flashinfer=flashinfer, kernel_reads=None))
        if after.applies or after.misfit is pcie_ipc.Misfit.NO_P2P:
            why = decision.reason
            apply = "gpuops apply pcie-allreduce"
            if after.misfit is pcie_ipc.Misfit.NO_P2P:
                why += f"; then: {after.reason}"
                apply += " -e pcie_allow_without_p2p=true"
            return Way("pcie_ipc_allreduce", title, Status.UPGRADE, why,
                       (f"gpuops apply sglang-release -e sglang_version={release}", apply), evidence)
        return Way("pcie_ipc_allreduce", title, Status.NOT_FOR_HOST, f"{decision.reason}; and after it: {after.reason}")
    return Way("pcie_ipc_allreduce", title, Status.NOT_FOR_HOST, decision.reason)


def _fusion_way(facts: Mapping[str, Any], features: Mapping[str, Any], count: int | None,
                profiled: ProfiledAllreduce | None = None) -> Way:
    title = "FlashInfer all-reduce + RMSNorm fusion (fusion-sm120)"
    verdict = features.get("flashinfer_allreduce_fusion") or {}
    fused_us, unfused_us = FUSION_MEASURED[1], FUSION_MEASURED[2]
    saving = round(count * (unfused_us - fused_us) / 1000.0, 2) if count else None
    evidence = Evidence("measured elsewhere", f"{fused_us} us fused vs {unfused_us} us all-reduce then add+RMSNorm per "
                        "call at 1 token in a CUDA graph" + (f"; x {count}: about {saving} ms per pass (estimate, other "
                                                              "hardware)" if saving else ""), FUSION_MEASURED[0], saving)
    if profiled is not None:
        # this host's all-reduce time per pass, cut by the fused kernel's measured ratio (other hardware)
        saving = round(profiled.ms * (1.0 - fused_us / unfused_us), 2)
        evidence = Evidence("measured", f"measured on this host by {profiled.label}: {profiled.ms:.2f} ms of all-reduce "
                            f"per {_stage_word(profiled.stage)} pass; the fused kernel took {fused_us} us where the "
                            f"all-reduce then add+RMSNorm took {unfused_us} us ({FUSION_MEASURED[0]}): about {saving} ms "
                            "saved per pass (from the measured profile)", f"results store: profile {profiled.result_id}",
                            saving, profile_id=profiled.result_id)
    sm = facts.get("sm")
    if verdict.get("in_effect") is True:
        return Way("flashinfer_allreduce_fusion", title, Status.IN_EFFECT, verdict.get("in_effect_reason") or "in effect")
    if sm != "sm120":
        why = f"fusion-sm120 opens the fusion for sm120; this host's GPUs are {sm or 'unknown'}"
        if verdict.get("status") == "open":
            why += " (where SGLang runs it already: launch with its flag)"
        return Way("flashinfer_allreduce_fusion", title, Status.NOT_FOR_HOST, why)
    blocked = [k for k in verdict.get("kernels") or [] if k.get("status") == "blocked"
               or (not k.get("read") and "lacks" in str(k.get("reason")))]
    if blocked:
        need = blocked[0]
        first = need.get("first")
        why = (f"fusion-sm120 needs a newer FlashInfer: {need.get('reason')}")
        commands = (f"gpuops apply sglang-release -e sglang_version={pcie_ipc.RECOMMENDED_SGLANG}",
                    "gpuops apply fusion-sm120") if first else ()
        if first:
            why += (f"; sglang {pcie_ipc.RECOMMENDED_SGLANG} pins flashinfer {pcie_ipc.RECOMMENDED_FLASHINFER} "
                    f"({first}+ builds it for sm120)")
        return Way("flashinfer_allreduce_fusion", title, Status.UPGRADE, why, commands, evidence)
    if (facts.get("interconnect") or {}).get("p2p_all_pairs") is False:
        return Way("flashinfer_allreduce_fusion", title, Status.APPLY,
                   f"{verdict.get('reason') or 'SGLang closes it on sm120'}; GPU pairs lack peer-to-peer (the fused "
                   "kernel's IPC buffers need it): refused unless told", ("gpuops apply fusion-sm120 -e "
                                                                          "fusion_allow_without_p2p=true",), evidence)
    return Way("flashinfer_allreduce_fusion", title, Status.APPLY, verdict.get("reason") or "SGLang closes it on sm120",
               ("gpuops apply fusion-sm120",), evidence)


def _feature_way(name: str, verdict: Mapping[str, Any], matters: str = "") -> Way:
    """A catalog feature as inspect judged it on this host (SGLang's gates, the kernel library's
    builds, the host's shape), with that verdict as its evidence: its reason carries the file:line
    of each gate, need and fit that decided it."""
    from gpuops.gates.catalog import load_catalog

    feature = next((f for f in load_catalog().features if f.name == name), None)
    title = feature.title if feature is not None else name
    reason = str(verdict.get("reason") or "not judged on this host")
    status_text = str(verdict.get("status") or "unknown")
    cited = [str(k.get("file")) + (f":{k['line']}" if k.get("line") else "") for k in verdict.get("kernels") or []
             if isinstance(k, Mapping) and k.get("file")]
    cited += [str(f.get("where")) for f in verdict.get("fits") or [] if isinstance(f, Mapping) and f.get("where")]
    source = "gpuops inspect host: " + ("; ".join(cited) if cited else "the release's gates (file:line in the text)")
    evidence = Evidence("gate audit", f"{status_text}: {reason}", source)
    why = f"{matters}; " if matters else ""
    if verdict.get("in_effect") is True:
        return Way(name, title, Status.IN_EFFECT, why + str(verdict.get("in_effect_reason") or "in effect"), (), evidence)
    if status_text == "blocked":
        return Way(name, title, Status.NOT_FOR_HOST, why + reason, (), evidence)
    if status_text == "open":
        how = ""
        if feature is not None:
            how = switch_text(feature)
        said = str(verdict.get("in_effect_reason") or "")
        return Way(name, title, Status.AVAILABLE, why + f"open on this host ({how})" + (f"; {said}" if said else ""),
                   (), evidence)
    return Way(name, title, Status.UNKNOWN, why + reason, (), evidence)


def _only_on_a_verdict(way: Way, features: Mapping[str, Any]) -> Way:
    """"apply now" only where inspect judged the feature on this host: with its verdict unknown (no
    python 3.8+ on the host to read SGLang's gates, a layout gpuops does not know) what the role would
    open cannot be told, and the way says so instead (it was ranked "apply now" beside lines that
    said they could not tell)."""
    verdict = features.get(way.feature)
    if way.status is not Status.APPLY or not isinstance(verdict, Mapping) or verdict.get("status") in ("blocked", "open"):
        return way
    return dataclasses.replace(way, status=Status.UNKNOWN, commands=(),
                               why=str(verdict.get("reason") or "inspect could not judge it on this host"))


def advise_host(host: str, document: Mapping[str, Any], results: Sequence[ResultDocument] = (),
                profile: ResultDocument | None = None) -> HostAdvice:
    """``document``: the host's entry of ``inspect host --json``; ``results``: its stored
    all-reduce results, newest first; ``profile``: a stored ``gpuops profile`` result of the host,
    whose measured all-reduce cost per pass comes before every other figure."""
    facts = document.get("facts") or {}
    features = document.get("features") or {}
    server = facts.get("server") or {}
    count, count_from = _allreduces(facts.get("model") or {}, server)
    profiled = profiled_allreduce(profile)
    if profiled is not None and count != 0:
        count = round(profiled.calls)
        count_from = (f"measured: {profiled.calls:g} all-reduce calls per {_stage_word(profiled.stage)} pass, "
                      f"{profiled.ms:.2f} ms, by {profiled.label}")
    ways = [_only_on_a_verdict(way, features) for way in (
        _pcie_way(stack_of(facts, features), server, count, measured_nccl(results), profiled),
        _fusion_way(facts, features, count, profiled))]
    if count == 0:
        # No all-reduce runs, so no way of making one cheaper applies, whatever the host could run.
        ways = [dataclasses.replace(w, status=Status.NOT_FOR_HOST, why=count_from, commands=()) for w in ways]
    actionable = [w for w in ways if w.status in (Status.APPLY, Status.UPGRADE)]
    # Biggest estimated saving first; a way that applies now before one that needs an upgrade.
    actionable.sort(key=lambda w: (-(w.evidence.saving_ms_per_pass or 0.0) if w.evidence else 0.0,
                                   w.status is Status.UPGRADE))
    others = [w for w in ways if w not in actionable]
    paths = [_feature_way(name, features[name]) for name in OTHER_ALLREDUCE if isinstance(features.get(name), Mapping)]
    if count == 0:
        paths = [dataclasses.replace(w, status=Status.NOT_FOR_HOST, why=count_from) for w in paths]
    others += paths
    model_features = tuple(_feature_way(name, features[name], matters) for name, matters in MODEL_FEATURES.items()
                           if isinstance(features.get(name), Mapping))
    # The commands advised run apply's helpers with gpuops_python: one that is not on the host is said.
    notes = [str(w) for w in facts.get("warnings") or [] if GPUOPS_PYTHON_MISSING in str(w)]
    if (facts.get("interconnect") or {}).get("nvlink") and count != 0:
        notes.append("NVLink host: SGLang's custom all-reduce already serves the TP group over NVLink")
    return HostAdvice(host, tuple(actionable), tuple(others), count, count_from, tuple(notes), model_features)


def render(advice: HostAdvice) -> list[str]:
    """The text form, one host."""
    lines = []
    if advice.allreduces_per_pass is not None:
        lines.append(f"all-reduces per forward pass: {advice.allreduces_per_pass} ({advice.allreduces_from})")
    if not advice.ranked:
        lines.append("nothing to apply for the all-reduce on this host")
    for rank, way in enumerate(advice.ranked, 1):
        lines.append(f"{rank}. {way.title}: {'apply now' if way.status is Status.APPLY else 'after an upgrade'}")
        lines.append(f"   why: {way.why}")
        if way.evidence is not None:
            lines.append(f"   evidence ({way.evidence.basis}): {way.evidence.text} [{way.evidence.source}]")
        for command in way.commands:
            lines.append(f"   $ {command}")
    for way in advice.others:
        lines.append(f"-  {way.title}: {_LABELS[way.status]}: {way.why}")
    if advice.features:
        lines.append("other gated features for this model:")
    for way in advice.features:
        lines.append(f"-  {way.title}: {_LABELS[way.status]}: {way.why}")
        if way.evidence is not None:
            lines.append(f"   evidence ({way.evidence.basis}): {way.evidence.source}")
    lines.extend(f"note: {n}" for n in advice.notes)
    return lines


_LABELS = {Status.IN_EFFECT: "in effect", Status.NOT_FOR_HOST: "does not apply", Status.AVAILABLE: "available",
           Status.UNKNOWN: "cannot tell", Status.APPLY: "apply now", Status.UPGRADE: "after an upgrade"}
