"""`gpuops profile`: where a forward pass's time goes on each host, from SGLang's own profiler
(thin: the bench runner runs the ``profile`` suite; the summary and its sentence are
``bench/suite_profile.py``'s; schema in docs/profile.md).

JSON (``--json``)::

    {"schema": 1, "results_dir": ..., "hosts": {NAME: {"ok", "error", "result_id", "result_file",
      "simulated", "sentence", "summary": {"steps", "stage_asked", "headline", "stages", "traces"},
      "trace_files"}}}
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import click

from gpuops import time_limits
from gpuops.bench.record import ResultDocument, Summary, at, mapping, number, objects
from gpuops.commands.bench_options import bench_options
from gpuops.commands.options import guide, inventory_options

if TYPE_CHECKING:
    from gpuops.bench.runner import HostBench

EXIT_SOME_HOST_FAILED = 1  # as bench and inspect: 2 is bad input
_OPTIONS = ("remote", "as_json", "results_dir", "url", "port", "api", "input_len", "output_len", "seed",
            "request_timeout", "accept_new_host_keys", "known_hosts", "timeout", "connect_timeout")


@click.command("profile", epilog=guide("profile.md", "bench-and-results.md"))
@inventory_options
@click.option("--steps", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Forward passes SGLang's profiler records per stage.")
@click.option("--stage", type=click.Choice(["decode", "verify", "extend", "all"]), default="decode", show_default=True,
              help="The passes to report (verify: speculative decoding's target-verify passes).")
@click.option("--trace-wait", type=click.FloatRange(1, 3600), default=120.0, show_default=True, metavar="SECONDS",
              help="How long the host waits for every rank's trace after the start (a large model's export takes long).")
@click.option("--fetch-traces", is_flag=True,
              help="Bring the raw traces home too (at most 32 MiB a host, under RESULTS_DIR/traces/).")
@bench_options(_OPTIONS)
def profile(steps: int, stage: str, trace_wait: float, fetch_traces: bool, **params: Any) -> None:
    """Profile each host's SGLang server for a few steps under a small load of gpuops' own: per stage,
    the wall and GPU time of a pass and where it goes (all-reduce and other collectives, GEMM,
    attention, MoE, norm/activation, sampling, copies, idle). The traces are read on the host and
    removed there; the summary is stored like a bench result."""
    from gpuops.bench.options import BenchOptions
    from gpuops.bench.runner import run_bench, targets_for
    from gpuops.bench.store import ResultsStore
    from gpuops.errors import GpuopsError
    from gpuops.inventory import load_inventory, local_inventory
    from gpuops.transport import ConnectOptions

    remote, url = params["remote"], params["url"]
    if url and remote:
        raise GpuopsError("profile: --url is for a local run; with --remote the host's loopback is used")
    if not remote and (params["inventory"] or params["limit"]):
        raise GpuopsError("profile: -i/-l select hosts for --remote; add --remote")
    options = BenchOptions(suite="profile", api=params["api"], input_len=params["input_len"],
                           output_len=params["output_len"], seed=params["seed"],
                           request_timeout_s=params["request_timeout"], profile_steps=steps, profile_stage=stage,
                           fetch_traces=fetch_traces, profile_wait_s=trace_wait)
    hosts = load_inventory(params["inventory"]).select(params["limit"]) if remote else local_inventory().select(None)
    targets = targets_for(hosts, params["port"], url, remote)
    timeout, connect_timeout = time_limits.per_host("profile", params["timeout"]), params["connect_timeout"]
    connect_options = ConnectOptions(accept_new_host_keys=params["accept_new_host_keys"],
                                     known_hosts_files=tuple(params["known_hosts"]),
                                     connect_timeout=min(connect_timeout, timeout))
    store = ResultsStore(params["results_dir"])
    if not params["as_json"]:
        click.echo(f"profiling {len(targets)} host(s): {steps} steps by stage under a batch-1 load ...", err=True)
    states = run_bench(targets, options, store, connect_options, remote=remote, timeout=timeout)
    lines = {name: _host_line(state) for name, state in states.items()}
    document: ProfileJSON = {"schema": 1, "results_dir": str(Path(params["results_dir"])), "hosts": lines}
    if params["as_json"]:
        from gpuops.output import print_json

        print_json(document)
    else:
        _render(document)
    sys.exit(0 if all(h["ok"] for h in lines.values()) else EXIT_SOME_HOST_FAILED)


class ProfileLine(TypedDict):
    """One host of ``gpuops profile --json``: its sentence, and the profile's summary as stored."""

    ok: bool
    error: str | None
    result_id: str | None
    result_file: str | None
    simulated: bool
    sentence: str | None
    summary: Summary
    trace_files: object


class ProfileJSON(TypedDict):
    """``gpuops profile --json`` (schema 1)."""

    schema: int
    results_dir: str
    hosts: dict[str, ProfileLine]


def _host_line(state: HostBench) -> ProfileLine:
    from gpuops.bench.simulated import is_simulated
    from gpuops.bench.suite_profile import sentence

    result: ResultDocument = state.result or {}
    summary = result.get("summary") or {}
    simulated = is_simulated(result)
    return {"ok": bool(result.get("ok")) and state.error is None, "error": state.error,
            "result_id": result.get("id") if state.file else None, "result_file": str(state.file) if state.file else None,
            "simulated": simulated, "sentence": sentence(summary.get("headline"), simulated) if summary else None,
            "summary": summary, "trace_files": result.get("trace_files")}


def _render(document: ProfileJSON) -> None:
    from gpuops.bench.compare import format_value
    from gpuops.bench.suite_profile import stage_table, stage_word
    from gpuops.output import format_table

    for index, (name, line) in enumerate(document["hosts"].items()):
        if index:
            click.echo("")
        stages = mapping(line["summary"].get("stages"))
        if not stages:
            click.echo(f"== {name}: FAILED: {line['error'] or line['sentence']}")
            continue
        click.echo(f"== {name}: {line['sentence']}")
        if line["error"]:
            click.echo(f"   error: {line['error']}")
        for stage_name, stage in stages.items():
            click.echo(f"-- {stage_word(stage_name)} ({stage_name}): {at(stage, 'passes')} passes (rank "
                       f"{at(stage, 'rank')}), wall p50 {format_value(number(stage, 'wall_ms', 'median'))} ms, p90 "
                       f"{format_value(number(stage, 'wall_ms', 'p90'))} ms; GPU busy p50 "
                       f"{format_value(number(stage, 'busy_ms', 'median'))} ms")
            headers, rows = stage_table(mapping(stage), line["simulated"])
            click.echo(format_table(headers, rows))
            for kind in objects(at(stage, "collectives")):
                click.echo(f"   {kind.get('kind')}: {format_value(number(kind, 'calls_per_forward'))} calls, "
                           f"{format_value(number(kind, 'ms_per_forward'))} ms per pass")
        for trace in objects(line["summary"].get("traces")):
            if trace.get("error"):
                click.echo(f"   not read: {trace['error']}")
        for kept in objects(line.get("trace_files")):
            click.echo(f"   trace kept: {kept.get('path') or kept.get('error')}")
        if line["result_id"]:
            click.echo(f"   result {line['result_id']} (gpuops results compare {line['result_id']} <another>)")
