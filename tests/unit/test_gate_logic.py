"""Pure parts of the gate audit: three-valued evaluation, capability parsing, the catalog, the probe
script and the scanner's JSON (no subprocess, no release)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpuops.errors import GpuopsError
from gpuops.gates.catalog import catalog_from_data, load_catalog
from gpuops.gates.evaluate import judge
from gpuops.gates.logic import Evaluator, GpuTarget, PredicateBook, admits, cap_verdict, parse_capability, server_key
from gpuops.gates.patch import UnrecognisedLayout, plan_gate_patch
from gpuops.gates.predicates import fallback_meaning
from gpuops.gates.probe import gate_scan_script, parse_gate_scan
from gpuops.gates.scan import GateScan, parse_scan_output, scan_from_dict

SPAN = [1, 0, 1, 1]


def pred(name: str, form: str = "call") -> dict:
    return {"op": "cap", "atom": {"kind": "pred", "name": name, "form": form, "def": None}, "span": SPAN, "text": name}


def clause(text: str, **extra) -> dict:
    return {"op": "clause", "text": text, "span": SPAN, **extra}


def gate(condition: dict, polarity: int = 1, **extra) -> dict:
    return {"id": "x.py::f#1", "file": "x.py", "line": 1, "function": "f", "kind": "if", "polarity": polarity,
            "condition": condition, "text": "...", "effect": {}, "reads": [], "within": [], **extra}


BOOK = PredicateBook(GateScan(known=True))


@pytest.mark.parametrize("text, expected", [
    ("12.0", (12, 0)), ("9.0", (9, 0)), ("10.3", (10, 3)), ("sm120", (12, 0)), ("SM_90", (9, 0)),
    ("121", (12, 1)), ("", None), ("blackwell", None), (None, None),
])
def test_parse_capability(text, expected):
    assert parse_capability(text) == expected


def test_kleene_and_guard_polarity():
    sm90_or_sm100 = {"op": "or", "args": [pred("is_sm90_supported"), pred("is_sm100_supported")], "span": [2, 0, 2, 9]}
    condition = {"op": "and", "args": [sm90_or_sm100, clause("self.tp_size > 1")], "span": [3, 0, 3, 9]}
    sm120 = GpuTarget(12, 0, (12, 8))
    assert cap_verdict(gate(condition), BOOK, sm120).status == "blocked"  # False and unknown = False
    assert cap_verdict(gate(condition), BOOK, GpuTarget(9, 0, (12, 8))).status == "open"  # True and unknown: clauses decide
    guard = gate({"op": "not", "arg": sm90_or_sm100, "span": [4, 0, 4, 9]}, polarity=-1)
    assert cap_verdict(guard, BOOK, sm120).status == "blocked"
    assert admits(guard, BOOK) == ["sm90", "sm100", "sm103"]


def test_cuda_version_matters_only_where_the_major_matches():
    g = gate(pred("is_sm90_supported"))
    assert cap_verdict(g, BOOK, GpuTarget(9, 0, None)).status == "unknown"
    assert cap_verdict(g, BOOK, GpuTarget(9, 0, (12, 2))).status == "blocked"  # needs CUDA 12.3
    assert cap_verdict(g, BOOK, GpuTarget(12, 0, None)).status == "blocked"


def test_unknown_predicate_is_unknown_unless_it_cannot_matter():
    weird = pred("is_weird_gpu_supported")
    assert cap_verdict(gate(weird), BOOK, GpuTarget(12, 0, (12, 8))).status == "unknown"
    both = {"op": "and", "args": [weird, pred("is_sm90_supported")], "span": [5, 0, 5, 1]}
    assert cap_verdict(gate(both), BOOK, GpuTarget(12, 0, (12, 8))).status == "blocked"  # sm90 already says no


def test_fallback_table_and_names():
    assert fallback_meaning("_is_sm100_supported").majors == (10,)
    assert fallback_meaning("is_sm103").exact == ((10, 3),)
    assert fallback_meaning("is_sm100_or_newer").at_least
    assert fallback_meaning("is_sm120").exact == ((12, 0),)
    assert fallback_meaning("is_ready") is None


def test_server_clauses():
    ev = Evaluator(BOOK, GpuTarget(12, 0, (12, 8)), {"args": {"--tp-size": 8, "nnodes": 1}, "architecture": "KimiK25ForConditionalGeneration"})
    assert ev.eval(clause("self.tp_size > 1", ref="self.tp_size", cmp=">", value=1)) is True
    assert ev.eval(clause("view.nnodes == 2", ref="view.nnodes", cmp="==", value=2)) is False
    assert ev.eval(clause("model_arch in [...]", ref="model_arch", cmp="in", value=["KimiK25ForConditionalGeneration"])) is True
    assert ev.eval(clause("self.unknown_flag", ref="self.unknown_flag")) is None
    assert server_key("hf_config.architectures[0]") == "architecture"


def test_command_line_strings_and_defaults():
    """A running server's argv gives strings ("--tp 8") and omits defaults."""
    ev = Evaluator(BOOK, GpuTarget(9, 0, (12, 8)), {"args": {"--tp": "8", "--enable-dp-attention": True},
                                               "defaults": {"nnodes": 1, "moe_a2a_backend": "none"}})
    assert ev.eval(clause("self.tp_size > 1", ref="self.tp_size", cmp=">", value=1)) is True
    assert ev.eval(clause("self.nnodes == 1", ref="self.nnodes", cmp="==", value=1)) is True
    assert ev.eval(clause("not dp", ref="is_dp_attention_enabled()")) is True
    assert ev.eval(clause("a2a", ref="view.moe_a2a_backend", cmp="==", value="none")) is True
    assert ev.eval(clause("ep", ref="self.ep_size", cmp=">", value=1)) is None  # not given, no default


def test_catalog_loads_and_rejects_bad_shapes():
    catalog = load_catalog()
    feature = catalog.feature("flashinfer_allreduce_fusion")
    assert [r.role for r in feature.rules][:2] == ["hardware", "auto_enable"]
    with pytest.raises(GpuopsError, match="no feature 'nope'"):
        catalog.feature("nope")
    with pytest.raises(GpuopsError, match="'role' must be one of"):
        catalog_from_data({"features": {"f": {"gates": [{"role": "sometimes", "match": {"reads": ["x"]}}]}}}, "c.yaml")
    with pytest.raises(GpuopsError, match="c.yaml: feature 'f': gate rule 1: 'match' must use only"):
        catalog_from_data({"features": {"f": {"gates": [{"role": "runtime", "match": {"line": 3}}]}}}, "c.yaml")
    with pytest.raises(GpuopsError, match="bad regex"):
        catalog_from_data({"features": {"f": {"gates": [{"role": "runtime", "match": {"message": "("}}]}}}, "c.yaml")


def test_catalog_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "cat.yaml"
    bad.write_text("features: [1, 2\n")
    with pytest.raises(GpuopsError, match=f"{bad}:2:1: malformed YAML: .*expected ',' or ']'"):
        load_catalog(bad)
    with pytest.raises(GpuopsError, match="cannot read the gate catalog"):
        load_catalog(tmp_path / "missing.yaml")


def _one_feature_catalog(name: str) -> str:
    return json.dumps({"features": {name: {"gates": [{"role": "runtime", "match": {"reads": ["x"]}}]}}})


def test_a_catalog_file_is_parsed_once_while_it_stays_the_same_file(tmp_path):
    # inspect asks for the catalog ten times a host: one parse per process, unless the file changes.
    assert load_catalog() is load_catalog()
    path = tmp_path / "cat.yaml"
    path.write_text(_one_feature_catalog("alpha"))
    first = load_catalog(path)
    assert load_catalog(str(path)) is first
    path.write_text(_one_feature_catalog("alpha_beta"))  # edited in place: another size
    assert [f.name for f in load_catalog(path).features] == ["alpha_beta"]
    # The same size and the mtime put back: the inode of a replacement still tells them apart.
    stat = path.stat()
    replacement = tmp_path / "new.yaml"
    replacement.write_text(_one_feature_catalog("alpha_betb"))
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)
    assert [f.name for f in load_catalog(path).features] == ["alpha_betb"]
    path.write_text("features: [1, 2\n")
    with pytest.raises(GpuopsError, match="malformed YAML"):  # a bad file fails every time, is never kept
        load_catalog(path)
    with pytest.raises(GpuopsError, match="malformed YAML"):
        load_catalog(path)


@pytest.mark.parametrize("stdout, reason", [
    ("", "printed nothing"),
    ("not json", "not JSON"),
    (json.dumps({"scanner": 99, "ok": True}), "version 99"),
    (json.dumps({"scanner": 1, "ok": False, "reason": "sglang is not installed for /usr/bin/python3"}), "sglang is not installed"),
    (json.dumps({"scanner": 1, "ok": True, "gates": [{"no": "id"}]}), "no valid gate list"),
])
def test_scanner_output_problems_are_unknown_never_a_crash(stdout, reason):
    scan = parse_scan_output(stdout, "boom", 1)
    assert not scan.known and reason in (scan.reason or "")
    report = judge(scan, "12.0", "12.8")
    assert report.features["flashinfer_allreduce_fusion"]["status"] == "unknown"
    with pytest.raises(UnrecognisedLayout, match="no gate scan"):
        plan_gate_patch(scan, {}, "flashinfer_allreduce_fusion", "sm120")


def test_noise_before_the_json_line_is_ignored():
    doc = {"scanner": 1, "ok": True, "gates": [], "version": "0.5.8"}
    assert parse_scan_output("sitecustomize says hi\n" + json.dumps(doc)).version == "0.5.8"
    assert scan_from_dict([]).known is False


def test_probe_script_keeps_options_and_text_out_of_the_shell(tmp_path):
    hostile = {"root": str(tmp_path / "a'b $(touch pwned) `x`"), "keywords": ["it's"]}
    script = gate_scan_script(hostile)
    # On stdin, as the gather sends it (`sh -s`): the bundled scanner is over the 128 KiB one
    # argument may hold, so `sh -c script` is refused by the kernel (E2BIG) before sh runs.
    done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, cwd=tmp_path,
                          env={"GPUOPS_PY": "python3", "PATH": "/usr/bin:/bin:/usr/local/bin"})
    scan = parse_gate_scan(type("Out", (), {"stdout": done.stdout, "stderr": done.stderr, "exit_status": done.returncode})())
    assert not (tmp_path / "pwned").exists()
    assert not scan.known and "no sglang package at" in (scan.reason or "") and "$(touch pwned)" in scan.reason
    no_python = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, env={"GPUOPS_PY": ""})
    assert "no python 3.8+ found on the host" in no_python.stdout


def test_scanner_refuses_its_own_terminator(monkeypatch):
    import gpuops.gates.probe as probe

    monkeypatch.setattr(probe, "scanner_source", lambda: "x = 1\nGPUOPS_GATE_SCAN_EOF\n")
    with pytest.raises(ValueError, match="heredoc terminator"):
        probe.gate_scan_script({})
