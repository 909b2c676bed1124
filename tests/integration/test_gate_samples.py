"""gpuops held to random samples of real releases' gates labelled by an independent reading for the
field box (tests/gate_corpus/samples.json: sm120, CUDA 13.0, TP 8, PCIe only). Never open where the
reading says the GPU is shut out; the misses are exactly the ones named here (a fix removes its
line); the held-out part's agreement per release is reported in benchmarks/results/gate-sample/."""

from __future__ import annotations

import pytest
from labtools import release_scan

from gpuops.gates.evaluate import judge
from gpuops.gates.samples import PARTS, agreement, load_samples

pytestmark = pytest.mark.integration

HOST, LABELS = load_samples()
RELEASES = sorted({str(e["release"]) for e in LABELS}, key=lambda v: [int(p) for p in v.split(".")])
# Lines gpuops still does not agree on (a fix removes its line; a new miss fails). All from part
# independent-3, drawn and labelled blind after issue 29's fixes (2026-12-01, 17:2x UTC) and scored
# once: 0.5.10 37/40, 0.5.23 35/40; the scanner was then tuned to six of them (effect shapes `exit`
# by sys.exit, `requirements`, `divert`; a branch inside a GPU test the GPU fails; the SAIL
# platform), so the part is no longer held out. The two elif lines left are read blocked
# by that reader ("sm120 goes to its own path") where samples.json's `about` (its convention for an elif after
# a branch that catches the GPU) calls such an elif open.
# Part independent-4 (blind, drawn after all of those fixes, scored once at a311546): 0.5.10 39/40,
# 0.5.23 40/40; its one miss is an elif of the same kind (fp8_utils.py:451, after an if that admits sm120).
KNOWN_MISSES: set[tuple[str, str, int]] = {
    ("0.5.10", "srt/layers/attention/triton_ops/extend_attention.py", 81),
    ("0.5.23", "kernels/ops/attention/extend_attention.py", 111),
    ("0.5.10", "srt/layers/quantization/fp8_utils.py", 451),  # independent-4 (blind, scored once)
}
# Of those, the ones gpuops calls open where the reading says sm120 is shut out.
KNOWN_FALSE_OPENS: set[tuple[str, str, int]] = {
    ("0.5.10", "srt/layers/attention/triton_ops/extend_attention.py", 81),
    ("0.5.23", "kernels/ops/attention/extend_attention.py", 111),
    ("0.5.10", "srt/layers/quantization/fp8_utils.py", 451),
}


def test_the_samples_are_what_they_say():
    assert {e["part"] for e in LABELS} == set(PARTS)
    keys = [(e["release"], e["file"], e["line"]) for e in LABELS]
    assert len(keys) == len(set(keys)), "one label per line"
    assert HOST.compute_capability == "12.0" and HOST.server["args"]["tp_size"] == 8


@pytest.mark.parametrize("release", RELEASES)
def test_samples_hold(release):
    scan = release_scan(release)
    assert scan.known, scan.reason
    report = judge(scan, HOST.compute_capability, HOST.cuda, server=HOST.server, interconnect=HOST.interconnect)
    rows = agreement(report.gates, [e for e in LABELS if e["release"] == release])
    assert all(r.got is not None for r in rows), [r.label["line"] for r in rows if r.got is None]
    false_opens = {(release, r.label["file"], r.label["line"]) for r in rows if r.false_open}
    assert false_opens == {k for k in KNOWN_FALSE_OPENS if k[0] == release}
    misses = {(release, r.label["file"], r.label["line"]) for r in rows if not r.agrees}
    assert misses == {k for k in KNOWN_MISSES if k[0] == release}
