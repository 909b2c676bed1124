"""Figures from the stand-in say so wherever they appear: (sim) in tables and verdicts, a stamp on plots."""

from __future__ import annotations

import base64
import copy
import io
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.bench import simulated
from gpuops.bench.report import write_report
from gpuops.bench.suite_decode import plot_token_rate as _token_rate_plot
from gpuops.bench.store import ResultsStore
from gpuops.cli import cli
from test_results_store import allreduce_run, decode_run, make  # the shared result builders

LABEL = "rtx-pro-6000-pcie-x8 v2"


def simulated_result(run_id: str, rate: float, fusion: bool = False) -> dict:
    """A stand-in's result, with the record the stand-in reports for the field report's shape."""
    from gpuops.lab import speed_model

    result = make(decode_run(run_id, rate, fusion=fusion))
    prediction = speed_model.load().predict("rtx-pro-6000-pcie-x8", speed_model.Settings(
        tp=8, speculative=True, fusion=fusion), "8 GPU(s), compute capability 12.0, no NVLink")
    result["server"]["speed_model"] = prediction.as_record()
    assert prediction.label == LABEL
    return result


def measured(result: dict, run_id: str) -> dict:
    """The same figures as if a real server had produced them."""
    real = copy.deepcopy(result)
    real["server"]["simulated"] = False
    real["server"].pop("speed_model", None)
    real["id"] = run_id
    return real


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, list[str]]:
    results = tmp_path / "results"
    base, fused = simulated_result("r1", 60.0), simulated_result("r2", 94.3, fusion=True)
    real_base, real_fused = measured(base, "realbase01"), measured(fused, "realfused1")
    for result in (base, fused, real_base, real_fused):
        ResultsStore(results).save(result)
    return results, [base["id"], fused["id"], real_base["id"], real_fused["id"]]


def run(*args: str) -> str:
    done = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.output


def _red_pixels(png: bytes) -> int:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.image as mpimg

    pixels = mpimg.imread(io.BytesIO(png), format="png")
    red = (pixels[:, :, 0] > 0.7) & (pixels[:, :, 1] < 0.15) & (pixels[:, :, 2] < 0.15)
    return int(red.sum())


def test_compare_marks_every_simulated_figure_and_verdict(store):
    results, (base, fused, real_base, real_fused) = store
    out = run("results", "compare", "--results-dir", str(results), base, fused)
    rate = next(line for line in out.splitlines() if line.startswith("output tokens/s"))
    assert re.search(r"60\.0 \(sim\)\s+94\.3 \(sim\) \+57\.2% better \(sim\)", rate), rate
    table = out.split("\n\n")[0]
    assert not re.search(r"(better|worse)(?! \(sim\))", table)  # never a bare verdict
    assert all("(sim)" in cell for line in table.splitlines()[1:] for cell in re.split(r"\s{2,}", line)[1:])
    assert f"(sim): simulated by the lab's stand-in server, model {LABEL}" in out
    # A simulated column against a measured baseline (or the reverse) is still marked.
    mixed = run("results", "compare", "--results-dir", str(results), real_base, fused)
    assert "better (sim)" in mixed and re.search(r"\(tok/s\)\s+60\.0\s+94\.3 \(sim\)", mixed)
    assert "better (sim)" in run("results", "compare", "--results-dir", str(results), base, real_fused)
    # Two measurements: plain words, no marks.
    real = run("results", "compare", "--results-dir", str(results), real_base, real_fused)
    assert "(sim)" not in real and "+57.2% better" in real
    doc = run("results", "compare", "--json", "--results-dir", str(results), base, real_fused)
    assert '"simulated": [\n    true,\n    false\n  ]' in doc and LABEL in doc


def test_list_and_show_mark_simulated_figures(store):
    results, (base, fused, real_base, _) = store
    listed = run("results", "list", "--results-dir", str(results))
    rows = {line.split()[0]: line for line in listed.splitlines()[1:] if line.strip() and not line.startswith("(")}
    assert "60.0 (sim)" in rows[base] and "94.3 (sim)" in rows[fused]
    assert "(sim)" not in rows[real_base] and "60.0" in rows[real_base]
    assert LABEL in listed.splitlines()[-1]
    shown = run("results", "show", "--results-dir", str(results), base)
    assert f"SIMULATED — stand-in model {LABEL}" in shown
    assert re.search(r"output_tokens_per_s: 60\.0 \(sim\)", shown)
    assert re.search(r"itl_ms: .*p50 [\d,.]+ \(sim\)", shown)
    assert "completed: 3.00\n" in shown  # counts are exact, not simulated
    # Where the model's numbers come from, down to the published figures.
    assert "model input verify_ms = 30 ms: published, source field-report" in shown
    assert "model input eagle3_num_steps = 3 draft steps: assumption, source lab" in shown
    assert "(sim)" not in run("results", "show", "--results-dir", str(results), real_base)


def test_an_index_from_before_the_marks_is_rebuilt(store):
    results, ids = store
    with sqlite3.connect(results / "index.sqlite") as db:
        db.execute("ALTER TABLE results DROP COLUMN speed_model")
    entries = {e.id: e for e in ResultsStore(results).entries()}
    assert entries[ids[0]].simulated and entries[ids[0]].speed_model == LABEL
    assert not entries[ids[2]].simulated and entries[ids[2]].speed_model is None


def test_the_stamp_is_drawn_on_the_image_itself():
    import matplotlib

    matplotlib.use("Agg", force=True)
    sim = [simulated_result("r1", 60.0), simulated_result("r2", 94.3, fusion=True)]
    real = [measured(r, f"real{i}") for i, r in enumerate(sim)]
    stamped, plain = _token_rate_plot(sim), _token_rate_plot(real)
    assert stamped != plain
    assert _red_pixels(stamped) > 500 and _red_pixels(plain) == 0  # the red banner and the diagonal mark

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    assert simulated.stamp_figure(fig, sim[:1])
    texts = [t.get_text() for t in fig.findobj(lambda a: a.get_gid() == simulated.STAMP_GID)]
    assert f"SIMULATED — stand-in model {LABEL}" in texts and texts.count("SIMULATED") == 2  # one per axes
    assert not simulated.stamp_figure(fig, real)
    plt.close(fig)


def test_every_report_plot_of_simulated_results_is_stamped(tmp_path: Path):
    results = [simulated_result("r1", 60.0), simulated_result("r2", 94.3, fusion=True),
               make(allreduce_run("a1"), suite="allreduce")]  # a real measurement: no stamp on its plot
    html_path, md_path = write_report(results, tmp_path / "report.html")
    html = html_path.read_text()
    images = dict(re.findall(r"<img id='plot-([a-z_]+)' alt='[a-z_]+' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", html))
    assert {"tokens_per_s", "itl_distribution", "allreduce_latency"} <= set(images)
    for name, data in images.items():
        assert (_red_pixels(base64.b64decode(data)) > 500) == (name != "allreduce_latency"), name
    assert "60.0 (sim)" in html and f"model {LABEL}" in html
    assert f"What stand-in model {LABEL} predicts from" in html
    assert "<td>verify_allreduce_ms</td><td>25</td><td>ms</td><td>published</td><td>field-report</td>" in html
    markdown = md_path.read_text()
    assert "> SIMULATED." in markdown and "60.0 (sim)" in markdown and "94.3 (sim) +57.2%" in markdown


def test_tune_ranking_marks_simulated_trials(capsys):
    from gpuops.commands.tune import _render

    trial = {"variant": "NCCL_ALGO=Ring", "ok": True, "output_tokens_per_s": 82.0, "ttft_ms": 45.0,
             "itl_ms": {"p50": 12.2}, "result_id": "abc", "simulated": True, "speed_model": LABEL}
    real = {**trial, "variant": "baseline (as configured)", "simulated": False, "speed_model": None}
    _render({"hosts": {"h01": {"ranking": [trial, real], "kept": None, "restored": True}}, "interrupted": False,
             "variants": [{"label": "NCCL_ALGO=Ring"}]})  # the document's shape: tune's _document
    out = capsys.readouterr().out
    ring = next(line for line in out.splitlines() if "NCCL_ALGO=Ring" in line)
    assert re.search(r"82\.0 \(sim\)\s+45\.0 \(sim\)\s+12\.20 \(sim\)", ring), ring
    assert "(sim)" not in next(line for line in out.splitlines() if "baseline" in line)
    assert f"model {LABEL}" in out


def test_bench_tables_mark_simulated_hosts(capsys):
    from gpuops.commands.bench import _render_bench

    level = {"concurrency": 4, "request_throughput": 1.5, "total_output_tokens_per_s": 220.0,
             "output_tokens_per_s": 55.0, "ttft_ms_p50": 64.0, "itl_ms_p50": 13.0}
    sim = {"ok": True, "simulated": True, "speed_model": LABEL, "output_tokens_per_s": 60.0, "ttft_ms": 45.0,
           "itl_ms": {"p50": 16.7, "p90": 18.0, "p99": 21.0}, "accept_length": 1.86, "result_id": "abc",
           "error": None, "levels": [level], "result_file": None}
    real = {**sim, "simulated": False, "speed_model": None}
    _render_bench({"suite": "serving", "hosts": {"sim01": sim, "real01": real}})
    lines = capsys.readouterr().out.splitlines()
    sim_rows = [line for line in lines if line.startswith("sim01")]
    real_rows = [line for line in lines if line.startswith("real01")]
    assert len(sim_rows) == 2 and all(line.count("(sim)") >= 5 for line in sim_rows)  # summary and level rows
    assert len(real_rows) == 2 and not any("(sim)" in line for line in real_rows)
    assert any(f"model {LABEL}" in line for line in lines)
