"""`gpuops tune`: sweep NCCL variables and SGLang launch flags on hosts, benchmark each variant,
rank them against the baseline, put the hosts back."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuops import time_limits
from gpuops.commands.apply import _common, _hosts, _options
from gpuops.commands.options import guide, rollout_options
from gpuops.bench import options as opt
from gpuops.bench.options import BenchOptions
from gpuops.bench.simulated import footnote, mark
from gpuops.bench.store import ResultsStore
from gpuops.output import print_json
from gpuops.transport.rollout import rollout_for
from gpuops.tune.runner import read_releases, run_sweep
from gpuops.tune.sweep import GRID, ONE_AT_A_TIME, against_baseline, best_variant, check_flags, plan_variants, rank, verdicts

EXIT_HOST_FAILED = 1
LOG_LINES = 10  # of a failed variant's server log, under its row (--json has the whole tail)


@click.command("tune", epilog=guide("tune.md", "bench-and-results.md"))
@_common
@rollout_options
@click.option("--sweep", "sweeps", multiple=True, required=True, metavar="NAME=V1[,V2]",
              help="An axis of the sweep (repeatable): an NCCL variable (NCCL_PROTO=LL,Simple) or an SGLang launch "
                   "flag as the release names it (speculative_num_steps=1,3), checked against the release on the host.")
@click.option("--grid/--one-at-a-time", "grid", default=True, show_default=True,
              help="grid: every combination of the axes; one-at-a-time: the first values, then each axis moved alone.")
@click.option("--concurrency", default=None, metavar="C1[,C2]",
              help="Also measure each variant at these concurrency levels (the serving suite), e.g. 1,8,32: "
                   "speculation that wins at batch 1 can lose at 32.")
@click.option("--keep", type=click.Choice(["original", "best"]), default="original", show_default=True,
              help="original: leave every host as it was; best: then apply each host's fastest variant (undoable).")
@click.option("--results-dir", default="results", show_default=True, type=click.Path(file_okay=False),
              help="Where each trial's bench result is stored.")
@click.option("--api", type=click.Choice(["native", "completions", "chat"]), default="native", show_default=True)
@click.option("--input-len", type=click.IntRange(1, 10_000_000), default=256, show_default=True)
@click.option("--output-len", type=click.IntRange(2, 10_000_000), default=256, show_default=True)
@click.option("--num-requests", type=click.IntRange(1, 100_000), default=5, show_default=True,
              help="Measured decode requests per trial, one at a time.")
@click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True)
def tune(inventory: Any, limit: str | None, as_json: bool, forks: int,
         accept_new_host_keys: bool, known_hosts: tuple[str, ...], rollout: Any, sweeps: tuple[str, ...],
         grid: bool, concurrency: str | None, keep: str, timeout: float | None, connect_timeout: float,
         results_dir: str, api: str, input_len: int, output_len: int, num_requests: int, warmup: int) -> None:
    """Try NCCL variables and SGLang launch flags on the hosts safely; rank them by decode tokens/s.

    \b
    gpuops tune -i inv.yml --sweep NCCL_ALGO=Ring,Tree --sweep NCCL_PROTO=LL,Simple
    gpuops tune -i inv.yml --sweep speculative_algorithm=EAGLE3 \\
        --sweep speculative_draft_model_path=/models/draft --sweep speculative_num_steps=1,3,5

    The current configuration is measured first (with speculative flags swept, it is the run without
    speculation); then each variant is applied (nccl-env or launch-flags role: a variant whose server
    does not come back healthy is rolled back by that run and marked failed, with its log's last
    lines) and benchmarked with the decode suite at batch 1. At the end every run is rolled back,
    newest first: the hosts end byte for byte as they started (--keep best then applies the winner).
    """

    hosts = _hosts(inventory, limit)
    variants = plan_variants(sweeps, mode=GRID if grid else ONE_AT_A_TIME)  # refused here, before any host is touched
    bench_options = BenchOptions(suite="decode", api=api, input_len=input_len, output_len=output_len,
                                 num_requests=num_requests, warmup=warmup)
    levels = None if concurrency is None else BenchOptions(
        suite="serving", api=api, input_len=input_len, output_len=output_len, num_requests=num_requests,
        warmup=warmup, concurrency=opt.parse_int_list(concurrency, "--concurrency"))

    apply_options = _options(forks, accept_new_host_keys, known_hosts, rollout=rollout_for(hosts, rollout),
                             timeout=time_limits.per_host("tune", timeout), connect_timeout=connect_timeout)
    if any(v.flags for v in variants):  # each flag and value as the release on each host takes it
        variants = check_flags(variants, read_releases(hosts, apply_options))
    if not as_json:
        for variant in variants:
            for warning in variant.warnings:
                click.echo(f"warning: {variant.label}: {warning}", err=True)
    outcome = run_sweep(hosts, variants, bench_options, ResultsStore(results_dir), apply_options, keep=keep,
                        say=(lambda line: None) if as_json else (lambda line: click.echo(line, err=True)),
                        levels=levels)
    document = _document(outcome, variants)
    if as_json:
        print_json(document)
    else:
        _render(document)
    failed = outcome.interrupted or any(not h["restored"] for h in document["hosts"].values()) \
        or any(not any(t["ok"] for t in h["ranking"]) for h in document["hosts"].values())
    sys.exit(EXIT_HOST_FAILED if failed else 0)


def _document(outcome, variants) -> dict:
    hosts = {}
    for name, trials in outcome.trials.items():
        best = best_variant(trials)
        against_fastest = verdicts(trials)
        versus = against_baseline(trials)
        hosts[name] = {
            "ranking": [dict(t.to_json(), against_fastest=against_fastest.get(t.variant),
                             against_baseline=versus.get(t.variant)) for t in rank(trials)],
            "best": best.variant if best else None,
            "restored": name not in outcome.restore_errors,
            "restore_error": outcome.restore_errors.get(name),
            "kept": outcome.kept.get(name),
        }
    return {"schema": 1, "variants": [{"label": v.label, "env": dict(v.env), "flags": dict(v.flags),
                                       "launch": list(v.launch), "drop": list(v.drop), "warnings": list(v.warnings)}
                          for v in variants],
            "speculation_swept": any(v.speculative for v in variants),
            "interrupted": outcome.interrupted, "hosts": hosts}


def _figure(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _versus(t: dict) -> str:
    versus = t.get("against_baseline")
    if not versus:
        return "-"
    if versus["verdict"] == "reference":
        return "baseline"
    return f"{(versus['ratio'] - 1) * 100:+.0f}% {versus['verdict']}"


def _row_figures(t: dict) -> tuple[str, ...]:
    itl = t["itl_ms"] or {}
    interval = t.get("interval") or {}
    spread = (f" [{interval['low']:.0f}-{interval['high']:.0f}]"
              if interval.get("low") is not None and interval.get("high") is not None else "")
    return (f"{t['output_tokens_per_s']:.1f}{spread}", _figure(t["ttft_ms"]), _figure(itl.get("p50"), 2),
            _figure(itl.get("p99"), 2), _figure(t.get("accept_length"), 2), _figure(t.get("accept_rate"), 2))


def _render(document: dict) -> None:
    models = set()
    headers = ("tok/s [95%]", "TTFT ms", "ITL p50", "ITL p99", "accept", "acc.rate")
    for name, host in document["hosts"].items():
        spec_off = any(v["label"] == "speculation off" for v in document["variants"])
        click.echo(f"== {name}" + ("  (speculative decoding swept: rows against the server without it, "
                                   + ("'speculation off'" if spec_off else "the baseline") + ")"
                                   if document.get("speculation_swept") else ""))
        width = max([len(t["variant"]) for t in host["ranking"]] + [7])
        sim = any(t.get("simulated") for t in host["ranking"])
        cells = {id(t): _row_figures(t) for t in host["ranking"] if t["ok"]}
        widths = [max([len(h)] + [len(mark(c[i], sim)) for c in cells.values()]) for i, h in enumerate(headers)]
        click.echo(f"  {'#':>2}  {'variant':<{width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(headers, widths))
                   + "  vs baseline      result")
        for i, t in enumerate(host["ranking"], 1):
            if t["ok"]:
                note = {"indistinguishable": "  (within noise of the fastest)", "slower": ""}.get(
                    t.get("against_fastest") or "", "")
                if t.get("simulated"):
                    models.add(t.get("speed_model") or "unrecorded")
                click.echo(f"  {i:>2}  {t['variant']:<{width}}  "
                           + "  ".join(f"{mark(x, bool(t.get('simulated'))):>{w}}" for x, w in zip(cells[id(t)], widths))
                           + f"  {mark(_versus(t), bool(t.get('simulated')) and _versus(t) != 'baseline'):<16} "
                             f"{t['result_id']}{note}")
                for level in t.get("levels") or []:
                    click.echo(f"      c={level.get('concurrency')}: {_figure(level.get('output_tokens_per_s'))} tok/s "
                               f"per stream, {_figure(level.get('total_output_tokens_per_s'))} total, ITL p50 "
                               f"{_figure(level.get('itl_ms_p50'), 2)} ms ({t.get('levels_result_id')})")
            else:
                click.echo(f"   -  {t['variant']:<{width}}  {'FAILED':>8}  {t['status']}: {t['error']}")
                tail = (t.get("log_tail") or "").strip().splitlines()[-LOG_LINES:]
                if tail:  # why the variant's server died, in its own words
                    click.echo(f"      the server's log ends (last {len(tail)} lines):")
                    for line in tail:
                        click.echo(f"      | {line}")
        if host.get("best"):
            click.echo(f"  best: {host['best']}" + ("" if host["best"] != "baseline (as configured)" else
                                                     " (no variant beat it beyond noise)"))
        if host["kept"]:
            click.echo(f"  kept: {host['kept']}")
        elif host["restored"]:
            click.echo("  restored: the host runs its original configuration")
        else:
            click.echo(f"  NOT restored: {host['restore_error']} (see gpuops history / gpuops rollback)")
    click.echo("  accept: tokens per verify step, acc.rate: accepted / proposed draft tokens, as the server "
               "reports them (/server_info, /metrics); compare the rows' results: gpuops results compare ID ID")
    if models:
        click.echo(footnote(sorted(models)))
    if document["interrupted"]:
        click.echo("interrupted: the ranking covers the variants measured before Ctrl-C (or SIGTERM, SIGHUP)")
