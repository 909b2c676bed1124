"""How right the gate analysis is, measured against the hand-labelled corpus
(``tests/gate_corpus/labels.json``) and the independent candidate search (``candidates.py``).

Pure apart from reading the corpus files: a ``GateScan`` (and the candidates) in, figures out.
Used by ``tests/integration/test_gate_corpus.py`` and ``benchmarks/gate_accuracy``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from gpuops.gates.logic import GpuTarget, PredicateBook, admits, cap_verdict
from gpuops.gates.scan import GateScan
from gpuops.frozen import frozen

CORPUS_DIR = Path(__file__).resolve().parents[3] / "tests" / "gate_corpus"
JUDGED_ON = {"sm90": (9, 0), "sm100": (10, 0), "sm120": (12, 0)}


@frozen
class Corpus:
    """The hand-labelled gate corpus (``tests/gate_corpus``): the labelled lines of each release, the lines
    excluded by hand with why, and the architectures and CUDA version the labels are judged for."""

    labels: tuple[Mapping[str, Any], ...]
    excluded: tuple[Mapping[str, Any], ...]
    architectures: tuple[str, ...]
    cuda: tuple[int, int]

    def releases(self) -> list[str]:
        return sorted({str(e["release"]) for e in self.labels}, key=lambda v: [int(p) for p in v.split(".")])

    def labels_of(self, release: str) -> list[Mapping[str, Any]]:
        return [e for e in self.labels if e["release"] == release]

    def excluded_of(self, release: str) -> dict[tuple[str, int], str]:
        return {(e["file"], int(e["line"])): str(e["reason"]) for e in self.excluded if e["release"] == release}


def load_corpus(directory: Path = CORPUS_DIR) -> Corpus:
    labels = json.loads((directory / "labels.json").read_text())
    excluded = json.loads((directory / "excluded.json").read_text())
    major, minor = (int(p) for p in str(labels["cuda"]).split("."))
    return Corpus(tuple(labels["labels"]), tuple(excluded["excluded"]), tuple(labels["architectures"]), (major, minor))


@dataclass
class LabelCheck:
    """One label against what gpuops says of the gate(s) on its line: whether the scan reports one, what
    disagrees, and whether gpuops says open where the label does not."""

    label: Mapping[str, Any]
    reported: bool
    problems: list[str] = field(default_factory=list)
    false_open: bool = False


def check_labels(scan: GateScan, labels: Iterable[Mapping[str, Any]], architectures: Iterable[str],
                 cuda: tuple[int, int]) -> list[LabelCheck]:
    """Each label against what gpuops says of the gate(s) the scan reports on that line."""
    book = PredicateBook(scan)
    archs = list(architectures)
    by_line: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for gate in scan.gates:
        by_line.setdefault((str(gate["file"]), int(gate["line"])), []).append(gate)
    out = []
    for label in labels:
        gates = by_line.get((str(label["file"]), int(label["line"])), [])
        check = LabelCheck(label, bool(gates))
        out.append(check)
        if not label["gate"]:
            if gates:
                check.problems.append("reported as a gate")
            continue
        if not gates:
            check.problems.append("not reported")
            continue
        if len(gates) > 1:
            check.problems.append(f"{len(gates)} gates reported on the line")
        gate = gates[0]
        for name, (major, minor) in JUDGED_ON.items():
            got = cap_verdict(gate, book, GpuTarget(major, minor, cuda)).status
            want = label[name]
            if got != want:
                check.problems.append(f"{name}: {got}, labelled {want}")
                if got == "open":
                    check.false_open = True
        if label.get("admits") is not None:
            got_admits = [a for a in admits(gate, book) if a in archs]
            if got_admits != list(label["admits"]):
                check.problems.append(f"admits {got_admits}, labelled {list(label['admits'])}")
    return out


@frozen
class Recall:
    """How many of the gate-shaped candidate lines lie in a gate the scan reports (``recall``): the counts, the
    lines missed, and how many candidates each reason set aside."""

    candidates: int
    shaped: int
    excluded: int
    found: int
    missed: tuple[tuple[str, int, str], ...]
    reasons: Mapping[str, int]

    @property
    def gates(self) -> int:
        return self.shaped - self.excluded

    @property
    def value(self) -> float:
        return self.found / self.gates if self.gates else 1.0


def recall(scan: GateScan, candidates: Iterable[Any], excluded: Mapping[tuple[str, int], str]) -> Recall:
    """Of the gate-shaped candidate lines (less those excluded by hand, with a reason), how many
    lie in a gate the scan reports. ``reasons``: how many candidates each rule or hand reason set aside."""
    covered = set()
    for gate in scan.gates:
        first = min(int(gate["line"]), int(gate.get("stmt_line") or gate["line"]))
        for n in range(first, int(gate.get("end_line") or gate["line"]) + 1):
            covered.add((str(gate["file"]), n))
    cands = list(candidates)
    reasons: dict[str, int] = {}
    shaped = found = excl = 0
    missed = []
    for c in cands:
        if not c.shaped:
            reasons[str(c.reason)] = reasons.get(str(c.reason), 0) + 1
            continue
        shaped += 1
        key = (c.file, c.line)
        if key in excluded:
            excl += 1
            reasons["by hand: " + excluded[key]] = reasons.get("by hand: " + excluded[key], 0) + 1
        elif key in covered:
            found += 1
        else:
            missed.append((c.file, c.line, c.text))
    return Recall(len(cands), shaped, excl, found, tuple(missed), reasons)


__all__ = ["Corpus", "LabelCheck", "Recall", "check_labels", "load_corpus", "recall"]
