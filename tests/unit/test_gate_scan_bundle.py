"""The gate scanner is an entry (remote/gate_scan.py) plus its stage modules (remote/scan_*.py), sent
as ONE bundled script. These tests run that script as a host does, with no gpuops on the path that
could stand in for the bundle, and hold its forked workers to the serial scan: a worker failure
falls back to the serial scan silently, so equal output alone would not show the workers ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuops.shipping import source
from gpuops.shipping.bundle import find_bundle

from test_gate_flow_snippets import FILES
from test_gate_scanner_snippets import make_site

REMOTE_DIR = Path(__file__).resolve().parents[2] / "src" / "gpuops" / "remote"

# Runs the bundled scanner's text as a module (not __main__, so main() does not run), then drives
# its Scanner: serially, and through the forked workers directly (no size threshold, no fallback).
DRIVER = r'''
import json, sys
text = sys.stdin.read()
ns = {"__name__": "bundled_gate_scan"}
exec(compile(text, "<gate_scan>", "exec"), ns)
from gpuops.remote import scan_workers
root = sys.argv[1]
serial = ns["Scanner"](root)
serial_gates = serial.run(1)
forked = ns["Scanner"](root)
forked.read_files()
gates = scan_workers.run_forked(forked, sorted(forked.texts), 2)
if gates is not None:
    gates.sort(key=lambda g: (g["file"], g["line"], g["condition"]["span"][1]))
    for gate in serial_gates:
        gate.pop("id")
print(json.dumps({"workers_file": scan_workers.__file__, "forked": gates, "serial": serial_gates,
                  "forked_predicates": forked.predicates, "serial_predicates": serial.predicates}))
'''


def test_the_bundle_carries_every_stage_module_of_the_scanner():
    bundle = find_bundle("gate_scan", REMOTE_DIR)
    stages = sorted(p.stem for p in REMOTE_DIR.glob("scan_*.py"))
    # gate_tree: the condition tree's walks, shared with gpuops.gates at home.
    assert sorted(name.rsplit(".", 1)[1] for name in bundle.modules) == sorted(stages + ["gate_tree"])


def test_forked_workers_run_inside_the_bundle_and_give_the_serial_result(tmp_path):
    site = make_site(tmp_path, FILES)
    done = subprocess.run([sys.executable, "-I", "-c", DRIVER, str(site / "sglang")], input=source("gate_scan"),
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # The bundle, not an installed gpuops, served the modules the workers ran.
    assert out["workers_file"] == "<gpuops-bundle:gpuops.remote.scan_workers>"
    assert out["forked"] is not None, "the forked workers failed (the scan would fall back to serial)"
    assert out["serial"], "the snippets hold gates"
    assert out["forked"] == out["serial"]
    assert out["forked_predicates"] == out["serial_predicates"]
