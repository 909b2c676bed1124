"""`gpuops inspect host|gates`: facts and capability gates of every host (thin: parse, call, render).

gpuops' own modules are imported here at the top; the heavy libraries (rich, fabric, paramiko) are
not imported by any of them until a console is made or a host is connected, so `gpuops --help`
(which does not import this module: cli.py registers it lazily) and `gpuops inspect --help` stay
fast.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from gpuops import timings
from gpuops.advise import advise_host
from gpuops.apply.deployment_health import leader_answers
from gpuops.commands.options import (flush_cache_option, forget_kept, forks_option, guide, host_key_options,
                                     inventory_options)
from gpuops.errors import GpuopsError
from gpuops.facts.collect import gate_counts_json, gate_json, host_json
from gpuops.facts.deployment import deployments_json, report_lines
from gpuops.facts.managed import describe
from gpuops.facts.render import render_host_facts
from gpuops.gates import report as gate_report
from gpuops.gates.catalog import load_catalog
from gpuops.inspection import inspect_hosts
from gpuops.inventory import load_inventory
from gpuops.output import brief, make_console, print_json
from gpuops.transport import ConnectOptions, verbose

EXIT_SOME_HOST_FAILED = 1


def _host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options: list[Any] = [
        inventory_options,
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema: docs/inspect-json.md)."),
        forks_option("Hosts inspected at once."),
        host_key_options,
        click.option("--timeout", type=click.FloatRange(1, 3600), default=120.0, show_default=True, help="Seconds allowed per host."),
        flush_cache_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _import_rich() -> None:
    """The tables' library, imported while the hosts run their probes rather than after them (~150 M
    instructions by cachegrind; a wall-time gain within the noise of 12 interleaved lab runs, 1.076 s
    against 1.092 s median). rich is a heavy library a command module may defer."""
    import rich.console
    import rich.table
    import rich.text  # noqa: F401


def _run(inventory: Any, limit: str | None, forks: int, accept_new_host_keys: bool,
         known_hosts: tuple[str, ...], timeout: float, with_sources: bool = False,
         flush_cache: bool = False, as_text: bool = False) -> tuple[list[Any], dict[str, Any]]:
    hosts = load_inventory(inventory).select(limit)
    if flush_cache:
        forget_kept(hosts)
    options = _connect_options(accept_new_host_keys, known_hosts, timeout)
    outcomes = inspect_hosts(hosts, options, forks=forks, with_gates=True, with_sources=with_sources, timeout=timeout,
                             recall=not flush_cache, while_waiting=(_import_rich,) if as_text else ())
    return hosts, outcomes


def _connect_options(accept_new_host_keys: bool, known_hosts: tuple[str, ...], timeout: float) -> Any:
    return ConnectOptions(accept_new_host_keys=accept_new_host_keys, connect_timeout=min(10.0, timeout),
                          command_timeout=timeout, known_hosts_files=tuple(known_hosts))


def _exit_status(outcomes: dict[str, Any]) -> int:
    return 0 if all(o.ok for o in outcomes.values()) else EXIT_SOME_HOST_FAILED


def _host_title(host: Any) -> str:
    if host.connection == "local":
        return f"{host.name} (local)"
    where = host.address or host.name
    return f"{host.name} ({where}:{host.port})" if host.port else f"{host.name} ({where})"


@click.group("inspect", epilog=guide("inventory.md", "inspect-json.md"))
def inspect() -> None:
    """Facts and capability gates of every host (one SSH exec per host, hosts in parallel)."""


@inspect.command("host")
@_host_options
def host(inventory: Any, limit: str | None, as_json: bool, forks: int, accept_new_host_keys: bool,
         known_hosts: tuple[str, ...], timeout: float, flush_cache: bool) -> None:
    """GPUs, interconnect, software, the running SGLang server and its blocked features."""
    hosts, outcomes = _run(inventory, limit, forks, accept_new_host_keys, known_hosts, timeout, flush_cache=flush_cache,
                           as_text=not as_json)
    entries = {name: host_json(outcome) for name, outcome in outcomes.items()}
    # A multi-node server's leader is asked for one generation: its /health alone says too little.
    answers = leader_answers(hosts, entries, _connect_options(accept_new_host_keys, known_hosts, timeout))
    with timings.span("render"):
        if as_json:
            print_json({"schema": 1, "hosts": entries, **deployments_json(hosts, entries, _journals(outcomes), answers)})
        else:
            _render_hosts(hosts, outcomes, answers)
    sys.exit(_exit_status(outcomes))


def _journals(outcomes: dict[str, Any]) -> dict[str, Any]:
    """Each host's apply journal as inspect read it (None where it was not): a split deployment's run."""
    return {name: o.value.journal if o.ok and o.value is not None else None
            for name, o in outcomes.items()}


def _each_answered_host(console: Any, hosts: list[Any], outcomes: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """Yield (host, outcome) for the hosts that answered; print the title line of every host."""
    for index, host_ in enumerate(hosts):
        outcome = outcomes[host_.name]
        if index:
            console.print()
        if not outcome.ok:
            console.print(f"== {_host_title(host_)}: FAILED: {outcome.error}", style="bold red", markup=False, highlight=False)
            continue
        yield host_, outcome


def _render_hosts(hosts: list[Any], outcomes: dict[str, Any], answers: dict[str, Any]) -> None:
    console = make_console()
    # -v: every line whole, each blocked feature's gates and flag; else one screen a host, one line a feature.
    detail = verbose.enabled()
    fit = (lambda text: text) if detail else brief
    for host_, outcome in _each_answered_host(console, hosts, outcomes):
        console.print(f"== {_host_title(host_)}", style="bold", markup=False, highlight=False)
        for note in outcome.value.recovered:
            console.print(note, style="magenta", markup=False, highlight=False)
        entry = host_json(outcome)
        _render_gates(console, outcome.value, detail=False, next_commands=advise_host(host_.name, entry).next_commands(),
                      full_reasons=detail)
        if entry["facts"] is not None:  # a host that answered has its facts
            render_host_facts(console, entry["facts"], fit)
        for problem in outcome.value.stack:
            console.print(fit(f"STACK    {problem}"), style="yellow", markup=False, highlight=False)
        managed = describe(outcome.value.facts.managed)
        if managed:
            console.print(fit(managed), markup=False, highlight=False)
    view = deployments_json(hosts, {name: host_json(o) for name, o in outcomes.items()}, _journals(outcomes), answers)
    for text, style in report_lines(view):  # the nodes of a multi-node server, as one server
        console.print(text, style=style, markup=False, highlight=False)
    failed = [name for name, o in outcomes.items() if not o.ok]
    console.print()
    console.print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} hosts answered" + (f"; failed: {', '.join(failed)}" if failed else ""),
        style="red" if failed else None, markup=False, highlight=False,
    )


def _render_gates(console: Any, inspection: Any, detail: bool, feature: str | None = None, show_all: bool = False,
                  next_commands: dict[str, str] | None = None, full_reasons: bool = False) -> None:
    if inspection.gate_report is None:
        console.print(f"gates: unknown ({inspection.gates_error or 'not scanned'})", style="yellow", markup=False, highlight=False)
        return
    if detail:
        gate_report.render_gate_detail(inspection.gate_report, console, feature=feature, show_all=show_all)
    else:
        gate_report.render_gate_summary(inspection.gate_report, console, next_commands, detail=full_reasons)


@inspect.command("gates")
@click.option("--feature", metavar="NAME", help="Only the gates of this feature.")
@click.option("--all", "show_all", is_flag=True, help="Every capability gate the scan found, not only the catalogued ones.")
@_host_options
def gates(feature: str | None, show_all: bool, inventory: Any, limit: str | None, as_json: bool, forks: int,
          accept_new_host_keys: bool, known_hosts: tuple[str, ...], timeout: float, flush_cache: bool) -> None:
    """Where the installed SGLang switches performance features off for this hardware (file:line)."""
    if feature:
        _check_feature(feature)  # bad input: exit 2 before any connection
    hosts, outcomes = _run(inventory, limit, forks, accept_new_host_keys, known_hosts, timeout, flush_cache=flush_cache)
    if as_json:
        document: dict[str, Any] = {"schema": 1, "hosts": {}}
        for name, outcome in outcomes.items():
            if not outcome.ok:
                document["hosts"][name] = {"ok": False, "error": outcome.error, "gates": [], "features": {},
                                           "gate_counts": None}
                continue
            facts = outcome.value.facts
            gate_list, features = gate_json(outcome.value)
            if feature:
                gate_list = [g for g in gate_list if _feature_of(g) == feature]
                features = {k: v for k, v in features.items() if k == feature}
            elif not show_all:
                gate_list = [g for g in gate_list if _feature_of(g)]
            document["hosts"][name] = {
                "ok": True, "error": None, "compute_capability": facts.compute_capability,
                "sm": next((g.sm for g in facts.gpu.gpus if g.compute_capability == facts.compute_capability), None),
                "gates": gate_list, "features": features, "gate_counts": gate_counts_json(outcome.value),
                "gates_error": outcome.value.gates_error,
            }
        print_json(document)
    else:
        console = make_console()
        for host_, outcome in _each_answered_host(console, hosts, outcomes):
            cc = outcome.value.facts.compute_capability
            console.print(f"== {_host_title(host_)}: compute capability {cc or 'unknown'}", style="bold", markup=False, highlight=False)
            _render_gates(console, outcome.value, detail=True, feature=feature, show_all=show_all)
    sys.exit(_exit_status(outcomes))


def _check_feature(name: str) -> None:
    known = [f.name for f in load_catalog().features]
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}? " if close else ""
        raise GpuopsError(f"--feature {name}: no such feature in the gate catalog; {hint}(known: {', '.join(known)})")


def _feature_of(gate: Any) -> str | None:
    if isinstance(gate, dict):
        return gate.get("feature")
    return getattr(gate, "feature", None)
