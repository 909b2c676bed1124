"""``inspect host`` of a host with a standing run whose launch carries ``--api-key``: the managed
launch it shows (facts/managed.py) is masked, in text and JSON. (The leak test inspects before any
run stands, so it could not fail had managed.py shown the flags unmasked.)"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

KEY = "sk-gpuops-managed-5d1e7b"


def test_a_standing_run_with_an_api_key_is_masked_in_inspect(lab_factory, run_gpuops) -> None:
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(names=("h01",)))
    inv = str(lab.inventory_path)
    done = run_gpuops("apply", "sglang-service", "-i", inv, "--json", "-e",
                      json.dumps({"sglang_contribute_args": ["--api-key", KEY]}), "-e", "gpuops_stop_grace=5",
                      timeout=300)
    report = json.loads(done.stdout)["hosts"]["h01"]
    assert report["status"] == "finished", report
    assert KEY in (lab.host("h01").state_dir / "desired.json").read_text(), "the run does stand with the key"
    text = run_gpuops("inspect", "host", "-i", inv, timeout=300)
    document = run_gpuops("inspect", "host", "-i", inv, "--json", timeout=300)
    managed = json.loads(document.stdout)["hosts"]["h01"]["managed_launch"]
    assert managed and "--api-key" in managed["args"], managed  # the flag is shown, its value is not
    assert "managed by gpuops" in text.stdout and "--api-key" in text.stdout, text.stdout
    for output in (text.stdout + text.stderr, document.stdout + document.stderr):
        assert KEY not in output
