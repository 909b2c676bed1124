"""results export (CSV, JSON Lines, Prometheus) and the report's all-reduce and fusion parts, on the
real result files from two H200s (benchmarks/results/h200-x2/results)."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from labtools import gpuops_cli as gpuops

REAL = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200-x2" / "results"


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real")
    shutil.copytree(REAL, root / "results")
    return root


def _ids(root: Path) -> dict[str, str]:
    """suite/mode name -> result id, read from the files."""
    out = {}
    for path in (root / "results").glob("*.json"):
        doc = json.loads(path.read_text())
        summary = doc["summary"]
        key = doc["suite"] if doc["suite"] == "fusion" else (
            f"ar-w{summary['world_size']}-{'graph' if summary['cuda_graph'] else 'eager'}")
        if doc["suite"] == "fusion":
            key += f"-w{summary['world_size']}"
        if "timed out" in " ".join(doc["errors"]):
            key = "hang"
        out[key] = doc["id"]
    return out


def test_csv_has_one_row_per_result_and_level_with_the_configuration_flattened(results_dir: Path):
    ids = _ids(results_dir)
    done = gpuops("results", "export", ids["ar-w2-graph"], ids["fusion-w2"], cwd=results_dir)
    assert done.returncode == 0, done.stderr
    table = list(csv.DictReader(io.StringIO(done.stdout)))
    allreduce = [r for r in table if r["suite"] == "allreduce"]
    fusion = [r for r in table if r["suite"] == "fusion"]
    assert len(allreduce) == 6 * 6 and len(fusion) == 9 * 2  # variants x sizes; tokens x modes
    ring = next(r for r in allreduce if r["variant"] == "NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0 NCCL_PROTO=LL"
                and r["tokens"] == "1")
    assert float(ring["latency_us"]) == pytest.approx(12.16, abs=0.01) and ring["cuda_graph"] == "True"
    assert ring["fingerprint"] and ring["config.extra.allreduce_world_size"] == "2"
    fused = next(r for r in fusion if r["level"] == "x1 graph")
    assert float(fused["fused_us"]) == pytest.approx(5.13, abs=0.01) and fused["correct"] == "True"
    jsonl = gpuops("results", "export", "--format", "jsonl", ids["fusion-w2"], cwd=results_dir).stdout
    rows = [json.loads(line) for line in jsonl.splitlines()]
    assert len(rows) == 18 and rows[0]["result_id"] == ids["fusion-w2"]


def test_prometheus_text_is_well_formed(results_dir: Path):
    out = results_dir / "metrics.prom"
    done = gpuops("results", "export", "--format", "prometheus", "-o", str(out), cwd=results_dir)
    assert done.returncode == 0 and "rows from 7 results" in done.stderr
    sample = re.compile(r'^gpuops_bench_[a-z0-9_]+\{(?:[a-z_]+="(?:[^"\\]|\\.)*",?)+\} -?[0-9.e+-]+$')
    lines = out.read_text().splitlines()
    declared = set()
    for line in lines:
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:]
            assert kind == "gauge" and name not in declared
            declared.add(name)
        else:
            assert sample.match(line), line
            assert line.split("{")[0] in declared
    assert any(line.startswith('gpuops_bench_fused_us{') and 'level="x1 graph"' in line for line in lines)


def test_report_has_the_allreduce_and_fusion_tables_and_valid_plots(results_dir: Path):
    done = gpuops("report", "-o", "rep/report.html", cwd=results_dir)
    assert done.returncode == 0, done.stderr
    page = (results_dir / "rep" / "report.html").read_text()
    assert page.count("<h2>All-reduce</h2>") == 5 and page.count("<h2>Fused vs unfused</h2>") == 2
    assert "timed out after 30 s (hung collective)" in page
    assert "world size 1: there is nothing to all-reduce" in page
    for name in ("allreduce_latency", "fusion"):
        data = re.search(rf"id='plot-{name}' alt='{name}' src='data:image/png;base64,([^']+)'", page).group(1)
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    assert "SIMULATED" not in page  # real GPU results: never stamped
    md = (results_dir / "rep" / "report.md").read_text()
    assert "| 1 | graph | 5.13 | 10.6 |" in md
