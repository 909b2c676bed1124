"""What the speed work must not break: every command still there behind lazy loading, `--timings`
reporting every phase, and the SSH algorithm order read from ~/.ssh/config as OpenSSH reads it.
No timed assertions: only behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpuops.cli import COMMANDS, cli
from gpuops.transport.algorithms import AlgorithmError, apply_config, fast_first, order_algorithms, preferences


def _every_command_path(group: click.Group, ctx: click.Context, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{' '.join(prefix + (name,))} is listed but does not load"
        paths.append(prefix + (name,))
        if isinstance(command, click.Group):
            paths += _every_command_path(command, ctx, prefix + (name,))
    return paths


def test_every_lazily_loaded_command_and_subcommand_has_its_help() -> None:
    paths = _every_command_path(cli, click.Context(cli))
    assert {p[0] for p in paths} == set(COMMANDS)
    assert ("inspect", "host") in paths and ("results", "compare") in paths
    runner = CliRunner()
    for path in paths:
        done = runner.invoke(cli, [*path, "--help"], prog_name="gpuops")
        assert done.exit_code == 0, (path, done.output)
        assert f"Usage: gpuops {' '.join(path)}" in done.output


def test_top_level_help_lists_every_command_without_importing_any() -> None:
    code = ("import sys\nfrom gpuops.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('gpuops.commands.') or m.split('.')[0] in "
            "('fabric', 'paramiko', 'jinja2', 'rich', 'yaml', 'matplotlib', 'cryptography'))\n"
            "sys.stderr.write('LOADED=' + ','.join(loaded) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    for name, (_, short) in COMMANDS.items():
        assert f"{name}" in done.stdout and short in done.stdout
    assert "LOADED=\n" in done.stderr


def _local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "local.yml"
    path.write_text(f"all:\n  hosts:\n    here: {{ansible_connection: local, gpuops_state_dir: '{tmp_path / 'state'}'}}\n")
    return path


def test_timings_report_every_phase_on_stderr_and_as_json(tmp_path: Path) -> None:
    inventory = _local_inventory(tmp_path)
    figures = tmp_path / "timings.json"
    env = {**os.environ, "GPUOPS_TIMINGS_JSON": str(figures)}
    plain = subprocess.run([sys.executable, "-m", "gpuops.cli", "history", "-i", str(inventory)],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    timed = subprocess.run([sys.executable, "-m", "gpuops.cli", "history", "-i", str(inventory), "--timings"],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert plain.returncode == timed.returncode == 0, timed.stderr
    assert timed.stdout == plain.stdout  # the report goes to stderr only
    lines = timed.stderr.splitlines()
    assert lines[0].startswith("timings: ") and lines[0].endswith(" s wall")
    shown = {(line.split()[0], line.split()[-1] if line.split()[-1] != "s" else None) for line in lines[1:]}
    for phase in ("startup", "imports", "inventory", "other"):
        assert (phase, None) in shown, timed.stderr
    assert ("exec", "here") in shown, timed.stderr  # a local host runs commands too, without SSH
    data = json.loads(figures.read_text())
    assert {"startup", "imports", "inventory", "other"} <= set(data["phases"])
    assert data["hosts"]["here"]["exec"] > 0
    total = sum(data["phases"].values()) + sum(data["hosts"]["here"].values())
    assert total == pytest.approx(data["wall"], rel=0.01)  # the phases account for the whole wall time


def test_double_verbose_prints_the_timings_too(tmp_path: Path) -> None:
    inventory = _local_inventory(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpuops.cli", "history", "-i", str(inventory), "-vv"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "here: transaction " in done.stderr and "\ntimings: " in done.stderr


# -- algorithm order -----------------------------------------------------------------------------

SUPPORTED = ("a-gcm", "b-gcm", "a-ctr", "b-ctr", "a-cbc")


def test_config_algorithm_lists_read_as_openssh_reads_them() -> None:
    current = ("a-ctr", "b-ctr", "a-gcm")
    assert apply_config(current, "b-gcm,a-ctr", SUPPORTED, "ciphers") == ("b-gcm", "a-ctr")  # replaces
    assert apply_config(current, "+a-cbc", SUPPORTED, "ciphers") == ("a-ctr", "b-ctr", "a-gcm", "a-cbc")  # appends
    assert apply_config(current, "-*-ctr", SUPPORTED, "ciphers") == ("a-gcm",)  # removes, wildcards
    assert apply_config(current, "^b-gcm", SUPPORTED, "ciphers") == ("b-gcm", "a-ctr", "b-ctr", "a-gcm")  # first
    assert apply_config(current, "*-gcm,unknown-cipher", SUPPORTED, "ciphers") == ("a-gcm", "b-gcm")
    with pytest.raises(AlgorithmError, match="Ciphers|ciphers 'chacha20-poly1305@openssh.com'"):
        apply_config(current, "chacha20-poly1305@openssh.com", SUPPORTED, "ciphers")
    with pytest.raises(AlgorithmError):
        apply_config(current, "-*", SUPPORTED, "ciphers")


def test_paramiko_offers_fast_algorithms_first_and_config_wins() -> None:
    import socket

    import paramiko

    left, right = socket.socketpair()  # a Transport to read paramiko's own order from (never started)
    try:
        transport = paramiko.Transport(left)
        options = transport.get_security_options()
        offered = {field: tuple(getattr(options, field)) for field in ("kex", "ciphers", "digests", "key_types")}
        default = preferences(offered, {})
        ciphers = default["ciphers"]
        assert ciphers[0] == "aes128-gcm@openssh.com" and set(ciphers) == set(offered["ciphers"])
        assert ciphers.index("aes128-ctr") < ciphers.index("aes128-cbc")
        configured = preferences(offered, {"ciphers": "aes256-ctr", "kexalgorithms": "curve25519-sha256",
                                           "hostkeyalgorithms": "^ssh-ed25519-cert-v01@openssh.com,ssh-ed25519"})
        assert configured["ciphers"] == ("aes256-ctr",)
        assert configured["kex"] == ("curve25519-sha256@libssh.org",)  # OpenSSH's name for it
        assert configured["key_types"][:2] == ("ssh-ed25519-cert-v01@openssh.com", "ssh-ed25519")
        assert fast_first(("x", "y", "z"), ("z", "q")) == ("z", "x", "y")
        order_algorithms(transport, {"macs": "hmac-sha2-512"})  # through paramiko's public SecurityOptions
        assert transport.preferred_macs == ("hmac-sha2-512",) and transport.preferred_ciphers[0] == "aes128-gcm@openssh.com"
        transport.close()
    finally:
        left.close()
        right.close()


def _prints_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter (what it imports is the point): it must print OK."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "OK", done.stderr


def test_planner_and_code_digest_leave_the_planning_machinery_unimported_until_a_plan_is_made() -> None:
    # What a no-op apply with a recalled plan needs from the planner (Discovery, vars_digest) and
    # the memo's code digest must not import roles, module specs or templating; planning still works.
    heavy = ("gpuops.plan.roles", "gpuops.plan.modules", "gpuops.plan.templating", "gpuops.plan.argspec")
    code = ("import sys\nfrom gpuops.plan.planner import Discovery, discover, plan_role, vars_digest\n"
            "from gpuops.memo import code_digest\ncode_digest()\nvars_digest({}, {})\n"
            f"early = [m for m in {heavy!r} if m in sys.modules]\nassert not early, early\n"
            "d = discover('nccl-env', 'h', {}, {})\nassert isinstance(d, Discovery) and d.paths, d\n"
            f"assert all(m in sys.modules for m in {heavy!r})\nprint('OK')\n")
    _prints_ok(code)


def test_inspect_loads_no_planning_machinery_before_or_while_it_judges() -> None:
    # inspect judges gates and tells facts: it plans nothing, so neither its module nor what it
    # prefetches during the exec (the gate catalog, inspection.py) may import the role specs' planners.
    planning = ("gpuops.plan.roles", "gpuops.plan.modules", "gpuops.plan.templating")
    code = ("import sys\nimport gpuops.commands.inspect\nfrom gpuops.gates.catalog import load_catalog\n"
            "from gpuops.prefetch import prefetch\nprefetch(load_catalog).join()\n"
            f"loaded = [m for m in {planning!r} if m in sys.modules]\nassert not loaded, loaded\nprint('OK')\n")
    _prints_ok(code)


def test_plan_model_builds_the_change_classes_only_when_asked_and_they_are_the_same_classes() -> None:
    code = ("import sys\nfrom gpuops.plan.model import FileState, Plan, PlanFacts\n"
            "p = Plan(host='h', role='r', changes=(), handlers=(), service=None)\n"
            "assert 'gpuops.plan.changes' not in sys.modules\n"
            "from gpuops.plan.model import AuditCheck, Change, CompileCheck, HandlerRun, ServiceSpec, sha256_text\n"
            "import gpuops.plan.changes as c\n"
            "assert (Change, ServiceSpec, HandlerRun, CompileCheck, AuditCheck, sha256_text) == "
            "(c.Change, c.ServiceSpec, c.HandlerRun, c.CompileCheck, c.AuditCheck, c.sha256_text)\n"
            "import gpuops.plan.model as m\n"
            "try:\n    m.NoSuchName\nexcept AttributeError:\n    print('OK')\n")
    _prints_ok(code)


def test_server_facts_import_their_parsers_only_to_parse_a_running_server() -> None:
    # apply gathers only the GPU facts; the server probe's parsers (launch flags, model config) are
    # imported when a running server's output is parsed (tests/unit/test_facts_server.py parses).
    code = ("import sys\nfrom gpuops.facts.server import ServerFacts, parse_server, server_probe\n"
            "ServerFacts(known=False, reason='not gathered')\n"
            "late = [m for m in ('gpuops.facts.server_args', 'gpuops.facts.served_model') if m in sys.modules]\n"
            "assert not late, late\nprint('OK')\n")
    _prints_ok(code)
