"""`gpuops apply ROLE`, `gpuops rollback`, `gpuops history`: thin click commands over gpuops.apply."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from gpuops.commands.options import (flush_cache_option, forget_kept, forks_option, guide, host_key_options,
                                     inventory_options, rollout_options)
from gpuops import time_limits, timings
from gpuops.apply import deployment_repair
from gpuops.apply.render import render_history, render_reports
from gpuops.apply.extra_vars import ExtraVars
from gpuops.apply.runner import ApplyOptions, apply_role, history_hosts, rollback_hosts
from gpuops.apply.undo import rollback_plan
from gpuops.errors import GpuopsError
from gpuops.extravars import parse_extra_vars
from gpuops.inventory import load_inventory
from gpuops.inventory.vault import NO_PASSWORD_HINT, decrypt_values, find_encrypted
from gpuops.multi_node import check_whole
from gpuops.output import echo_trusted, use_color
from gpuops.transport import ConnectOptions
from gpuops.transport.connvars import refuse_connection_vars
from gpuops.transport.rollout import rollout_for

EXIT_HOST_FAILED = 1


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    options: list[Any] = [
        inventory_options,
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema: roles/README.md)."),
        forks_option(),
        host_key_options,
        click.option("--timeout", type=click.FloatRange(1, 86400), default=None, metavar="SECONDS",
                     help="Seconds allowed per host, for everything done there (default: apply and each step of "
                          f"tune {time_limits.APPLY_S:.0f}, rollback {time_limits.ROLLBACK_S:.0f}, history "
                          f"{time_limits.HISTORY_S:.0f}; docs/time-limits.md). A host over its time is failed "
                          "and rolls itself back within its lease; the others carry on."),
        click.option("--connect-timeout", "connect_timeout", type=click.FloatRange(1, 600), default=10.0,
                     show_default=True, metavar="SECONDS", help="Seconds allowed to connect to each host."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _options(forks: int, accept_new_host_keys: bool, known_hosts: tuple[str, ...],
             check: bool = False, diff: bool = False, rollout: Any = None,
             timeout: float | None = None, connect_timeout: float = 10.0, force: bool = False,
             flush_cache: bool = False) -> Any:
    return ApplyOptions(
        connect=ConnectOptions(accept_new_host_keys=accept_new_host_keys, known_hosts_files=tuple(known_hosts),
                               connect_timeout=min(connect_timeout, timeout) if timeout else connect_timeout,
                               command_timeout=timeout),
        check=check, diff=diff, forks=forks, rollout=rollout,
        timeout=timeout, force=force, flush_cache=flush_cache,
    )


def _decrypted(extra: dict[str, Any], inventory: Any) -> dict[str, Any]:
    """``-e @file`` values written with ``!vault``: decrypted with the command's vault passwords, or refused."""

    extra = decrypt_values(extra, getattr(inventory, "vault", None))
    for name, value in extra.items():
        found = find_encrypted(value, name)
        if found:
            raise GpuopsError(f"-e @{found[1].where}: variable {name} is vault-encrypted: {NO_PASSWORD_HINT}")
    return extra


def _hosts(inventory: Any, limit: str | None) -> list[Any]:
    return load_inventory(inventory).select(limit)


@click.command("apply", epilog=guide("roles.md", "inventory.md"))
@click.argument("role")
@_common
@rollout_options
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="VARS", help="key=value, YAML/JSON, or @file (repeatable; wins over everything).")
@click.option("-C", "--check", is_flag=True, help="Plan only: show what would change, change nothing on the host.")
@click.option("-D", "--diff", is_flag=True, help="Show a unified diff of every file change.")
@flush_cache_option
def apply(role: str, inventory: Any, limit: str | None, as_json: bool, forks: int,
          accept_new_host_keys: bool, known_hosts: tuple[str, ...], rollout: Any, extra_vars: tuple[str, ...],
          check: bool, diff: bool, timeout: float | None, connect_timeout: float, flush_cache: bool) -> None:
    """Run ROLE on every host: gather, plan, (diff), change, restart, verify; roll back on failure."""

    values = _decrypted(parse_extra_vars(list(extra_vars)), inventory)
    refuse_connection_vars(values)
    extra = ExtraVars.checked(role, values)  # checked once, here: before anything is hashed, gathered or planned

    everyone = load_inventory(inventory)
    hosts = everyone.select(limit)
    check_whole(hosts, everyone.hosts, extra)
    if flush_cache:
        forget_kept(hosts)
    rollout = rollout_for(hosts, rollout)
    options = _options(forks, accept_new_host_keys, known_hosts, check=check, diff=diff, rollout=rollout,
                       timeout=time_limits.per_host("apply", timeout), connect_timeout=connect_timeout, flush_cache=flush_cache)
    run_id, reports = apply_role(hosts, role, extra, options)

    with timings.span("render"):
        if as_json:
            click.echo(json.dumps({"role": role, "check": check, "run_id": run_id,
                                   "hosts": {n: r.to_json() for n, r in reports.items()}}, indent=2))
        else:
            render_reports(reports, role, check, diff, echo_trusted if use_color() else click.echo, color=use_color())
    if not all(r.ok for r in reports.values()):
        sys.exit(EXIT_HOST_FAILED)


@click.command("rollback", epilog=guide("roles.md"))
@_common
@rollout_options
@click.option("--run", "run_id", metavar="RUN_ID", help="The run to undo (default: the most recent that changed the host).")
@click.option("--force", is_flag=True, help="Undo even files changed since the run wrote them (the later version is kept beside the backup).")
@click.option("-C", "--check", is_flag=True, help="Show the batches the rollback takes (--serial; a deployment's "
                                                  "nodes always in one) and change nothing; asks no host.")
def rollback(inventory: Any, limit: str | None, as_json: bool, forks: int,
             accept_new_host_keys: bool, known_hosts: tuple[str, ...], rollout: Any, run_id: str | None,
             force: bool, timeout: float | None, connect_timeout: float, check: bool) -> None:
    """Undo an apply run: restore every file it changed, byte for byte, and restart the server."""

    everyone = load_inventory(inventory)
    hosts = everyone.select(limit)
    options = _options(forks, accept_new_host_keys, known_hosts, rollout=rollout_for(hosts, rollout),
                       timeout=time_limits.per_host("rollback", timeout), connect_timeout=connect_timeout, force=force)
    if check:
        plan = rollback_plan(hosts, options)
        if as_json:
            click.echo(json.dumps({"check": True, "batches": plan}, indent=2))
            return
        click.echo("ROLLBACK (check mode: nothing changed, no host asked)")
        for number, batch in enumerate(plan, start=1):
            together = "; ".join(f"deployment {name}: rolled back as one server" for name in batch["deployments"])
            click.echo(f"batch {number} of {len(plan)}: {', '.join(batch['hosts'])}"
                       + (f" ({together})" if together else ""))
        return
    # A deployment split by its last run: finishing its rollback on every node is this rollback there.
    reports, _ = deployment_repair.before_command(hosts, everyone.hosts, ExtraVars.none(), options)
    rest = [h for h in hosts if h.name not in reports]
    if rest:
        reports.update(rollback_hosts(rest, run_id, options))
    if as_json:
        click.echo(json.dumps({"hosts": {n: r.to_json() for n, r in reports.items()}}, indent=2))
    else:
        render_reports(reports, "rollback", False, False, echo_trusted if use_color() else click.echo,
                       color=use_color())
    if not all(r.ok for r in reports.values()):
        sys.exit(EXIT_HOST_FAILED)


@click.command("history", epilog=guide("roles.md"))
@_common
def history(inventory: Any, limit: str | None, as_json: bool, forks: int,
            accept_new_host_keys: bool, known_hosts: tuple[str, ...], timeout: float | None,
            connect_timeout: float) -> None:
    """List apply runs recorded in each host's journal (who, when, role, changes, outcome)."""

    hosts = _hosts(inventory, limit)
    options = _options(forks, accept_new_host_keys, known_hosts, timeout=time_limits.per_host("history", timeout),
                       connect_timeout=connect_timeout)
    outcomes = history_hosts(hosts, options)
    runs = {name: (o.value if o.ok else (o.error or "failed")) for name, o in outcomes.items()}
    if as_json:
        click.echo(json.dumps({"hosts": {n: (v if isinstance(v, dict) else {"error": v})
                                         for n, v in runs.items()}}, indent=2))
    else:
        render_history(runs, click.echo)
    if not all(o.ok for o in outcomes.values()):
        sys.exit(EXIT_HOST_FAILED)
