"""Random samples of a release's gates, labelled by an independent reading of the source for one
host, and gpuops' agreement with them (pure apart from reading the labels file).

``tests/gate_corpus/samples.json`` holds the labels: per release, gates drawn at random from its
scan (``draw``) and labelled from the source printed without gpuops' verdicts, for one host (the
field box: sm120, CUDA 13.0, TP 8, PCIe only). Each label is ``open`` (this GPU runs the code the gate
protects), ``blocked`` (it does not: refused, or sent elsewhere) or ``not_applicable`` (another
platform's code), or several of them joined by ``|`` where the reading allows either; ``part``
is ``tuning`` (samples the scanner was changed against), ``held_out`` (drawn and labelled after
the change, never tuned to) or ``independent`` (drawn fresh and labelled by a second reader, not the
engineer who changed the scanner, before any verdict of gpuops was seen) or ``independent-2`` (the
same, by a third reader, on fresh draws of its own) or ``independent-3`` (a fourth reader, likewise) or ``independent-4`` (a fifth reader, likewise) or ``independent-5`` (a sixth reader, likewise) or ``independent-6`` (a seventh, likewise) or ``independent-7`` (an eighth, likewise) or ``independent-8`` (a ninth, likewise). Used by ``benchmarks/gate_sample`` and ``tests/integration/test_gate_samples.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from gpuops.gates.accuracy import CORPUS_DIR
from gpuops.frozen import frozen

SAMPLES_FILE = CORPUS_DIR / "samples.json"
LABELS = ("open", "blocked", "not_applicable")
PARTS = ("tuning", "held_out", "independent", "independent-2", "independent-3", "independent-4", "independent-5", "independent-6", "independent-7", "independent-8", "independent-9", "independent-10", "independent-11", "independent-12", "independent-13", "independent-14")


@frozen
class SampleHost:
    """The host the samples are labelled for."""

    compute_capability: str
    cuda: str
    server: Mapping[str, Any]
    interconnect: Mapping[str, Any]


def load_samples(path: Path = SAMPLES_FILE) -> tuple[SampleHost, list[Mapping[str, Any]]]:
    data = json.loads(path.read_text())
    host = data["host"]
    labels = list(data["labels"])
    for entry in labels:
        wanted = str(entry["sm120"]).split("|")
        if not set(wanted) <= set(LABELS) or entry.get("part") not in PARTS:
            raise ValueError(f"{path}: {entry['release']} {entry['file']}:{entry['line']}: bad label {entry}")
    server = {"args": dict(host.get("args") or {}), "architecture": host.get("architecture")}
    return SampleHost(str(host["compute_capability"]), str(host["cuda"]), server, dict(host.get("interconnect") or {})), labels


def draw(gates: Sequence[Mapping[str, Any]], n: int, seed: int) -> list[Mapping[str, Any]]:
    """``n`` gates drawn at random (``seed``) from a scan's gates, in the scan's order."""
    return random.Random(seed).sample(list(gates), min(n, len(gates)))


@frozen
class Agreement:
    """One sampled label against the status gpuops gives the gate on its line."""

    label: Mapping[str, Any]
    got: str | None  # gpuops' status of the gate on that line; None when no gate is reported there

    @property
    def wanted(self) -> list[str]:
        return str(self.label["sm120"]).split("|")

    @property
    def agrees(self) -> bool:
        return self.got in self.wanted

    @property
    def false_open(self) -> bool:
        """gpuops says open where the reading says the GPU is shut out (or it is another platform's code)."""
        return self.got == "open" and "open" not in self.wanted


def agreement(judged_gates: Sequence[Mapping[str, Any]], labels: Sequence[Mapping[str, Any]]) -> list[Agreement]:
    """Each label against the status gpuops gives the (first) gate reported on its line."""
    by_line: dict[tuple[str, int], Mapping[str, Any]] = {}
    for gate in judged_gates:
        by_line.setdefault((str(gate["file"]), int(gate["condition_line"])), gate)
    out = []
    for label in labels:
        found = by_line.get((str(label["file"]), int(label["line"])))
        out.append(Agreement(label, str(found["status"]) if found is not None else None))
    return out


def summary(rows: Sequence[Agreement]) -> dict[str, Any]:
    """Agreement, false opens and misses, in all and per pattern."""
    def count(part: Sequence[Agreement]) -> dict[str, Any]:
        return {"labels": len(part), "agree": sum(r.agrees for r in part),
                "false_open": sum(r.false_open for r in part),
                "rate": round(sum(r.agrees for r in part) / len(part), 4) if part else None}
    patterns: dict[str, list[Agreement]] = {}
    for row in rows:
        patterns.setdefault(str(row.label.get("pattern") or "?"), []).append(row)
    return {**count(rows), "patterns": {p: count(r) for p, r in sorted(patterns.items())},
            "wrong": [f"{r.label['file']}:{r.label['line']}: gpuops {r.got}, read {r.label['sm120']}"
                      + (" (FALSE OPEN)" if r.false_open else "") for r in rows if not r.agrees]}


__all__ = ["Agreement", "SampleHost", "LABELS", "PARTS", "SAMPLES_FILE", "agreement", "draw", "load_samples", "summary"]
