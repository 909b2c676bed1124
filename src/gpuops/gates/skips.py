"""A branch this GPU fails that costs it nothing (issue 43), judged from the code (pure).

A branch whose test the GPU fails is ``blocked`` when the GPU loses what the branch does. It loses
nothing when the branch is written for GPUs other than it while its own path serves it:

- ``older``: the test admits only the oldest GPUs, up to a threshold below this GPU's capability
  (``if major < 9: LEGACY_CONFIG``, ``(8, 0) <= cap < (10, 0)``, ``is_sm80_before``): every GPU from
  the threshold up, this one among them, takes the other path. The reverse, where this GPU falls to
  the legacy or generic path (``if is_sm90() or is_sm100(): FAST``, ``if 9 <= major < 12: NEW``), is
  no such threshold: the test does not admit the oldest GPUs, or the threshold is this GPU itself;
- ``others``: the test is the negation of a predicate that admits this GPU (``if not is_blackwell():
  fa3 ... else: ...``), and the statement has another branch, the one the predicate's GPUs take;
- ``quirk``: the body only adjusts a value every GPU computes (``scale = scale * SM100_FIX``,
  ``num_warps = min(num_warps, 8)``: the scanner's ``effect.adjusts``) for the GPUs it admits, and
  there is no ``else``: this GPU keeps the value every other GPU gets.

Only ``if`` branches are read (a value such as ``use_marlin = 80 <= sm < 89`` has no branch of the GPU
to read), and only those whose own test stops the GPU. A gate on a catalog feature's path is not:
there the question is whether the GPU gets that feature, and a branch it skips is the feature it
does not get.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gpuops.gates.logic import RECENT_CUDA, Evaluator, GpuTarget, PredicateBook, cap_verdicts, node_text
from gpuops.remote.gate_tree import has_atoms, only_atoms

# The oldest architecture the ``older`` threshold counts from: a lower bound at Ampere
# (``(8, 0) <= cap < (10, 0)``) is SGLang's floor for a path, not a band of GPUs chosen over others.
FLOOR = (8, 0)
# GPUs older than FLOOR, asked when the test admits none of the candidates (``major < 8``).
_OLDER_THAN_FLOOR = ((7, 5), (7, 0), (6, 0))
KINDS = ("older", "others", "quirk")


@dataclass(frozen=True)
class Skip:
    """Why the GPU that fails a branch's test loses nothing by it."""

    kind: str  # one of KINDS
    reason: str


def skipped_branch(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget,
                   own_branch: Mapping[str, Any] | None = None) -> Skip | None:
    """Why ``gpu``, which fails this ``if`` branch's own test, loses nothing by it, or None (it
    does, or the code does not say). ``own_branch``: a sibling of its if/elif chain whose test
    admits the GPU (``context.Placer.sibling``), another branch of the statement it takes."""
    if gate.get("kind") != "if" or int(gate.get("polarity", 1)) < 0:
        return None
    return (_older(gate, book, gpu) or _negated(gate, book, gpu, own_branch is not None)
            or _quirk(gate, gpu))


def _older(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget) -> Skip | None:
    """The test admits the oldest GPUs up to a threshold below ``gpu``, and no GPU from there up."""
    ordered = sorted({(major, minor) for _, major, minor in book.candidates if (major, minor) >= FLOOR})
    verdicts = [v.status for v in cap_verdicts(gate, book, [GpuTarget(m, n, RECENT_CUDA) for m, n in ordered])]
    if "unknown" in verdicts:
        return None
    passing = [cc for cc, status in zip(ordered, verdicts) if status == "open"]
    if passing != ordered[:len(passing)] or len(passing) == len(ordered):
        return None  # a band that leaves out the oldest GPUs (`is_sm90()`), or every GPU
    if not passing:
        older = cap_verdicts(gate, book, [GpuTarget(m, n, RECENT_CUDA) for m, n in _OLDER_THAN_FLOOR])
        if all(v.status != "open" for v in older):
            return None  # it admits no GPU at all: nothing older is served by it
    threshold = ordered[len(passing)]
    if threshold >= (gpu.major, gpu.minor):
        return None  # `major < 12` on sm120: the test was written about this GPU, not older ones
    return Skip("older", f"a path for GPUs older than {_sm(threshold)} only; {gpu.sm} takes the path of "
                         f"{_sm(threshold)} and newer")


def _negated(gate: Mapping[str, Any], book: PredicateBook, gpu: GpuTarget, own_branch: bool) -> Skip | None:
    """``if not P: ... else: ...`` (or ``!=``, ``not in``) where P admits ``gpu``: the branch is
    for the GPUs outside P, and the statement's other branch is P's, this GPU's."""
    if not (own_branch or gate.get("orelse") == "else"):
        return None
    tree = gate.get("condition") or {}
    parts = tree.get("args") if tree.get("op") == "and" else [tree]
    tests = [p for p in parts or () if has_atoms(p, ("cap",))]
    if len(tests) != 1 or not only_atoms(tests[0]):
        return None
    test = tests[0]
    while test.get("op") == "alias":
        test = test.get("expr") or {}
    evaluator = Evaluator(book, gpu)
    if test.get("op") == "not" and evaluator.eval(test.get("arg") or {}) is True:
        why = f"the GPUs that fail `{node_text(test.get('arg') or {})}`, which {gpu.sm} passes"
    elif test.get("op") == "cap" and (test.get("atom") or {}).get("cmp") in ("!=", "not in") \
            and evaluator.eval(test) is False:
        why = f"the GPUs `{node_text(test)}` admits, every one but {gpu.sm}'s kind"
    else:
        return None
    return Skip("others", f"a path for {why}; {gpu.sm} takes the statement's other branch, written for it")


def _quirk(gate: Mapping[str, Any], gpu: GpuTarget) -> Skip | None:
    """The body only adjusts values every GPU computes, for the GPUs the test admits; no ``else``."""
    effect = gate.get("effect") or {}
    if not effect.get("adjusts") or gate.get("orelse") == "else":
        return None
    what = ", ".join(str(s) for s in effect.get("sets") or ()) or "a value"
    return Skip("quirk", f"only adjusts {what} for the GPUs it admits; {gpu.sm} keeps the value every "
                         "other GPU computes")


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


__all__ = ["FLOOR", "KINDS", "Skip", "skipped_branch"]
