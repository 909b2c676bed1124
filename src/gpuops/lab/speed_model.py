"""The stand-in server's speed model: documented figures (``speed_model.json``) -> a predicted rate.

Standard library only, Python 3.8+: the lab copies this file and its data next to
``standin_server.py`` on every lab host, and the stand-in imports it from there; gpuops imports
it as ``gpuops.lab.speed_model`` (``gpuops lab`` shows which shape a host gets). One copy of the
arithmetic serves both sides.

The arithmetic (``speed_model.json``'s ``formula`` says the same)::

    step_ms      = compute_ms + allreduces_per_step x allreduce_us / 1000
    allreduce_us = shape's cost of one all-reduce at that step's size x (tp-1)/(calibrated_tp-1)
                   x fusion factor (FlashInfer allreduce+RMSNorm fusion on; a measured per-step
                     fusion_decode_factor / fusion_verify_factor wins over fusion_allreduce_factor)
                   x NCCL factors
    plain decode : tokens/s = 1000 / decode step_ms
    speculative  : tokens/s = accept_length x 1000 / (num_steps x draft_ms + verify step_ms)
    NGRAM        : tokens/s = accept_length x 1000 / (ngram_draft_ms + verify step_ms)   (no draft model:
                   one lookup in a token trie per cycle; accept length from ngram_accept_p over
                   num_draft_tokens - 1 drafted tokens; both assumptions of the lab)

Figures a shape lacks are derived from its own published figures where a rule exists (below), or
borrowed from the shape named by ``figures_from``, in which case they count as assumptions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speed_model.json")
SCHEMA = "gpuops.lab.speed_model/1"
EVIDENCE = ("published", "measured")  # bases that rest on something outside this file

# The figures a prediction needs, in the order they are shown.
NEEDED = ("calibrated_tp", "allreduces_per_step", "decode_compute_ms", "decode_allreduce_us",
          "verify_compute_ms", "verify_allreduce_us", "draft_ms_per_step", "accept_p",
          "fusion_allreduce_factor")


class SpeedModelError(ValueError):
    """The data file is missing, malformed, or cannot give a figure a prediction needs."""


@dataclass(frozen=True)
class Figure:
    name: str
    value: Any
    unit: str
    basis: str  # published | measured | derived | assumption
    source: str  # a key of the file's "sources" ("derived": the shape's name)
    note: str = ""
    inputs: Tuple[str, ...] = ()  # derived: the figures it is computed from
    on_assumption: bool = False  # derived: at least one input is an assumption

    def as_record(self) -> Dict[str, Any]:
        record = {"name": self.name, "value": self.value, "unit": self.unit, "basis": self.basis,
                  "source": self.source}
        if self.note:
            record["note"] = self.note
        if self.inputs:
            record["inputs"] = list(self.inputs)
            record["on_assumption"] = self.on_assumption
        return record


@dataclass(frozen=True)
class Settings:
    """What of the server's launch and environment the model reads."""

    tp: int = 1
    fusion: bool = False
    speculative: bool = False
    num_steps: int = 3
    num_draft_tokens: int = 4
    nccl_proto: str = ""
    p2p_disable: bool = False
    pcie_ipc: bool = False  # SGLang's PCIe IPC all-reduce runs (the stand-in decides as pcie_ipc_ar.py does)
    num_layers: Optional[int] = None  # from the served model's config.json, when readable
    drafter: str = ""  # the speculative algorithm as launched (EAGLE3, NGRAM, ...): which figures apply


@dataclass(frozen=True)
class Step:
    kind: str  # decode | draft | verify
    compute_ms: float
    allreduces: int
    allreduce_us: float  # one all-reduce, after tp scaling, fusion and NCCL factors

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.allreduces * self.allreduce_us / 1000.0


@dataclass(frozen=True)
class Prediction:
    model: str
    version: int
    shape: str
    basis: str  # the shape's: calibrated | assumption
    shape_reason: str
    tokens_per_s: float
    accept_length: float
    cycle_ms: float
    steps: Tuple[Step, ...]
    figures: Tuple[Figure, ...] = field(default=())
    allreduce_count_from: str = ""

    @property
    def label(self) -> str:
        return model_label(self.shape, self.version)

    def as_record(self) -> Dict[str, Any]:
        """What the stand-in reports in /get_server_info and results keep (``server.speed_model``)."""
        return {
            "name": self.model, "version": self.version, "shape": self.shape, "label": self.label,
            "basis": self.basis, "shape_reason": self.shape_reason,
            "predicted_tokens_per_s": round(self.tokens_per_s, 3),
            "accept_length": round(self.accept_length, 4), "cycle_ms": round(self.cycle_ms, 4),
            "steps": [{"kind": s.kind, "compute_ms": round(s.compute_ms, 4), "allreduces": s.allreduces,
                       "allreduce_us": round(s.allreduce_us, 3), "total_ms": round(s.total_ms, 4)}
                      for s in self.steps],
            "allreduce_count_from": self.allreduce_count_from,
            "figures": [f.as_record() for f in self.figures],
            "data": "gpuops/lab/speed_model.json",
        }


def model_label(shape: str, version: Any) -> str:
    return "%s v%s" % (shape, version)


def accept_length(p: float, num_steps: int, num_draft_tokens: int) -> float:
    """1 + p + ... + p^num_steps, never more than the draft tokens verified."""
    return min(sum(p ** k for k in range(num_steps + 1)), float(num_draft_tokens))


def solve_accept_p(target: float, num_steps: int) -> float:
    """The p for which 1 + p + ... + p^num_steps equals ``target`` (bisection; 1 <= target < n+1)."""
    if not 1.0 <= target < num_steps + 1:
        raise SpeedModelError("accept length %.3f is not reachable with %d draft steps" % (target, num_steps))
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid ** k for k in range(num_steps + 1)) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


class SpeedModel(object):
    """The loaded data file: shapes, their figures (resolved) and predictions."""

    def __init__(self, data: Mapping[str, Any], where: str = DATA_FILE) -> None:
        if data.get("schema") != SCHEMA:
            raise SpeedModelError("%s: schema is %r, not %r" % (where, data.get("schema"), SCHEMA))
        self.where = where
        self.name = str(data["name"])
        self.version = data["version"]
        self.sources = dict(data.get("sources") or {})
        self.shapes = dict(data.get("shapes") or {})
        self.common = dict(data.get("common") or {})
        self.default_shape = str(data.get("default_shape") or "")
        self.predictions = list(data.get("predictions") or [])
        self.measurements = list(data.get("measurements") or [])
        if self.default_shape not in self.shapes:
            raise SpeedModelError("%s: default_shape %r is not a shape" % (where, self.default_shape))
        self._resolved = {}  # type: Dict[str, Dict[str, Figure]]

    # ---- which shape a host is

    def shape_for(self, gpu_doc: Optional[Mapping[str, Any]]) -> Tuple[str, str]:
        """(shape name, why) for a lab host's GPU description (the replayer's ``gpu.json``)."""
        if not gpu_doc or not gpu_doc.get("gpus"):
            return self.default_shape, "no GPU description: the default shape"
        gpus = gpu_doc["gpus"]
        count = len(gpus)
        cc = str(gpus[0].get("compute_cap") or "")
        nvlink = any(links for links in gpu_doc.get("nvlink") or [])
        for name, shape in self.shapes.items():
            match = shape.get("match") or {}
            if "compute_capability" in match and str(match["compute_capability"]) != cc:
                continue
            if "nvlink" in match and bool(match["nvlink"]) != nvlink:
                continue
            if count < int(match.get("min_gpus", 0)) or count > int(match.get("max_gpus", 1 << 30)):
                continue
            return name, "%d GPU(s), compute capability %s, %s" % (count, cc or "?", "NVLink" if nvlink else "no NVLink")
        return self.default_shape, "no shape matches: the default shape"

    def shape_basis(self, shape: str) -> str:
        return str(self._shape(shape).get("basis") or "assumption")

    def _shape(self, name: str) -> Mapping[str, Any]:
        try:
            return self.shapes[name]
        except KeyError:
            raise SpeedModelError("%s: no shape %r" % (self.where, name))

    # ---- figures

    def figures(self, shape: str) -> Dict[str, Figure]:
        """Every figure of ``shape``: its own, derived from its own, or borrowed (as assumptions)."""
        if shape in self._resolved:
            return self._resolved[shape]
        spec = self._shape(shape)
        own = {}  # type: Dict[str, Figure]
        for name, raw in (spec.get("figures") or {}).items():
            own[name] = Figure(name=name, value=raw["value"], unit=str(raw.get("unit", "")),
                               basis=str(raw["basis"]), source=str(raw.get("source", "")),
                               note=" ".join(str(raw[k]) for k in ("note", "quote", "file") if raw.get(k)))
        _derive(own, shape)
        donor = spec.get("figures_from")
        if donor:
            if donor == shape:
                raise SpeedModelError("%s: shape %r borrows from itself" % (self.where, shape))
            for name, figure in self.figures(donor).items():
                if name not in own:
                    own[name] = Figure(name=name, value=figure.value, unit=figure.unit, basis="assumption",
                                       source=figure.source,
                                       note="borrowed from %s (%s there): no figure of this shape" % (donor, figure.basis),
                                       inputs=figure.inputs, on_assumption=figure.on_assumption)
        missing = [n for n in NEEDED if n not in own]
        if missing:
            raise SpeedModelError("%s: shape %r lacks %s" % (self.where, shape, ", ".join(missing)))
        self._resolved[shape] = own
        return own

    def common_value(self, name: str) -> Any:
        return (self.common.get(name) or {}).get("value")

    # ---- predictions

    def predict(self, shape: str, settings: Settings, reason: str = "") -> Prediction:
        f = self.figures(shape)
        calibrated_tp = int(f["calibrated_tp"].value)
        tp = max(1, int(settings.tp))
        if tp == 1:
            allreduces, scale = 0, 0.0  # SGLang's all_reduce returns at once at world size 1
        else:
            allreduces = 2 * settings.num_layers if settings.num_layers else int(f["allreduces_per_step"].value)
            scale = (tp - 1) / float(max(1, calibrated_tp - 1))
        scale *= float((self.common_value("nccl_proto_factor") or {}).get(settings.nccl_proto, 1.0))
        if settings.p2p_disable:
            scale *= float(self.common_value("p2p_disable_factor") or 1.0)
        pcie_used = []  # type: List[str]
        if settings.pcie_ipc and tp > 1 and "pcie_ipc_factor" in f:
            scale *= float(f["pcie_ipc_factor"].value)
            pcie_used = ["pcie_ipc_factor"]
        used = [] if tp == 1 else ["calibrated_tp"] + ([] if settings.num_layers else ["allreduces_per_step"]) + pcie_used
        ngram = settings.speculative and settings.drafter == "NGRAM"
        if settings.speculative:
            used += ["verify_compute_ms"] + ([] if tp == 1 else ["verify_allreduce_us"]) + (
                ["ngram_draft_ms", "ngram_accept_p"] if ngram else ["draft_ms_per_step", "accept_p"])
        else:
            used += ["decode_compute_ms"] + ([] if tp == 1 else ["decode_allreduce_us"])
        if tp == 1:
            count_from = "tp 1: SGLang runs no all-reduce"
        elif settings.num_layers:
            count_from = "2 x num_hidden_layers (%d) of the served model's config.json" % settings.num_layers
        else:
            count_from = "the shape's allreduces_per_step"

        def fusion(kind: str) -> float:
            # A factor measured for this step's message size wins over the shape's general one.
            if not settings.fusion or tp == 1:
                return 1.0
            name = "fusion_%s_factor" % kind if "fusion_%s_factor" % kind in f else "fusion_allreduce_factor"
            used.append(name)
            return float(f[name].value)

        if settings.speculative:
            if ngram:  # SGLang's NGRAM drafts from a trie of the tokens seen: no draft model on the GPU
                accept = accept_length(float(f["ngram_accept_p"].value), max(1, settings.num_draft_tokens - 1),
                                       settings.num_draft_tokens)
                draft = Step("draft", float(f["ngram_draft_ms"].value), 0, 0.0)
            else:
                accept = accept_length(float(f["accept_p"].value), settings.num_steps, settings.num_draft_tokens)
                draft = Step("draft", settings.num_steps * float(f["draft_ms_per_step"].value), 0, 0.0)
            verify = Step("verify", float(f["verify_compute_ms"].value), allreduces,
                          float(f["verify_allreduce_us"].value) * scale * fusion("verify"))
            steps: tuple[Step, ...] = (draft, verify)
        else:
            accept = 1.0
            steps = (Step("decode", float(f["decode_compute_ms"].value), allreduces,
                          float(f["decode_allreduce_us"].value) * scale * fusion("decode")),)
        cycle_ms = sum(s.total_ms for s in steps)
        return Prediction(model=self.name, version=self.version, shape=shape, basis=self.shape_basis(shape),
                          shape_reason=reason, tokens_per_s=accept * 1000.0 / cycle_ms, accept_length=accept,
                          cycle_ms=cycle_ms, steps=steps, figures=_with_inputs(f, used),
                          allreduce_count_from=count_from)


def _with_inputs(figures: Mapping[str, Figure], names: List[str]) -> Tuple[Figure, ...]:
    """The named figures and, after each derived one, the figures it was computed from (so a
    prediction's record traces every number back to a published, measured or assumed one)."""
    out = []  # type: List[Figure]
    seen = set()

    def add(name: str) -> None:
        if name in seen or name not in figures:
            return
        seen.add(name)
        out.append(figures[name])
        for source in figures[name].inputs:
            add(source)

    for name in names:
        add(name)
    return tuple(out)


def _derive(own: Dict[str, Figure], shape: str) -> None:
    """Fill in the figures a shape's own published ones determine (each rule is in the file's formula)."""

    def value(name: str) -> float:
        return float(own[name].value)

    def put(name: str, result: float, unit: str, inputs: Tuple[str, ...], note: str) -> None:
        if name in own or not all(i in own for i in inputs):
            return
        weak = any(own[i].basis == "assumption" or own[i].on_assumption for i in inputs)
        own[name] = Figure(name=name, value=result, unit=unit, basis="derived", source=shape, note=note,
                           inputs=inputs, on_assumption=weak)

    def have(*names: str) -> bool:
        return all(n in own for n in names)

    if have("verify_ms", "verify_allreduce_ms"):
        put("verify_compute_ms", value("verify_ms") - value("verify_allreduce_ms"), "ms",
            ("verify_ms", "verify_allreduce_ms"), "verify_ms - verify_allreduce_ms")
    if have("verify_allreduce_ms", "allreduces_per_step"):
        put("verify_allreduce_us", value("verify_allreduce_ms") * 1000.0 / value("allreduces_per_step"),
            "us per all-reduce", ("verify_allreduce_ms", "allreduces_per_step"),
            "verify_allreduce_ms / allreduces_per_step")
    if have("decode_tokens_per_s", "decode_compute_ms", "allreduces_per_step"):
        put("decode_allreduce_us",
            (1000.0 / value("decode_tokens_per_s") - value("decode_compute_ms")) * 1000.0 / value("allreduces_per_step"),
            "us per all-reduce", ("decode_tokens_per_s", "decode_compute_ms", "allreduces_per_step"),
            "(1000 / decode_tokens_per_s - decode_compute_ms) / allreduces_per_step")
    if have("pcie_ipc_12kib_us", "nccl_12kib_us"):
        put("pcie_ipc_factor", value("pcie_ipc_12kib_us") / value("nccl_12kib_us"), "x all-reduce time",
            ("pcie_ipc_12kib_us", "nccl_12kib_us"),
            "pcie_ipc_12kib_us / nccl_12kib_us: FlashInfer's PCIe IPC all-reduce against NCCL at 12 KiB")
    for kind in ("decode", "verify"):
        fused, unfused = "fused_%s_us" % kind, "unfused_%s_us" % kind
        if have(fused, unfused):
            put("fusion_%s_factor" % kind, value(fused) / value(unfused), "x all-reduce time", (fused, unfused),
                "%s / %s: the fused all-reduce+RMSNorm against all-reduce then RMSNorm" % (fused, unfused))
    if have("verify_ms", "verify_share_of_cycle", "eagle3_num_steps"):
        cycle = value("verify_ms") / value("verify_share_of_cycle")
        put("draft_ms_per_step", (cycle - value("verify_ms")) / value("eagle3_num_steps"), "ms",
            ("verify_ms", "verify_share_of_cycle", "eagle3_num_steps"),
            "(verify_ms / verify_share_of_cycle - verify_ms) / eagle3_num_steps")
        if have("eagle3_tokens_per_s"):
            target = value("eagle3_tokens_per_s") * cycle / 1000.0
            put("accept_p", solve_accept_p(target, int(value("eagle3_num_steps"))), "probability",
                ("eagle3_tokens_per_s", "verify_ms", "verify_share_of_cycle", "eagle3_num_steps"),
                "1 + p + ... + p^eagle3_num_steps = eagle3_tokens_per_s x cycle (%.3f tokens per cycle)" % target)


# --------------------------------------------------------------------------- inputs

def fusion_enabled(server_args: Mapping[str, Any]) -> bool:
    """FlashInfer allreduce+RMSNorm fusion asked for by its flag or an explicit backend."""
    if server_args.get("enable_flashinfer_allreduce_fusion") is True:
        return True
    backend = server_args.get("flashinfer_allreduce_fusion_backend")
    return isinstance(backend, str) and backend.lower() not in ("auto", "none", "disabled", "")


def _positive_int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


def settings_from_server(server_args: Mapping[str, Any], environ: Mapping[str, str],
                         num_layers: Optional[int] = None, pcie_ipc: bool = False) -> Settings:
    steps = _positive_int(server_args.get("speculative_num_steps"), 3)
    drafter = str(server_args.get("speculative_algorithm") or "").upper()
    # NGRAM's draft tokens default to 12 (0.5.8: speculative_ngram_max_match_window_size = 12;
    # 0.5.16's speculative_hook._handle_ngram: 12); the EAGLE family's to num_steps + 1
    default_tokens = 12 if drafter == "NGRAM" else steps + 1
    return Settings(
        tp=_positive_int(server_args.get("tp_size"), 1),
        fusion=fusion_enabled(server_args),
        speculative=bool(server_args.get("speculative_algorithm")),
        drafter=drafter,
        num_steps=steps,
        num_draft_tokens=_positive_int(server_args.get("speculative_num_draft_tokens"), default_tokens),
        nccl_proto=str(environ.get("NCCL_PROTO", "")),
        p2p_disable=environ.get("NCCL_P2P_DISABLE") == "1",
        pcie_ipc=pcie_ipc,
        num_layers=num_layers,
    )


def model_layers(model_path: Any) -> Optional[int]:
    """num_hidden_layers of the served model's config.json (the lab writes one), or None."""
    if not isinstance(model_path, str) or not model_path:
        return None
    try:
        with open(os.path.join(model_path, "config.json")) as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    layers = config.get("num_hidden_layers") if isinstance(config, dict) else None
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else None


def read_gpu_doc(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path:
        return None
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def load(path: str = DATA_FILE) -> SpeedModel:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except OSError as exc:
        raise SpeedModelError("%s: cannot read: %s" % (path, exc.strerror))
    except ValueError as exc:
        raise SpeedModelError("%s: not valid JSON: %s" % (path, exc))
    return SpeedModel(data, path)


def describe_shape(model: SpeedModel, shape: str) -> List[str]:
    """Lines for a person: the shape, its basis and every figure with where it comes from."""
    spec = model.shapes[shape]
    lines = ["%s (%s): %s" % (model_label(shape, model.version), model.shape_basis(shape), spec.get("description", "")),
             "  calibration: %s" % spec.get("calibration", "-")]
    for figure in model.figures(shape).values():
        basis = figure.basis + (" (on an assumption)" if figure.on_assumption else "")
        value = round(figure.value, 4) if isinstance(figure.value, float) else figure.value
        lines.append("  %-26s %-10s %-18s %-28s %s" % (figure.name, value, figure.unit, basis, figure.source))
    return lines
