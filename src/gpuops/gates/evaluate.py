"""Judge a gate scan against a host's facts: each gate ``open``/``blocked``/``unknown``, and each
catalog feature with the gates on its path. Pure: the scan, the facts and the catalog in, a
``GateReport`` out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Mapping, Sequence

from gpuops.gates.catalog import Catalog, Feature, GateRule, load_catalog
from gpuops.gates.context import NVIDIA_HOST, Placement, Placer
from gpuops.gates.in_effect import asks_for
from gpuops.gates.logic import (
    Evaluator,
    GpuTarget,
    PredicateBook,
    admits,
    cap_verdict,
    make_gpu,
    node_text,
    other_clauses,
)
from gpuops.gates.scan import GateScan
from gpuops.gates.skips import skipped_branch
from gpuops.remote.gate_tree import has_atoms
from gpuops.gates.in_effect import in_effect, platform_value, unreachable
from gpuops.gates.logic import normalise_args
from gpuops.frozen import frozen


@frozen
class FeatureGate:
    """A gate recognised as lying on a feature's path."""

    gate: Mapping[str, Any]
    feature: str
    role: str  # runtime | auto_enable | hardware | related
    why: str
    path: str | None = None  # the catalog rule's `path:` (one of the feature's kernel paths)


@frozen
class GateReport:
    """A gate scan judged for one host's GPU (``judge``): every gate with its status, and each catalog feature
    with the gates on its path; ``known`` False, with ``reason``, when there was no scan to judge."""

    gates: list[dict[str, Any]]
    features: dict[str, dict[str, Any]]
    version: str | None = None
    gpu: str | None = None
    known: bool = True
    reason: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"gates": self.gates, "features": self.features}

    def blocked_features(self) -> list[str]:
        return [name for name, f in self.features.items() if f["status"] == "blocked"]

    def counts(self) -> GateCounts:
        return GateCounts.of(self.gates)


@frozen
class GateCounts:
    """The judged gates by what they cost the GPU (inspect's count line; ``gate_counts`` in --json).
    Only ``blocked`` is a loss: a gate whose status is blocked but which this host never reaches
    is counted apart, and so are the open gates that skip a path for older or other GPUs."""

    total: int
    blocked: int  # the GPU loses something here (status blocked, reached on this host)
    not_reached: int  # status blocked, but never reached on this host (`unreachable`)
    open: int
    skips: int  # of the open: a branch for older or other GPUs the GPU skips, losing nothing (`skips`)
    unknown: int
    not_applicable: int

    @classmethod
    def of(cls, gates: Sequence[Mapping[str, Any]]) -> GateCounts:
        def count(status: str) -> int:
            return sum(1 for g in gates if g["status"] == status)
        unreached = sum(1 for g in gates if g["status"] == "blocked" and g.get("unreachable"))
        return cls(total=len(gates), blocked=count("blocked") - unreached, not_reached=unreached,
                   open=count("open"), skips=sum(1 for g in gates if g["status"] == "open" and g.get("skips")),
                   unknown=count("unknown"), not_applicable=count("not_applicable"))

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def feature_gates(scan: GateScan, feature: Feature) -> list[FeatureGate]:
    """The gates on ``feature``'s path (by the catalog's rules), plus the other gates of functions
    named after the feature as ``related``."""
    gates = [g for g in scan.gates if not not_on_cuda(g)]
    first = {id(g): feature.classify(g) for g in gates}
    runtime_files = frozenset(str(g["file"]) for g in gates if (r := first[id(g)]) and r.role == "runtime")
    found: list[FeatureGate] = []
    for gate in gates:
        rule = feature.classify(gate, runtime_files)
        if rule is not None:
            found.append(FeatureGate(gate, feature.name, rule.role, rule.why, rule.path))
        elif feature.names_feature(str(gate["function"]).split(".")[-1]):
            found.append(FeatureGate(gate, feature.name, "related",
                                     "another GPU test in a function of this feature; not judged into its status"))
    found.sort(key=lambda f: (str(f.gate["file"]), int(f.gate["line"])))
    return found


def not_on_cuda(gate: Mapping[str, Any]) -> bool:
    """A gate nested under a condition that is false on an NVIDIA host (``if _is_musa:``, ``if
    is_hip():``): not on the path of a CUDA GPU, so never judged into a feature's status."""
    within = gate.get("within") or ()
    if not within:
        return False

    return any(platform_value(str(text), NVIDIA_HOST) is False for text in within)


def launch_flag(feature: Feature, gates: list[FeatureGate], sources: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The flag that turns the feature on in this release, and its value (None for a switch):
    the first catalog flag whose setting the release's gates read or set."""
    mentioned: set[str] = set()
    for fg in gates:
        effect = fg.gate.get("effect") or {}
        mentioned |= set(fg.gate.get("reads") or ()) | set(effect.get("sets") or ())
    for choice in feature.flags:
        if choice.setting in mentioned:
            if not choice.values:
                return choice.flag, None
            texts = "\n".join((sources or {}).get(str(fg.gate["file"]), "") for fg in gates)
            if not texts.strip():  # no sources to check against: the catalog's first choice
                return choice.flag, choice.values[0]
            for value in choice.values:
                if f'"{value}"' in texts or f"'{value}'" in texts:
                    return choice.flag, value
            return choice.flag, choice.values[-1]
    return None, None


def judge(
    scan: GateScan,
    compute_capability: str | None,
    cuda_version: str | None,
    server: Mapping[str, Any] | None = None,
    catalog: Catalog | None = None,
    interconnect: Mapping[str, Any] | None = None,
) -> GateReport:
    """Every gate of ``scan`` judged for a GPU of ``compute_capability`` ("12.0") with CUDA
    ``cuda_version`` ("12.8"); ``server`` = {"args": {flag: value}, "architecture": str | None}
    decides the other clauses where it can; ``interconnect`` = {"nvlink": bool | None} words the
    texts of hardware (MNNVL) gates for this host."""
    catalog = catalog or load_catalog()
    gpu = make_gpu(compute_capability, cuda_version)
    gpu_name = gpu.sm if gpu else None
    if not scan.known:
        reason = scan.reason or "the gate scan did not run"
        features: dict[str, dict[str, Any]] = {f.name: {"status": "unknown", "gates": [], "flag": None, "reason": reason,
                             "in_effect": None, "in_effect_reason": reason} for f in catalog.features}
        return GateReport([], features, scan.version, gpu_name, known=False, reason=reason)
    if server is not None:
        server = {**server, "defaults": {**catalog.server_defaults, **dict(server.get("defaults") or {})}}
    book = PredicateBook(scan)
    by_feature = {f.name: feature_gates(scan, f) for f in catalog.features}
    roles: dict[str, FeatureGate] = {}
    for fgs in by_feature.values():
        for fg in fgs:
            roles.setdefault(str(fg.gate["id"]), fg)
    placer = Placer(scan.gates, book, gpu, server, interconnect) if gpu is not None else None
    gates = [_judge_gate(g, book, gpu, server, roles.get(str(g["id"])), interconnect,
                         placer.place(g) if placer is not None else Placement(),
                         placer.neighbours(g) if placer is not None else ())
             for g in scan.gates]
    by_id = {g["id"]: g for g in gates}
    features = {
        f.name: _judge_feature(f, by_feature[f.name], by_id, scan, gpu, server, book)
        for f in catalog.features
    }
    return GateReport(gates, features, scan.version, gpu_name, errors=[dict(e) for e in scan.errors])


def capability_line(gate: Mapping[str, Any]) -> int:
    """The line of the gate's first GPU test, not of its condition's first clause: in
    ``model in [...] and tp_size > 1 and (is_sm90_supported() or ...)`` spread over 13 lines, the
    line an operator must read is the capability test's."""
    node = gate.get("condition")
    while isinstance(node, dict):
        op = node.get("op")
        if op in ("cap", "alias"):
            span = node.get("span") or ()
            return int(span[0]) if span else int(gate["line"])
        if op == "not":
            node = node.get("arg")
        elif op in ("and", "or"):
            node = next((a for a in node.get("args") or () if isinstance(a, dict) and has_atoms(a, ("cap",))), None)
        else:
            break
    return int(gate["line"])


def _hardware_context(interconnect: Mapping[str, Any] | None) -> str:
    """What this host has, for gates that need a multi-node NVLink (MNNVL) fabric."""
    nvlink = (interconnect or {}).get("nvlink")
    if nvlink is True:
        return "this host's NVLink joins its own GPUs only, which is not a multi-node NVLink (MNNVL) fabric"
    if nvlink is False:
        return "this host is PCIe-only (no NVLink at all)"
    return ""


def _judge_gate(
    gate: Mapping[str, Any],
    book: PredicateBook,
    gpu: GpuTarget | None,
    server: Mapping[str, Any] | None,
    fg: FeatureGate | None,
    interconnect: Mapping[str, Any] | None = None,
    place: Placement | None = None,
    neighbours: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    place = place or Placement()
    allowed = admits(gate, book)
    verdict = cap_verdict(gate, book, gpu)
    if gpu is None:
        status, reason = "unknown", "the GPU's compute capability is not known"
    elif verdict.status == "blocked":
        status, reason = "blocked", f"admits {_names(allowed)}; this GPU is {gpu.sm}"
    elif verdict.status == "open":
        status, reason = "open", f"admits {gpu.sm}"
    else:
        status, reason = "unknown", "; ".join(verdict.unknowns) or "cannot tell"
    capability = status
    skip = None
    # A catalogued feature's gate is not read so (a branch the GPU skips there is the feature it does
    # not get), unless an earlier branch of its chain takes the GPU: the feature is decided there.
    if gpu is not None and capability == "blocked" and (fg is None or fg.role == "related" or place.taken_before):
        skip = skipped_branch(gate, book, gpu, place.alternative, neighbours, place.taken_before)
    if place.not_applicable:
        # Another platform's code (`if _is_hip:`): it neither admits nor stops an NVIDIA GPU.
        status, reason = "not_applicable", f"not this host's platform: {place.not_applicable}"
    elif place.uncalled and gpu is not None:
        # No caller passes what it compares: it decides nothing, for this GPU or any other.
        status, reason = "open", f"never reached: {place.uncalled}"
    elif place.outside and int(gate.get("polarity", 1)) < 0 and gpu is not None:
        # A refusal this GPU never reaches (a minor-version raise inside `if cap[0] < 8:`) never refuses it.
        status, reason = "open", f"never reached on {gpu.sm}: {place.unreachable}"
    elif place.gpu_outside and int(gate.get("polarity", 1)) > 0 and status == "open" and gpu is not None:
        # A branch inside a GPU test this GPU fails (`if major == 9: if is_blackwell: ...`): its own
        # test admits the GPU, but the GPU never gets there, so it never gets what the branch does.
        status, reason = "blocked", f"admits {gpu.sm} on its own, but never reached on it: {place.unreachable}"
    elif skip is not None and status == "blocked":
        # A branch for older or other GPUs while this GPU's own path serves it: it loses nothing here.
        status, reason = "open", f"{skip.reason} (the test admits {_names(allowed)})"
    elif place.alternative is not None and status == "blocked":
        reason += f"; {gpu.sm if gpu else 'this GPU'} takes its own path at {_where(place.alternative)}"
    clauses = []
    for part in other_clauses(gate):
        holds = Evaluator(book, gpu, server).eval(part) if server is not None else None
        clauses.append({"text": node_text(part), "holds": holds})
    meaning = fg.why if fg else None
    if fg is not None and fg.role == "hardware" and _hardware_context(interconnect):
        meaning = f"{meaning}; {_hardware_context(interconnect)}"
    return {
        "id": gate["id"],
        "feature": fg.feature if fg else None,
        "role": fg.role if fg else None,
        "meaning": meaning,
        "file": gate["file"],
        "line": capability_line(gate),
        "condition_line": gate["line"],
        "function": gate["function"],
        "kind": gate.get("kind"),
        "admits": allowed,
        "status": status,
        "reason": reason,
        "capability": capability,
        "alternative": _where(place.alternative) if place.alternative is not None else None,
        "unreachable": place.unreachable,
        "skips": skip.kind if skip is not None and status == "open" else None,
        "shape": (gate.get("effect") or {}).get("shape"),
        "clauses": clauses,
        "condition": gate.get("text"),
        "excerpt": gate.get("excerpt"),
    }


def _names(caps: list[str]) -> str:
    return ", ".join(caps) if caps else "no known GPU"


def _where(gate: Mapping[str, Any]) -> str:
    return f"{gate['file']}:{gate['line']}"


def _judge_feature(
    feature: Feature,
    fgs: list[FeatureGate],
    by_id: Mapping[str, dict[str, Any]],
    scan: GateScan,
    gpu: GpuTarget | None,
    server: Mapping[str, Any] | None,
    book: PredicateBook | None = None,
) -> dict[str, Any]:
    out = _feature_status(feature, fgs, by_id, scan, gpu, server)
    if book is None:
        book = PredicateBook(scan)

    try:
        value, why = in_effect(feature, fgs, by_id, book, gpu, server, scan.gates, out["status"], out["flag"])
    except Exception as exc:  # a judgement aid: never the reason a report fails
        value, why = None, f"cannot tell: {type(exc).__name__}: {exc}"
    out["in_effect"] = value
    out["in_effect_reason"] = why
    if server is not None and out["status"] == "open":
        word = {True: "in effect", False: "not in effect", None: "in effect: cannot tell"}[value]
        out["reason"] += f"; {word} in the running server: {why}"
    return out


def _feature_status(
    feature: Feature,
    fgs: list[FeatureGate],
    by_id: Mapping[str, dict[str, Any]],
    scan: GateScan,
    gpu: GpuTarget | None,
    server: Mapping[str, Any] | None,
) -> dict[str, Any]:
    flag, value = launch_flag(feature, fgs, scan.sources)
    flag_text = f"{flag} {value}" if flag and value else flag
    ids = [str(fg.gate["id"]) for fg in fgs]
    out: dict[str, Any] = {"status": "unknown", "gates": ids, "flag": flag_text, "reason": ""}
    broken = [e for e in scan.errors if e.get("matches") or _mentions(e, feature)]
    if broken:
        files = ", ".join(f"{e['file']} ({e.get('error')})" for e in broken)
        out["reason"] = f"cannot tell: {files} does not parse"
        return out
    book = PredicateBook(scan)

    # A gate nested under a condition that is false for this GPU (the `elif major == 8` after
    # `if major >= 9`) is not on its path: it neither blocks nor admits it.
    judged = [(fg, by_id[str(fg.gate["id"])]) for fg in fgs
              if gpu is None or not unreachable(fg.gate, scan.gates, book, gpu)]
    runtime = [(fg, g) for fg, g in judged if fg.role == "runtime"]
    auto = [(fg, g) for fg, g in judged if fg.role == "auto_enable"]
    hardware = [(fg, g) for fg, g in judged if fg.role == "hardware"]
    if not runtime and not auto:
        out["reason"] = (f"no {feature.title} gate found in sglang {scan.version or '(version unknown)'}: "
                         "a release without this feature, or a layout gpuops does not know")
        return out
    if gpu is None:
        out["reason"] = "the GPU's compute capability is not known"
        return out
    deciding = runtime or auto
    blocked = [g for _, g in deciding if g["status"] == "blocked"]
    if feature.combine == "any" and any(g["status"] == "open" for _, g in deciding):
        blocked = []  # alternative paths: one that admits the GPU is enough
    unknown = [g for _, g in deciding if g["status"] == "unknown"]
    notes = []
    if hardware:
        closed = [g for _, g in hardware if g["status"] == "blocked"]
        if closed:
            notes.append(f"{len(closed)} MNNVL/multi-node gate(s) stay closed on {gpu.sm} (hardware)")
    if blocked:
        out["status"] = "blocked"
        where = ", ".join(f"{_where(g)} ({g['function']})" for g in blocked)
        out["reason"] = f"blocked on {gpu.sm} at {where}: admits {_names(blocked[0]['admits'])}"
        state = _server_state(feature, server) if server is not None else None
        if state and "has it on" in state:
            out["reason"] += f"; {state}, but it never runs on {gpu.sm}"
    elif unknown:
        out["reason"] = "cannot tell: " + "; ".join(f"{_where(g)}: {g['reason']}" for g in unknown)
    else:
        out["status"] = "open"
        paths = _paths(runtime, gpu.sm, feature.combine)
        if paths and any(p["status"] != "open" for p in paths):
            # Alternative paths (combine: any), one answer each under one headline.
            opened = [p for p in paths if p["status"] == "open"]
            parts = [f"open on {len(opened)} of {len(paths)} paths: " + "; ".join(p["text"] for p in paths)]
        else:
            parts = [f"the runtime checks admit {gpu.sm}" if runtime else f"the auto-enable check admits {gpu.sm}"]
        if paths:
            out["paths"] = [{k: v for k, v in p.items() if k != "text"} for p in paths]
        auto_blocked = [g for _, g in auto if g["status"] == "blocked"]
        if runtime and auto_blocked:
            parts.append(f"not auto-enabled on {gpu.sm} ({_where(auto_blocked[0])})"
                         + (f": launch with {flag_text}" if flag_text else ""))
        elif runtime and not auto:
            parts.append(_no_auto_enable(feature, flag_text))
        if not runtime:
            parts.append("no runtime GPU check found")
        out["reason"] = "; ".join(parts)
    if notes:
        out["reason"] += "; " + "; ".join(notes)
    return out


def _no_auto_enable(feature: Feature, flag_text: str | None) -> str:
    """What SGLang does with the feature when no auto-enable gate of it is found (never "None")."""
    if feature.default == "on":
        return "used by default where they admit the GPU (no flag needed)"
    if feature.default == "auto":
        return "SGLang chooses it at start-up" + (f" (launch with {flag_text} to ask for it)" if flag_text else "")
    if flag_text:
        return f"not auto-enabled in this release: launch with {flag_text}"
    return "not auto-enabled in this release, and no launch flag for it found in its gates"


def _paths(runtime: list[tuple[FeatureGate, dict[str, Any]]], sm: str, combine: str) -> list[dict[str, Any]]:
    """Per catalog ``path:`` of the runtime gates, combined as the feature's gates are (``all``:
    open when every gate on it admits the GPU; ``any``: when one does), blocked when it is not
    open and a gate on it shuts the GPU out (where, and what it admits), else unknown."""
    named: dict[str, list[dict[str, Any]]] = {}
    for fg, g in runtime:
        if fg.path and g["status"] != "not_applicable":  # another platform's code is on no path of this host
            named.setdefault(fg.path, []).append(g)
    out = []
    for path, gates in named.items():
        blocked = [g for g in gates if g["status"] == "blocked"]
        opened = [g for g in gates if g["status"] == "open"]
        if combine == "any" and opened:
            status, text = "open", f"{path} open ({_where(opened[0])})"
        elif blocked:
            status = "blocked"
            text = f"{path} blocked on {sm} at {_where(blocked[0])} (admits {_names(blocked[0]['admits'])})"
        elif len(opened) == len(gates):
            status, text = "open", f"{path} open ({_where(gates[0])})"
        else:
            status, text = "unknown", f"{path} cannot tell ({_where(gates[0])})"
        where = blocked[0] if status == "blocked" else opened[0] if opened else gates[0]
        out.append({"path": path, "status": status, "file": where["file"], "line": where["line"], "text": text})
    return out


def _mentions(error: Mapping[str, Any], feature: Feature) -> bool:
    return any(p.search(str(error.get("file", ""))) for p in feature.keywords)


def _server_state(feature: Feature, server: Mapping[str, Any]) -> str | None:
    args = normalise_args(server.get("args"))  # what the server was given, not the defaults
    for choice in feature.flags:
        key = choice.setting
        if key in args:
            value = args[key]
            # A selecting setting asks for this feature only with one of its values; an inverse
            # switch set asks for it off.
            if asks_for(choice, value) != choice.inverse:
                return f"the running server has it on ({key}={value!r})"
            if choice.selects:
                return f"the running server has it off ({key}={value!r} selects another choice than " \
                       f"{', '.join(choice.values)})"
            return f"the running server has it off ({key}={value!r})"
    flags = " or ".join(c.flag for c in feature.flags)
    return f"the running server was not launched with {flags}" if flags else None


__all__ = ["FeatureGate", "GateCounts", "GateReport", "GateRule", "feature_gates", "judge", "launch_flag"]
