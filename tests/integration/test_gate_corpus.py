"""gpuops held to the hand-labelled corpus of capability tests from real SGLang releases
(tests/gate_corpus/labels.json: file, line, release and labels; never SGLang's code). Every label
must hold: reported or not, open/blocked/unknown on sm90, sm100 and sm120, and what it admits."""

from __future__ import annotations

import pytest
from labtools import release_scan

from gpuops.gates.accuracy import check_labels, load_corpus

CORPUS = load_corpus()


def test_the_corpus_is_what_it_says():
    releases = CORPUS.releases()
    assert {"0.5.8", "0.5.19", "0.5.23"} <= set(releases) and ({"0.5.12", "0.5.14"} & set(releases))
    gates = [e for e in CORPUS.labels if e["gate"]]
    assert len(gates) >= 150
    keys = [(e["release"], e["file"], e["line"]) for e in CORPUS.labels]
    assert len(keys) == len(set(keys)), "one label per line"
    for entry in gates:
        assert {entry["sm90"], entry["sm100"], entry["sm120"]} <= {"open", "blocked", "unknown"}
        assert entry["admits"] is None or set(entry["admits"]) <= set(CORPUS.architectures)
    for entry in CORPUS.excluded:
        assert entry["reason"].strip()


@pytest.mark.parametrize("release", CORPUS.releases())
def test_every_label_holds(release):
    scan = release_scan(release)
    assert scan.known, scan.reason
    checks = check_labels(scan, CORPUS.labels_of(release), CORPUS.architectures, CORPUS.cuda)
    false_open = [c for c in checks if c.false_open]
    assert not false_open, [(c.label["file"], c.label["line"], c.problems) for c in false_open]
    wrong = [(c.label["file"], c.label["line"], c.problems) for c in checks if c.problems]
    assert not wrong
