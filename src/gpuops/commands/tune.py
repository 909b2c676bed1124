"""`gpuops tune`: sweep NCCL variants on hosts, benchmark each, rank them, put the hosts back."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuops.commands.apply import _common, _hosts, _options
from gpuops.commands.options import guide, rollout_options

EXIT_HOST_FAILED = 1
LOG_LINES = 10  # of a failed variant's server log, under its row (--json has the whole tail)


@click.command("tune", epilog=guide("tune.md", "bench-and-results.md"))
@_common
@rollout_options
@click.option("--sweep", "sweeps", multiple=True, required=True, metavar="NCCL_NAME=V1[,V2]",
              help="An axis of the sweep (repeatable; the cross product is tried), e.g. NCCL_PROTO=LL,LL128,Simple.")
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
         accept_new_host_keys: bool, known_hosts: tuple[str, ...], rollout: Any, sweeps: tuple[str, ...], keep: str,
         timeout: float | None, connect_timeout: float,
         results_dir: str, api: str, input_len: int, output_len: int, num_requests: int, warmup: int) -> None:
    """Try NCCL variants on the hosts safely and rank them by decode tokens/s.

    \b
    gpuops tune -i inv.yml --sweep NCCL_ALGO=Ring,Tree --sweep NCCL_PROTO=LL,Simple

    The current configuration is measured first; then each variant is applied with the nccl-env
    role (a variant whose server does not come back healthy is rolled back by that run and marked
    failed) and benchmarked with the decode suite. At the end every run is rolled back, newest
    first: the hosts end byte for byte as they started (--keep best then applies the winner).
    """
    from gpuops.bench.options import BenchOptions
    from gpuops.bench.store import ResultsStore
    from gpuops.tune.runner import run_sweep
    from gpuops.tune.sweep import plan_variants

    hosts = _hosts(inventory, limit)
    variants = plan_variants(sweeps)  # refused here, before any host is touched
    bench_options = BenchOptions(suite="decode", api=api, input_len=input_len, output_len=output_len,
                                 num_requests=num_requests, warmup=warmup)
    from gpuops.transport.rollout import rollout_for

    apply_options = _options(forks, accept_new_host_keys, known_hosts, rollout=rollout_for(hosts, rollout),
                             timeout=timeout, connect_timeout=connect_timeout)
    if not as_json:
        for variant in variants:
            for warning in variant.warnings:
                click.echo(f"warning: {variant.label}: {warning}", err=True)
    outcome = run_sweep(hosts, variants, bench_options, ResultsStore(results_dir), apply_options, keep=keep,
                        say=(lambda line: None) if as_json else (lambda line: click.echo(line, err=True)))
    document = _document(outcome, variants)
    if as_json:
        from gpuops.output import print_json

        print_json(document)
    else:
        _render(document)
    failed = outcome.interrupted or any(not h["restored"] for h in document["hosts"].values()) \
        or any(not any(t["ok"] for t in h["ranking"]) for h in document["hosts"].values())
    sys.exit(EXIT_HOST_FAILED if failed else 0)


def _document(outcome, variants) -> dict:
    from gpuops.tune.sweep import best_variant, rank, verdicts

    hosts = {}
    for name, trials in outcome.trials.items():
        best = best_variant(trials)
        against_fastest = verdicts(trials)
        hosts[name] = {
            "ranking": [dict(t.to_json(), against_fastest=against_fastest.get(t.variant)) for t in rank(trials)],
            "best": best.variant if best else None,
            "restored": name not in outcome.restore_errors,
            "restore_error": outcome.restore_errors.get(name),
            "kept": outcome.kept.get(name),
        }
    return {"schema": 1, "variants": [{"label": v.label, "env": dict(v.env), "warnings": list(v.warnings)}
                                      for v in variants],
            "interrupted": outcome.interrupted, "hosts": hosts}


def _render(document: dict) -> None:
    from gpuops.bench.simulated import footnote, mark

    models = set()
    for name, host in document["hosts"].items():
        click.echo(f"== {name}")
        width = max([len(t["variant"]) for t in host["ranking"]] + [7])
        sim_width = 6 if any(t.get("simulated") for t in host["ranking"]) else 0
        click.echo(f"  {'#':>2}  {'variant':<{width}}  {'tok/s':>{8 + sim_width}}  {'TTFT ms':>{8 + sim_width}}  "
                   f"{'ITL p50':>{8 + sim_width}}  result")
        for i, t in enumerate(host["ranking"], 1):
            if t["ok"]:
                itl = (t["itl_ms"] or {}).get("p50")
                note = {"indistinguishable": "  (within noise of the fastest)", "slower": ""}.get(
                    t.get("against_fastest") or "", "")
                sim = bool(t.get("simulated"))
                if sim:
                    models.add(t.get("speed_model") or "unrecorded")
                figures = (f"{t['output_tokens_per_s']:.1f}", f"{(t['ttft_ms'] or 0):.1f}", f"{(itl or 0):.2f}")
                click.echo(f"  {i:>2}  {t['variant']:<{width}}  "
                           + "  ".join(f"{mark(x, sim):>{8 + sim_width}}" for x in figures) + f"  {t['result_id']}{note}")
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
    if models:
        click.echo(footnote(sorted(models)))
    if document["interrupted"]:
        click.echo("interrupted: the ranking covers the variants measured before Ctrl-C")
