"""Everything a host says is data: its terminal control sequences never reach the operator's screen.

A lab host whose replayed nvidia-smi reports a GPU name, and whose server reports a version and a
served model name, each carrying ``ESC ] 0;pwned BEL`` (retitle), ``ESC [2J`` (clear), ``ESC [31m``
(colour) and C1 CSI (U+009B). Every command an operator would run (inspect, apply, history, bench,
results, report, tune, advise, lab) prints them as ``\\x1b``-style
escapes (text) or keeps the exact value (JSON); the files gpuops writes at home say the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\x9b0m"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mEVIL\\x9b0m"  # what a terminal must show instead
CONTROLS = ("\x1b", "\x07", "\x9b")


def _hostile_gpu_names(lab) -> None:
    """The host's nvidia-smi (the lab replays this file) now names every GPU with control codes."""
    path = lab.host("h01").dir / "gpu.json"
    replay = json.loads(path.read_text())
    for gpu in replay["gpus"]:
        gpu["name"] = "NVIDIA " + HOSTILE
    path.write_text(json.dumps(replay))


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _assert_safe(text: str, where: str) -> None:
    for control in CONTROLS:
        assert control not in text, f"{where}: raw {control!r} reached the output:\n{text[:3000]}"


def test_host_text_is_escaped_in_every_command_and_exact_in_json(lab_factory, run_gpuops, gpuops_home: Path,
                                                                   tmp_path: Path) -> None:
    from gpuops.lab.hosts import LabSpec

    lab = lab_factory(LabSpec(
        gpu="rtx-pro-6000-ws-x4", sglang="0.5.8", names=("h01",),
        server_args=("--model-path", "/models/Qwen3-32B", "--tp", "4", "--served-model-name", "m" + HOSTILE),
        server_env={"GPUOPS_STANDIN_VERSION": "0.5.8" + HOSTILE, "GPUOPS_STANDIN_CRASH_IF": "NCCL_ALGO=Tree"},
    ))
    _hostile_gpu_names(lab)
    inv = str(lab.inventory_path)
    results = tmp_path / "results"
    fast = ("-e", "gpuops_health_timeout=60", "-e", "gpuops_stop_grace=5")

    def text(*args: str, shows: bool = True) -> str:
        proc = run_gpuops(*args, timeout=400)
        both = proc.stdout + proc.stderr
        _assert_safe(both, " ".join(args[:2]))
        if shows:  # the hostile field did reach this output (escaped), so the check above means something
            assert "\\x1b]0;pwned" in both, f"{' '.join(args[:2])}: no host text in:\n{both[:3000]}"
        return proc.stdout

    inspected = text("inspect", "host", "-i", inv)
    assert "NVIDIA " + SHOWN in inspected, inspected
    document = json.loads(run_gpuops("inspect", "host", "-i", inv, "--json").stdout)
    assert "NVIDIA " + HOSTILE in _strings(document), "JSON keeps the exact value"
    assert "m" + HOSTILE in _strings(document), document
    text("inspect", "gates", "-i", inv, shows=False)
    # a failed apply: the stand-in crashes on NCCL_ALGO=Tree after logging its arguments (the served
    # model name among them): the log tail and the error come back from the host
    failed = text("apply", "nccl-env", "-i", inv, "--diff", "-e", '{"nccl_env": {"NCCL_ALGO": "Tree"}}', *fast)
    assert "rolled back" in failed or "rolled_back" in failed, failed
    text("history", "-i", inv, shows=False)
    bench = run_gpuops("bench", "--remote", "-i", inv, "--suite", "decode", "--results-dir", str(results),
                       "--num-requests", "2", "--warmup", "0", "--input-len", "16", "--output-len", "16", "--json",
                       timeout=400)
    _assert_safe(bench.stdout + bench.stderr, "bench --json")
    result_id = json.loads(bench.stdout)["hosts"]["h01"]["result_id"]
    text("bench", "--remote", "-i", inv, "--suite", "decode", "--results-dir", str(results), "--num-requests", "2",
         "--warmup", "0", "--input-len", "16", "--output-len", "16", shows=False)
    text("results", "list", "--results-dir", str(results), shows=False)
    text("results", "show", "--results-dir", str(results), result_id)
    from gpuops.bench.store import ResultsStore

    ids = [entry.id for entry in ResultsStore(results).entries()]
    assert len(ids) == 2 and result_id in ids, ids
    text("results", "compare", "--results-dir", str(results), *ids, shows=False)
    text("results", "export", "--results-dir", str(results))
    report = tmp_path / "report.html"
    text("report", "--results-dir", str(results), "-o", str(report), result_id, shows=False)
    for written in (report, report.with_suffix(".md")):
        _assert_safe(written.read_text(), written.name)
    # tune: its ranking table, the crashing variant's error (the host's log tail carries the served
    # model name) and its notes, all host text
    text("tune", "-i", inv, "--sweep", "NCCL_ALGO=Tree", "--results-dir", str(tmp_path / "tuned"),
         "--num-requests", "2", "--warmup", "0", "--input-len", "16", "--output-len", "16")
    text("advise", "-i", inv, "--results-dir", str(results), shows=False)  # facts and its own words only
    text("lab", "status", "--dir", str(lab.root), shows=False)
    stored = ResultsStore(results).load(result_id)
    assert any(HOSTILE in value for value in _strings(stored)), "the stored result keeps the exact value"
