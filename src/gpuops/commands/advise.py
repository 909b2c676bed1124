"""`gpuops advise`: per host, the ranked ways to cut its all-reduce cost, with evidence and the
exact command (thin: gather as `inspect host` does, read the results store, call gpuops.advise)."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuops.commands.bench_options import results_dir_option
from gpuops.commands.inspect import _host_options, _host_title, _run
from gpuops.commands.options import guide
from gpuops import advise as advice_of
from gpuops.bench.record import ResultDocument
from gpuops.bench.store import ResultsStore
from gpuops.bench.suites import profiles
from gpuops.errors import GpuopsError
from gpuops.facts.collect import host_json
from gpuops.output import make_console, print_json


def _stored_allreduce(results_dir: str, host: str) -> list[ResultDocument]:
    """The host's stored all-reduce results, newest first (an unreadable store counts as empty)."""

    store = ResultsStore(results_dir)
    try:
        entries = [e for e in store.entries() if e.host == host and e.suite == "allreduce" and e.ok
                   and not e.simulated]
        return [store.load(e.id) for e in reversed(entries)]
    except (GpuopsError, OSError, ValueError):
        return []


def _stored_profile(results_dir: str, host: str, wanted: str | None) -> ResultDocument | None:
    """The profile advise computes its savings from: the one ``--profile`` names (an error when it is
    not a profile), else the host's newest stored ``gpuops profile`` result, else None."""

    store = ResultsStore(results_dir)
    if wanted:
        result = store.load(wanted)
        if not profiles(result.get("suite")):
            raise GpuopsError(f"advise: --profile {wanted}: result {result.get('id')} is a {result.get('suite')} "
                              "result, not a profile (gpuops profile)")
        return result if result.get("host") == host else None
    try:
        entries = [e for e in store.entries() if e.host == host and profiles(e.suite) and e.ok]
        return store.load(entries[-1].id) if entries else None
    except (GpuopsError, OSError, ValueError):
        return None


@click.command("advise", epilog=guide("advise-json.md", "profile.md", "inventory.md"))
@_host_options
@results_dir_option
@click.option("--profile", "profile_id", metavar="ID",
              help="The stored profile (gpuops profile) to compute savings from (default: each host's newest).")
def advise(inventory: Any, limit: str | None, as_json: bool, forks: int, accept_new_host_keys: bool,
           known_hosts: tuple[str, ...], timeout: float, results_dir: str, profile_id: str | None = None,
           flush_cache: bool = False) -> None:
    """The ranked ways to cut each host's all-reduce cost: evidence, the command, why not the others."""

    hosts, outcomes = _run(inventory, limit, forks, accept_new_host_keys, known_hosts, timeout, flush_cache=flush_cache)
    answers: dict[str, Any] = {}
    for host_ in hosts:
        outcome = outcomes[host_.name]
        if not outcome.ok:
            answers[host_.name] = {"ok": False, "error": outcome.error}
            continue
        answers[host_.name] = advice_of.advise_host(host_.name, host_json(outcome),
                                                    _stored_allreduce(results_dir, host_.name),
                                                    _stored_profile(results_dir, host_.name, profile_id))
    if as_json:
        print_json({"schema": advice_of.SCHEMA, "hosts": {name: a if isinstance(a, dict) else a.to_json()
                                                          for name, a in answers.items()}})
    else:
        console = make_console()
        for index, host_ in enumerate(hosts):
            answer = answers[host_.name]
            if index:
                console.print()
            if isinstance(answer, dict):
                console.print(f"== {_host_title(host_)}: FAILED: {answer['error']}", style="bold red", markup=False,
                              highlight=False)
                continue
            console.print(f"== {_host_title(host_)}", style="bold", markup=False, highlight=False)
            for line in advice_of.render(answer):
                console.print(line, markup=False, highlight=False)
    sys.exit(0 if all(o.ok for o in outcomes.values()) else 1)
