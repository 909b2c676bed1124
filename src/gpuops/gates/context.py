"""Where a gate sits, judged for one host (pure): the platform of the branches around it, an
enclosing GPU test that is false for this GPU, the sibling branch of its dispatch that serves the
GPU instead, and the clauses that are false for this host's configuration.

A gate's own condition says which GPUs pass it (``logic.cap_verdict``); its place says whether that
verdict costs this host anything:

- inside ``if _is_hip:`` (or with an ``_is_npu and ...`` conjunct) it is **not applicable** on an
  NVIDIA host: never open, never blocked;
- inside an enclosing GPU test that this GPU fails (``if cap[0] < 8:`` around a minor-version
  raise) it is **not reached**: a refusal there never refuses this GPU, and a branch there
  (``if major == 9: if is_blackwell: ...``) is never taken by it: blocked;
- a branch this GPU fails while a sibling of the same if/elif chain admits it (``elif is_sm120():``)
  **sends it to its own path** (``alternative``): blocked, but the GPU is served;
- a branch (or an assert in an ``else``) after an earlier branch of its chain that admits this GPU
  (``if is_sm120(): cudnn elif is_sm100(): cutedsl``) is **taken before** (``taken_before``): the GPU
  never gets there because its own branch caught it (``skips.skipped_branch`` reads it open);
- a branch or refusal with a clause false on this host (``tp_size == 1`` under TP 8, a multicast
  check on a PCIe-only host) is **not reached here**, with the clause.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Mapping, Sequence

from gpuops.gates.in_effect import normal_text, platform_value, settings_value, unreachable
from gpuops.gates.logic import (
    Evaluator, GpuTarget, PredicateBook, cap_verdict, node_text, normalise_args, other_clauses,
)
from gpuops.remote.gate_tree import clause_nodes
from gpuops.frozen import frozen

# What the platform names SGLang branches on are on an NVIDIA host. ``_use_aiter`` is an AMD
# library switch (``get_bool_env_var("SGLANG_USE_AITER") and _is_hip``); gfx names are AMD GPUs;
# ``is_sail_runtime()`` is a T-HEAD SAIL device ("ZW" in its name), not an NVIDIA GPU.
NVIDIA_HOST: dict[str, bool] = {
    **{name: False for base in ("musa", "hip", "npu", "xpu", "cpu", "mps", "hpu", "gfx95_supported", "gfx1250",
                                                          "sail_runtime")
       for name in (f"_is_{base}", f"is_{base}")},
    "_use_aiter": False, "use_aiter": False,
    "_is_cuda": True, "is_cuda": True,
}
_TRUE_PLATFORMS = ("cuda", "cuda_alike")
# The host's configuration a clause may be judged by: how the GPUs are split and the data types.
# Feature switches are not among them (a gate the flag is off for still costs the GPU the feature).
CONFIGURATION = ("tp_size", "nnodes", "dp_size", "pp_size", "ep_size", "moe_ep_size", "attn_cp_size",
                 "attn_tp_size", "dtype", "kv_cache_dtype")
# Clauses about a multi-GPU fabric (NVLink multicast, MNNVL): false on a PCIe-only host.
_FABRIC_RE = re.compile(r"multicast|mnnvl|nvlink|nvls", re.I)


@frozen
class Placement:
    """Where one gate sits, judged for one GPU and host (``Placer.place``): why it is not for this platform or
    not reached here, and the branch that serves the GPU instead; empty: its place changes nothing."""

    not_applicable: str | None = None  # why the gate is for another platform than this host's
    outside: str | None = None  # an enclosing test false for this GPU or this host's configuration (its text)
    # That enclosing test is a GPU test this GPU fails (``if major == 9:``), not the ``else`` of one
    # (an elif after an if that already catches the GPU is read by samples.json's convention: open).
    gpu_outside: bool = False
    alternative: Mapping[str, Any] | None = None  # the sibling branch that admits the GPU
    unreachable: str | None = None  # why it is not reached on this host (with its configuration)
    uncalled: str | None = None  # why no caller in the tree reaches it (whatever the host)
    # The earlier branch of the gate's chain that admits the GPU, when ``outside`` is its ``not (...)``.
    taken_before: Mapping[str, Any] | None = None


def other_platform(gate: Mapping[str, Any]) -> str | None:
    """Why the gate is on another platform's path (an enclosing ``if _is_hip:``, a conjunct
    ``_is_npu``), or None."""
    for text in gate.get("within") or ():
        if platform_value(str(text), NVIDIA_HOST) is False:
            return f"inside `{_short(text)}`, false on an NVIDIA host"
    tree = gate.get("condition") or {}
    if int(gate.get("polarity", 1)) > 0:
        parts = tree.get("args") if tree.get("op") == "and" else [tree]
        for part in parts or ():
            if _platform_false(part):
                return f"`{_short(node_text(part))}` is false on an NVIDIA host"
    return None


def _platform_false(node: Mapping[str, Any]) -> bool:
    """A conjunct that names only platforms, and is false on an NVIDIA host: ``_is_hip``,
    ``_use_aiter`` (an alias of ``... and _is_hip``, or a name the scan could not read)."""
    op = node.get("op")
    if op == "platform":
        return node.get("name") not in _TRUE_PLATFORMS
    if op == "clause":
        return NVIDIA_HOST.get(str(node.get("ref") or node.get("text") or "").split(".")[-1].rstrip("()")) is False
    if op == "alias":
        return _platform_false(node.get("expr") or {})
    if op == "and":
        return any(_platform_false(a) for a in node.get("args") or ())
    if op == "or":
        return all(_platform_false(a) for a in node.get("args") or ())
    return False


class Placer:
    """Places every gate of one scan for one GPU (and, with ``server``, one host's settings)."""

    def __init__(self, gates: Sequence[Mapping[str, Any]], book: PredicateBook, gpu: GpuTarget,
                 server: Mapping[str, Any] | None = None, interconnect: Mapping[str, Any] | None = None) -> None:
        self.book = book
        self.gpu = gpu
        self.server = _configuration(server)
        self.pcie_only = (interconnect or {}).get("nvlink") is False
        self.by_function: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for gate in gates:
            self.by_function.setdefault((str(gate["file"]), str(gate["function"])), []).append(gate)
        self._admits: dict[str, bool] = {}

    def neighbours(self, gate: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """The gates of ``gate``'s function (its enclosing tests among them)."""
        return self.by_function.get((str(gate["file"]), str(gate["function"])), [])

    def admits(self, gate: Mapping[str, Any]) -> bool:
        key = str(gate["id"])
        if key not in self._admits:
            self._admits[key] = cap_verdict(gate, self.book, self.gpu).status == "open"
        return self._admits[key]

    def place(self, gate: Mapping[str, Any]) -> Placement:
        na = other_platform(gate)
        if na is not None:
            return Placement(not_applicable=na)
        uncalled = unmatched_callers(gate)
        if uncalled is None and gate.get("unused"):
            # `is_ampere_with_cuda_12_3 = lambda: _check(8)` that nothing in the tree names: a test
            # no code runs decides nothing (the scanner's ``unused``; issue 43, fix 14).
            uncalled = f"nothing in the tree uses `{gate['unused']}`"
        if uncalled is not None:
            return Placement(uncalled=uncalled, unreachable=uncalled)
        neighbours = self.by_function.get((str(gate["file"]), str(gate["function"])), [])
        outside = self.outside(gate, neighbours)
        if outside:
            why: str | None = f"inside `{_short(outside)}`, false on {self.gpu.sm}"
        elif (closed := self.callers_closed(gate)) is not None:
            outside, why = closed, closed
        else:
            outside = self.outside_configuration(gate)
            why = f"inside `{_short(outside)}`, false on this host (its configuration)" if outside \
                else self.false_clause(gate)
        alternative = None if outside else self.sibling(gate, neighbours)
        return Placement(outside=outside, alternative=alternative, unreachable=why,
                         taken_before=self.taken_before(gate, neighbours, outside) if outside else None,
                         gpu_outside=bool(outside) and why == f"inside `{_short(outside)}`, false on {self.gpu.sm}"
                         and not str(outside).startswith("not ("))

    def callers_closed(self, gate: Mapping[str, Any]) -> str | None:
        """Why no caller leads here on this GPU: every call of the gate's function (the scan's
        ``callers``, each with the tests around it) sits in another platform's branch or inside a
        test false for this GPU (``if is_sm100_supported(): forward_sm100(...)``), or None."""
        closed = self._sites_closed(gate.get("callers"))
        return None if closed is None else f"every caller is closed on {self.gpu.sm}: " + "; ".join(closed)

    def _sites_closed(self, sites: Any) -> list[str] | None:
        """Why each call site is closed on this GPU, or None when one is not. A site with no test
        around it is closed when every call of its own function is (its ``callers``: a dispatcher
        that hands ``forward_sm90`` only to sm90)."""
        if not sites:
            return None
        closed = []
        for site in sites:
            place = {"file": site.get("file"), "function": site.get("function"), "within": site.get("within") or []}
            if other_platform(place) is not None:
                closed.append(f"{site.get('file')}:{site.get('line')} (another platform's branch)")
                continue
            neighbours = self.by_function.get((str(site.get("file")), str(site.get("function"))), [])
            text = self.outside(place, neighbours)
            if text is not None:
                closed.append(f"{site.get('file')}:{site.get('line')} inside `{_short(text, 60)}`")
                continue
            outer = self._sites_closed(site.get("callers"))
            if outer is None:
                return None
            closed.append(f"{site.get('file')}:{site.get('line')} in {site.get('function')}, called only from "
                          + "; ".join(outer))
        return closed

    def outside_configuration(self, gate: Mapping[str, Any]) -> str | None:
        """An enclosing condition false for this host's configuration (``if self.tp_size == 1:``
        around the gate under TP 8), or None; feature switches are not read (``CONFIGURATION``)."""
        if self.server is None:
            return None
        for text in gate.get("within") or ():
            if settings_value(str(text), {**self.server["defaults"], **self.server["args"]}) is False:
                return str(text)
        return None

    def outside(self, gate: Mapping[str, Any], neighbours: Sequence[Mapping[str, Any]]) -> str | None:
        for text in gate.get("within") or ():
            if unreachable({**gate, "within": [text]}, neighbours, self.book, self.gpu):
                return str(text)
        return None

    def taken_before(self, gate: Mapping[str, Any], neighbours: Sequence[Mapping[str, Any]],
                     outside: str) -> Mapping[str, Any] | None:
        """The earlier branch whose ``else`` holds the gate and whose own test admits this GPU, when
        that ``else`` (``outside``: ``not (is_sm120_supported())``) is what keeps the GPU out: the GPU
        takes that branch, whatever kind of test it is (a predicate, ``major == 12 and minor == 0``,
        ``is_sm100() or is_sm120()``), or None. A branch that does work there (``elif is_blackwell():
        set_fa_ver(4)``) is not read so: the blind readers of 0.5.8 call the FA4 sm120 never gets a
        loss; one that only selects a value (the scanner's ``effect.selects``), or an ``assert`` in the
        ``else``, is."""
        if gate.get("kind") not in ("if", "assert") or (
                gate.get("kind") == "if" and not (gate.get("effect") or {}).get("selects")):
            return None
        within = [str(t) for t in gate.get("within") or ()]
        if not outside.startswith("not (") or not outside.endswith(")") or outside not in within:
            return None
        depth = within.index(outside)
        test = normal_text(outside[len("not ("):-1])
        for other in neighbours:
            if other is gate or other.get("kind") != "if" or int(other.get("polarity", 1)) < 0 \
                    or int(other.get("line", 0)) >= int(gate.get("line", 0)):
                continue
            if [str(t) for t in other.get("within") or ()] != within[:depth] \
                    or normal_text(str(other.get("text") or "")) != test:
                continue
            if self.admits(other) and other_platform(other) is None:
                return other
        return None

    def sibling(self, gate: Mapping[str, Any], neighbours: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The first other branch of the gate's if/elif chain whose own test admits this GPU, when
        the gate's does not (a plain ``else`` is no such branch: it is what every GPU falls to)."""
        chain = gate.get("chain")
        if chain is None or gate.get("kind") != "if" or self.admits(gate):
            return None
        for other in neighbours:
            if other is not gate and other.get("chain") == chain and other.get("kind") == "if" \
                    and self.admits(other) and other_platform(other) is None:
                return other
        return None

    def false_clause(self, gate: Mapping[str, Any]) -> str | None:
        """A conjunct of the condition that is false for this host's settings or interconnect: the
        branch is not taken here, and a refusal ``if x and not gpu: raise`` never fires here."""
        tree = gate.get("condition") or {}
        if tree.get("op") != "and" or (self.server is None and not self.pcie_only):
            return None
        fabric = {tuple(c["span"]): False for c in clause_nodes(tree)
                  if self.pcie_only and c.get("span") and _FABRIC_RE.search(node_text(c))}
        for part in other_clauses(gate):
            if self._false_whatever_the_gpu(part, fabric):
                setting = "its interconnect: PCIe only" if any(
                    tuple(c.get("span") or ()) in fabric for c in clause_nodes(part)) else "its configuration"
                return f"`{_short(node_text(part))}` is false on this host ({setting})"
        return None


    def _false_whatever_the_gpu(self, part: Mapping[str, Any], fabric: Mapping[tuple[int, ...], bool]) -> bool:
        """Is ``part`` false for every value of the GPU tests inside it (``uses_sm100_x`` mixes
        ``is_sm100`` with ``kv_cache_dtype == "nvfp4"``: only the clause may make it false)?"""
        spans = sorted({tuple(n["span"]) for n in _cap_nodes(part) if n.get("span")})
        if len(spans) > 4:
            return False
        for values in itertools.product((False, True), repeat=len(spans)):
            overrides = {**fabric, **dict(zip(spans, values))}
            if Evaluator(self.book, self.gpu, self.server, overrides=overrides).eval(part) is not False:
                return False
        return True


def unmatched_callers(gate: Mapping[str, Any]) -> str | None:
    """Why no caller reaches the gate: a comparison of a parameter no call site in the tree passes
    a value of its kind (``if isinstance(capability, tuple): return cap >= capability`` while every
    caller passes 80; the scanner's ``unmatched``), or None."""
    for node in _cap_nodes(gate.get("condition") or {}):
        unmatched = (node.get("atom") or {}).get("unmatched")
        if isinstance(unmatched, dict):
            kind = "a (major, minor) tuple" if (node.get("atom") or {}).get("subject") == "cc" else "a number"
            passed = ", ".join(str(tuple(v) if isinstance(v, list) else v) for v in unmatched.get("passed") or ())
            return (f"`{_short(node_text(node))}` compares {kind} with `{unmatched.get('param')}`, which every "
                    f"caller in the tree passes as {passed}")
    return None


def _cap_nodes(node: Any) -> list[Mapping[str, Any]]:
    """The GPU tests (``cap`` atoms) anywhere under ``node``, through aliases."""
    found: list[Mapping[str, Any]] = []
    if isinstance(node, dict):
        if node.get("op") == "cap":
            return [node]
        for value in node.values():
            if isinstance(value, (dict, list)):
                found.extend(_cap_nodes(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_cap_nodes(item))
    return found


def _configuration(server: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Only the host's configuration of the server's settings (``CONFIGURATION``)."""
    if server is None:
        return None
    args = {k: v for k, v in normalise_args(server.get("args")).items() if k in CONFIGURATION}
    defaults = {k: v for k, v in normalise_args(server.get("defaults")).items() if k in CONFIGURATION}
    return {"args": args, "defaults": defaults, "architecture": None}


def _short(text: Any, limit: int = 80) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


__all__ = ["NVIDIA_HOST", "Placement", "Placer", "other_platform"]
