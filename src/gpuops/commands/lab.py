"""``gpuops lab up|status|down|clone``: throwaway simulated GPU hosts on loopback to rehearse on.

JSON schema (``--json``, for ``up``, ``status`` and ``clone``)::

    {"lab": DIR, "inventory": FILE, "ssh_config": FILE, "known_hosts": FILE,
     "seconds": FLOAT (up/clone only),
     "hosts": [{"name", "address": "127.0.0.1", "port", "gpu", "sglang", "sshd_alive",
                "server_port", "server_running", "server_healthy", "server_pid",
                "speed_model": {"label", "shape", "basis", "reason"} or null (no server)}],
     "router": {"url", "port", "pid", "version", "alive"} or null (no `up --router`)}

``speed_model``: the stand-in speed model the host's server simulates with (gpuops/lab/speed_model.json):
``basis`` is ``calibrated`` (on published or measured figures) or ``assumption``.

``down --json``: ``{"lab": DIR, "hosts": N, "swept_pids": [...], "removed": true}``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from gpuops.commands.options import guide
from gpuops.lab.real_timing import TIMINGS, standin_env
from gpuops.errors import GpuopsError
from gpuops.lab import speed_model
from gpuops.lab.clone import clone_host, describe_host, description_text
from gpuops.lab.gpu_description import load_description
from gpuops.lab.hosts import LabSpec, lab_status, load_lab, start_lab, stop_lab
from gpuops.lab.router import load_router
from gpuops.output import is_tty, make_console, safe_text

DIR_HELP = "Lab directory (default: $GPUOPS_LAB_DIR or .lab in the current directory)."


def _lab_dir(value: str | None) -> Path:
    return Path(value or os.environ.get("GPUOPS_LAB_DIR") or ".lab").expanduser().absolute()


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the current directory when inside it."""
    try:
        rel = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return str(rel) if str(rel) != "." else "."


dir_option = click.option("--dir", "lab_dir", metavar="DIR", help=DIR_HELP)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


@click.group(epilog=guide("lab.md", "lab-host-description.md"))
def lab() -> None:
    """Throwaway simulated GPU hosts: real OpenSSH sshd on 127.0.0.1, a replaying nvidia-smi, the
    real source of an SGLang release and a stand-in SGLang server per host.

    Rehearse any gpuops command on them with `-i .lab/inventory.yml`; `gpuops lab down` removes
    everything. Nothing is written to your ~/.ssh.
    """


@lab.command()
@click.option("--hosts", "count", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Number of hosts (of each --gpu).")
@click.option("--gpu", "gpus", multiple=True, default=("rtx-pro-6000-x8",), show_default=True, metavar="NAME|FILE",
              help="rtx-pro-6000-x8, h200-x1, h100-x8, none, or a GPU description YAML file; repeat for a mixed lab.")
@click.option("--sglang", "sglang_version", default="0.5.8", show_default=True, metavar="VERSION",
              help="SGLang release whose real source each host gets (downloaded once, cached).")
@click.option("--flashinfer", "flashinfer_version", metavar="VERSION|pinned",
              help="Also give each host a real FlashInfer Python package (downloaded once, cached): this "
                   "release, or `pinned` for the one the SGLang release pins. Default: its version data only.")
@click.option("--no-server", is_flag=True, help="Do not start the stand-in SGLang servers.")
@click.option("--timing", type=click.Choice(TIMINGS), default="fast", show_default=True,
              help="real: each stand-in starts, answers /health and stops as slowly as a real SGLang 0.5.16 "
                   "did on an H200 (a 60 s start, 1 s per /health, a 5 s drain); fast: at once.")
@click.option("--add", is_flag=True, help="Add the hosts to the running lab in DIR.")
@click.option("--router", "router", is_flag=True,
              help="Start a real sglang-router (from PyPI, installed once and cached) in front of every stand-in "
                   "server; the inventory names it as sglang_router_url, so every host is a replica behind it.")
@click.option("--router-version", default="0.3.2", show_default=True, metavar="VERSION",
              help="The sglang-router release --router installs (0.2.x or 0.3.x: apply drains through either's worker API).")
@dir_option
@json_option
def up(count: int, gpus: tuple[str, ...], sglang_version: str, flashinfer_version: str | None, no_server: bool,
       timing: str, add: bool, router: bool, router_version: str, lab_dir: str | None, as_json: bool) -> None:
    """Start N simulated GPU hosts and write their inventory."""

    root = _lab_dir(lab_dir)
    started = time.monotonic()
    # A host without GPUs (`--gpu none`) has no SGLang server to run.
    specs = [
        LabSpec(gpu=gpu, sglang=sglang_version, server=not no_server and gpu != "none", count=count,
                flashinfer=flashinfer_version, server_env=standin_env(timing))
        for gpu in dict.fromkeys(gpus)
    ]
    if router and no_server:
        raise GpuopsError("lab up: --router needs the stand-in servers (drop --no-server)")
    progress = None if as_json else (lambda msg: click.echo(f"lab: {msg}", err=True))
    lab_obj = start_lab(root, specs, add=add, progress=progress, router=router_version if router else None)
    _report(lab_obj, as_json, seconds=time.monotonic() - started, verb="up")


@lab.command()
@dir_option
@json_option
def status(lab_dir: str | None, as_json: bool) -> None:
    """Each host: its port, whether sshd runs, whether its server runs and is healthy."""

    _report(load_lab(_lab_dir(lab_dir)), as_json)


@lab.command()
@dir_option
@json_option
def down(lab_dir: str | None, as_json: bool) -> None:
    """Stop every sshd and server of the lab and remove its directory."""

    root = _lab_dir(lab_dir)
    try:
        count = len(load_lab(root).hosts)
    except GpuopsError:  # a broken or half-started lab is still taken down (by its pid files)
        count = len(list(root.glob("*/sshd_config")))
    swept = stop_lab(root, remove=True)
    if as_json:
        click.echo(json.dumps({"lab": str(root), "hosts": count, "swept_pids": swept, "removed": True}))
        return
    extra = f" (and {len(swept)} stray process(es))" if swept else ""
    click.echo(f"lab down: stopped {count} host(s){extra}, removed {_shown(root)}")


@lab.command()
@click.argument("host")
@click.option("-i", "--inventory", metavar="FILE", help="Inventory holding HOST.")
@click.option("--name", metavar="NAME", help="Name of the lab host (default: HOST-lab).")
@click.option("--no-server", is_flag=True, help="Do not start the stand-in SGLang server.")
@dir_option
@json_option
def clone(host: str, inventory: str | None, name: str | None, no_server: bool, lab_dir: str | None, as_json: bool) -> None:
    """A lab host copied from a real one: same GPUs, SGLang release and server flags.

    Reads HOST's facts (`gpuops inspect`'s gather, one SSH exec), writes a GPU description into
    the lab and starts a host from it (added to the running lab in DIR, if there is one).
    """

    root = _lab_dir(lab_dir)
    started = time.monotonic()
    progress = None if as_json else (lambda msg: click.echo(f"lab: {msg}", err=True))
    lab_obj = clone_host(root, inventory, host, name=name, server=not no_server, progress=progress)
    _report(lab_obj, as_json, seconds=time.monotonic() - started, verb="clone")


@lab.command()
@click.argument("host")
@click.option("-i", "--inventory", metavar="FILE", help="Inventory holding HOST.")
@click.option("-o", "--output", metavar="FILE", type=click.Path(dir_okay=False), help="Write the description here (default: stdout).")
def describe(host: str, inventory: str | None, output: str | None) -> None:
    """Write a GPU description (YAML) of a real host, for `gpuops lab up --gpu FILE`.

    Reads HOST's facts (`gpuops inspect`'s gather, one SSH exec): GPUs, topology, P2P, driver and
    CUDA, the stack's versions, the server's flags and NCCL/SGLang environment (credentials never).
    The schema: docs/lab-host-description.md.
    """
    import tempfile
    from pathlib import Path

    found, data = describe_host(inventory, host, lambda msg: click.echo(f"lab: {msg}", err=True))
    text = description_text(data, found.name)
    with tempfile.TemporaryDirectory() as tmp:  # what gpuops writes, gpuops must read back
        probe = Path(tmp) / "description.yaml"
        probe.write_text(text)
        load_description(str(probe))
    if output:
        Path(output).write_text(text)
        click.echo(f"lab: wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


def _report(lab_obj, as_json: bool, seconds: float | None = None, verb: str | None = None) -> None:
    statuses = lab_status(lab_obj)
    models = _speed_models(lab_obj)
    document: dict[str, Any] = {
        "lab": str(lab_obj.root),
        "inventory": str(lab_obj.inventory_path),
        "ssh_config": str(lab_obj.ssh_config),
        "known_hosts": str(lab_obj.known_hosts),
        "hosts": [{**asdict(s), "address": "127.0.0.1", "speed_model": models.get(s.name)} for s in statuses],
        "router": _router_json(lab_obj.root),
    }
    if seconds is not None:
        document["seconds"] = round(seconds, 3)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    if verb is not None:
        click.echo(f"lab {verb}: {len(statuses)} host(s) in {_shown(lab_obj.root)} ({seconds:.1f} s)")
    _render_table(statuses, models)
    if document["router"] is not None:
        r = document["router"]
        click.echo(f"router: sglang-router {r['version']} at {r['url']} ({'up' if r['alive'] else 'DOWN'}); "
                   "the inventory names it as sglang_router_url")
    if any(models.values()):
        click.echo("speed model: what each stand-in server's SIMULATED speed comes from (calibrated: on published "
                   "figures; assumption: no measurement of that shape); every figure's source: "
                   "gpuops/lab/speed_model.json")
    if verb is not None and statuses:
        inv = _shown(lab_obj.inventory_path)
        click.echo("")
        click.echo("Next:")
        click.echo(f"  gpuops inspect host -i {inv}")
        click.echo(f"  ssh -F {_shown(lab_obj.ssh_config)} {statuses[0].name} nvidia-smi")
        click.echo(f"  gpuops apply fusion-sm120 --check -i {inv}")
        click.echo(f"  gpuops lab status{_dir_flag(lab_obj.root)}      gpuops lab down{_dir_flag(lab_obj.root)}")


def _router_json(root: Path) -> dict | None:
    found = load_router(root)
    if found is None:
        return None
    return {"url": found.url, "port": found.port, "pid": found.pid, "version": found.version, "alive": found.alive()}


def _dir_flag(root: Path) -> str:
    default = _lab_dir(None)
    return "" if root == default else f" --dir {_shown(root)}"


def _server_text(s) -> str:
    if s.server_port is None:
        return "-"
    if not s.server_running:
        return f":{s.server_port} stopped"
    return f":{s.server_port} " + ("healthy" if s.server_healthy else "unhealthy")


def _speed_models(lab_obj) -> dict:
    """Per host with a server: which stand-in speed model (shape) its GPUs get, as the stand-in picks it."""

    model = speed_model.load()
    out: dict[str, Any] = {}
    for host in lab_obj.hosts:
        if host.server_port is None:
            out[host.name] = None
            continue
        shape, reason = model.shape_for(speed_model.read_gpu_doc(str(host.dir / "gpu.json")))
        out[host.name] = {"label": speed_model.model_label(shape, model.version), "shape": shape,
                          "basis": model.shape_basis(shape), "reason": reason}
    return out


def _render_table(statuses, models) -> None:
    headers = ["host", "ssh", "sshd", "gpu", "sglang", "server", "speed model (simulated)"]
    rows = [
        [s.name, f"127.0.0.1:{s.port}", "up" if s.sshd_alive else "DOWN", s.gpu, s.sglang or "-", _server_text(s),
         f"{models[s.name]['label']} ({models[s.name]['basis']})" if models.get(s.name) else "-"]
        for s in statuses
    ]

    if is_tty():
        from rich.table import Table
        from rich.text import Text

        table = Table(*headers)
        for row in rows:
            style = None if row[2] == "up" and "healthy" in row[5] and "un" not in row[5] else "yellow"
            table.add_row(*(Text(safe_text(cell, newlines=False)) for cell in row), style=style)
        make_console().print(table)
        return
    rows = [[safe_text(cell, newlines=False) for cell in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
