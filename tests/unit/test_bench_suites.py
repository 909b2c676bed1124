"""The bench suite registry is the one list: the host client, the CLI and the payload agree with it,
and each suite's command takes exactly the options the registry gives it."""

from __future__ import annotations

import click
import pytest

from gpuops.bench.options import AllreduceOptions, BenchOptions, build_payload
from gpuops.bench.suites import COMMON_OPTIONS, SUITES
from gpuops.commands.bench import bench
from gpuops.commands.bench_options import BENCH_OPTIONS
from gpuops.remote import bench_client


def test_the_host_client_runs_every_registered_suite_and_no_other():
    assert set(bench_client.SUITES) == set(SUITES)
    for name in SUITES:
        assert bench_client.suite_module({"suite": name}) is not None
    assert bench_client.suite_module({"suite": "nope"}) is None


def test_every_bench_option_belongs_to_a_suite_or_to_all():
    used = set(COMMON_OPTIONS).union(*(s.options for s in SUITES.values()))
    assert {name for name, _ in BENCH_OPTIONS} <= used
    # and the registry names no option the CLI does not define
    assert used <= {name for name, _ in BENCH_OPTIONS} | {"inventory", "limit"}


@pytest.mark.parametrize("name", list(SUITES))
def test_each_suite_command_takes_only_its_options(name):
    command = bench.commands[name]
    assert isinstance(command, click.Command)
    taken = {p.name for p in command.params if isinstance(p, click.Option)}
    others = {n for n, _ in BENCH_OPTIONS} - set(COMMON_OPTIONS) - set(SUITES[name].options)
    assert set(SUITES[name].options) <= taken
    assert not taken & others, f"{name} takes options of other suites: {sorted(taken & others)}"


@pytest.mark.parametrize("name", list(SUITES))
def test_torchrun_suites_carry_their_worker_and_the_others_do_not(name):
    spec = SUITES[name]
    options = BenchOptions(suite=name, allreduce=AllreduceOptions(tokens=spec.default_tokens or (1,)))
    payload = build_payload(options, "r1", "http://127.0.0.1:1", {}, "WORKER" if spec.torchrun else None)
    assert ("allreduce" in payload) == spec.torchrun
    assert bool(payload["record_file"]) == spec.torchrun
    if spec.torchrun:
        assert payload["allreduce"]["kind"] == name


def test_stored_results_of_unknown_suites_are_neither_kind():
    from gpuops.bench.suites import is_torchrun, sends_requests

    assert [n for n in SUITES if is_torchrun(n)] == ["allreduce", "fusion"]
    assert [n for n in SUITES if sends_requests(n)] == ["decode", "serving"]
    for name in (None, "", "nope", 3):
        assert not is_torchrun(name) and not sends_requests(name)


@pytest.mark.parametrize("name", list(SUITES))
def test_each_suite_has_its_reader_of_stored_results(name):
    from gpuops.bench.suites import reader

    module = reader(name)
    assert module.__name__ == f"gpuops.bench.suite_{name}"
    for function in ("headline", "figures", "levels", "within_run", "across_repeats", "merge_repeats", "summarize",
                     "finish", "report_tables", "bench_tables"):
        assert callable(getattr(module, function)), (name, function)
    empty = {"suite": name, "summary": {}}
    assert isinstance(module.headline({}, empty), dict)
    assert all(len(key) == 3 for key in module.figures({}, empty))
    assert isinstance(module.levels(empty), list)
    assert isinstance(module.within_run(empty), dict) and isinstance(module.across_repeats([{}]), dict)
    assert isinstance(module.merge_repeats(dict(empty), [empty]), dict)
    assert module.report_tables([]) == [] and all(callable(maker) for _, _, maker in module.PLOTS)
    assert [rows for _, _, rows in module.bench_tables({})] == [[] for _ in module.bench_tables({})]


def test_plot_names_are_unique_across_suites():
    from gpuops.bench.suites import reader

    names = [name for suite in SUITES for name, _, _ in reader(suite).PLOTS]
    assert len(names) == len(set(names)) and names


def test_a_stored_result_of_an_unknown_suite_reads_with_the_defaults():
    from gpuops.bench.compare import _figures
    from gpuops.bench.export import rows
    from gpuops.bench.results import headline
    from gpuops.bench.suites import reader

    old = {"suite": "retired", "id": "r1", "ok": True, "summary": {"output_tokens_per_s": 5.0}}
    assert reader("retired").__name__ == "gpuops.bench.suite_base" and reader(None).__name__ == "gpuops.bench.suite_base"
    assert _figures(old) == {}
    assert headline(old)["output_tokens_per_s"] == 5.0 and "levels" not in headline(old)
    assert [r["level"] for r in rows([old])] == ["all"]


def test_the_readers_of_stored_results_do_not_branch_on_suite_names():
    """Per-suite summaries and reading live in bench/suite_<name>.py, found through the registry."""
    import inspect
    import re

    from gpuops.bench import compare, export, repeats, report, results
    from gpuops.commands.bench import _render_bench

    for source in (inspect.getsource(compare), inspect.getsource(export), inspect.getsource(repeats),
                   inspect.getsource(report), inspect.getsource(_render_bench),
                   inspect.getsource(results)):
        assert not re.search(r"""suite["')]*\s*(==|!=|in)\s*[("']""", source), source[:80]
