"""Every recorded output of every fact probe parses to its recorded value (tests/facts/, see fact_cases.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fact_cases import CASES_DIR, PROBES, as_json, case_output, case_paths


@pytest.mark.parametrize("path", case_paths(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_output_parses_to_the_recorded_value(path: Path) -> None:
    probe = PROBES.get(path.parent.name)
    assert probe is not None, f"{path.parent.name}: no fact probe of that name ({', '.join(PROBES)})"
    case = json.loads(path.read_text())
    assert as_json(probe.parse(case_output(case, probe))) == case["expected"]


def test_every_probe_has_recorded_cases_and_every_folder_is_a_probe() -> None:
    folders = {p.name for p in CASES_DIR.iterdir() if p.is_dir()}
    assert folders == set(PROBES)
    for name in folders:
        assert list((CASES_DIR / name).glob("*.json")), f"tests/facts/{name}/ has no case"
