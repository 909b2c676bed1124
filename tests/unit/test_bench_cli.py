"""The commands as users type them: bench (local), results list/show/compare, report, bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpuops.lab.standin_process import start_standin
from labtools import gpuops_cli as gpuops
from labtools import gpuops_cli_forked


@pytest.fixture(scope="module")
def two_results(tmp_path_factory) -> tuple[Path, list[str]]:
    """Two decode results in one results dir: a plain stand-in, then one with the fusion flag."""
    root = tmp_path_factory.mktemp("cli")
    ids = []
    base = ("--model-path", "/models/Kimi-K2.5", "--tp", "8")
    # the one-command form (--suite) and the suite's own command run the same benchmark
    for flags, suite_args in ((base, ("--suite", "decode")),
                              (base + ("--enable-flashinfer-allreduce-fusion",), ("decode",))):
        with start_standin(root / "logs", flags, {"GPUOPS_STANDIN_TTFT_MS": "5", "NCCL_P2P_LEVEL": "SYS"}) as server:
            done = gpuops("bench", *suite_args, "--url", server.url, "--output-len", "24",
                          "--num-requests", "2", "--warmup", "1", "--json", cwd=root)
        assert done.returncode == 0, done.stderr
        line = json.loads(done.stdout)["hosts"]["localhost"]
        assert line["ok"] and Path(root, line["result_file"]).is_file()
        ids.append(line["result_id"])
    return root, ids


def test_bench_json_schema_and_default_results_dir(two_results):
    root, ids = two_results
    files = sorted((root / "results").glob("*.json"))
    assert len(files) == 2
    stored = json.loads(files[0].read_text())
    assert stored["schema"] == "gpuops.bench.result/1" and stored["id"] in ids
    # speed model: 82 tok/s plain decode at tp 8, 116 with fusion. The stand-in sleeps to that pace,
    # and a loaded machine only makes sleeps longer: the rate is never above it, and half of it would
    # be a miscount (a token counted twice, or a chunk missed), not load.
    assert 0.5 * 82.0 < stored["summary"]["output_tokens_per_s"] <= 82.0 * 1.1


def test_results_list_show_compare(two_results):
    root, (base, fused) = two_results
    # six commands, each a process forked from one that imported gpuops once (labtools.gpuops_cli_forked)
    listed, human, shown, shown_json, compared, compared_json = gpuops_cli_forked(
        [("results", "list", "--json"), ("results", "list"), ("results", "show", base[:5]),
         ("results", "show", base, "--json"), ("results", "compare", base, fused),
         ("results", "compare", base, fused, "--json")], cwd=root, env=_cli_env())
    assert [r["id"] for r in json.loads(listed.stdout)["results"]] == [base, fused]
    assert base in human.stdout and "decode" in human.stdout
    assert shown.returncode == 0, shown.stderr
    assert f"result {base}" in shown.stdout and "--tp-size 8" in shown.stdout and "NCCL_P2P_LEVEL=SYS" in shown.stdout
    assert json.loads(shown_json.stdout)["id"] == base
    assert compared.returncode == 0, compared.stderr
    assert "better" in compared.stdout
    assert "server_args enable_flashinfer_allreduce_fusion: False -> True" in compared.stdout
    data = json.loads(compared_json.stdout)
    rate = next(m for m in data["metrics"] if m["name"].startswith("output tokens/s"))
    # compare's delta is the stored results' own rates (82 -> 116 tok/s in the speed model; measured
    # through the stand-in's sleeps, so a loaded machine moves them: a whole run saw +24%, not +42%)
    results = [json.loads(f.read_text()) for f in (root / "results").glob("*.json")]
    stored = {r["id"]: r["summary"]["output_tokens_per_s"] for r in results}
    assert rate["values"] == [stored[base], stored[fused]]
    assert rate["delta_pct"][1] == pytest.approx((stored[fused] / stored[base] - 1) * 100)
    assert stored[fused] > stored[base]


def test_report_command(two_results):
    root, ids = two_results
    done = gpuops("report", "-o", "out/report.html", cwd=root)
    assert done.returncode == 0, done.stderr
    html = (root / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and all(i in html for i in ids)
    assert (root / "out" / "report.md").read_text().startswith("# gpuops benchmark report")


BAD_INPUT = [
    (("results", "show", "nope"), "results: no result 'nope'"),
    (("results", "compare", "nope"), "at least two"),
    (("bench", "--suite", "decode", "--remote", "--url", "http://h:1"), "--url is for a local run"),
    (("bench", "--suite", "decode", "--url", "ftp://h"), "is not http://HOST:PORT"),
    (("bench", "--suite", "serving", "--concurrency", "1,a"), "--concurrency"),
    (("bench", "--suite", "allreduce", "--env", "NCCL_ALGO"), "--env"),
    (("bench", "--suite", "allreduce", "--dtype", "int8"), "--dtype"),
    (("bench", "--suite", "decode", "-l", "x"), "add --remote"),
    (("bench", "decode", "-l", "x"), "add --remote"),
    (("bench", "serving", "--concurrency", "1,a"), "--concurrency"),
    (("bench",), "name a suite: gpuops bench decode|serving|allreduce|fusion|profile"),
    (("bench", "--remote", "decode"), "--remote go after the suite"),
    (("report",), "no results"),
]


def _cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GPUOPS_INVENTORY"}  # as labtools.gpuops_cli


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory) -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """Every BAD_INPUT command, each a process forked from one that imported gpuops once (a fresh
    interpreter's case: test_a_suite_command_refuses_another_suites_option)."""
    cwd = tmp_path_factory.mktemp("bad-input")
    commands = [args for args, _ in BAD_INPUT]
    return dict(zip(commands, gpuops_cli_forked(commands, cwd=cwd, env=_cli_env())))


@pytest.mark.parametrize("args,message", BAD_INPUT)
def test_bad_input_is_one_line(bad_input_runs, args, message):
    done = bad_input_runs[args]
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and done.stderr.startswith("gpuops: error: ")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_suite_command_refuses_another_suites_option(tmp_path: Path):
    done = gpuops("bench", "fusion", "--backend", "gloo", cwd=tmp_path)
    assert done.returncode == 2 and "No such option" in done.stderr and "--backend" in done.stderr


def test_compare_prints_a_setting_one_run_lacks_as_unset():
    from gpuops.commands.bench import shown_setting

    assert shown_setting(None) == "(unset)"
    assert shown_setting("1") == "'1'" and shown_setting(False) == "False" and shown_setting("None") == "'None'"
