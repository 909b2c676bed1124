"""Ansible's command-line habits on gpuops' host commands: -i (repeatable), --list-hosts, -u,
--private-key, vault flags, short flags. Nothing here contacts a host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuops.inventory import load_inventory
from gpuops.inventory.loader import InventorySpec
from labtools import gpuops_cli_forked


def gpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuops.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, stdin=subprocess.DEVNULL)


def gpuops_each(commands: list[tuple[str, ...]], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Each command in a process of its own, forked from one that imported gpuops once
    (labtools.gpuops_cli_forked; stdin /dev/null as above)."""
    return gpuops_cli_forked(commands, cwd=cwd, env=dict(os.environ), timeout=120)


def test_list_hosts_with_several_sources_and_a_limit(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("all:\n  children:\n    gpus:\n      hosts: {gpu01: , gpu02: }\n")
    script = tmp_path / "cmdb.sh"
    script.write_text('#!/bin/sh\necho \'{"edge": ["edge01"], "_meta": {"hostvars": {}}}\'\n')
    script.chmod(0o755)
    commands = [("apply", "nccl-env"), ("inspect", "host"), ("rollback",), ("history",), ("bench", "--remote", "--suite", "decode")]
    runs = gpuops_each([(*c, "-i", "a.yml", "-i", "cmdb.sh", "-l", "gpus:edge:!gpu02", "--list-hosts") for c in commands],
                       tmp_path)
    for command, done in zip(commands, runs):
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout == "  hosts (2):\n    gpu01\n    edge01\n", command


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("all:\n  hosts: {gpu01: }\n")
    cases = [
        (("apply", "nccl-env", "-i", "a.yml", "--serial", "0%"), "--serial '0%'"),
        (("apply", "nccl-env", "-i", "a.yml", "--vault-password-file", "missing"), "vault password file missing does not exist"),
        (("inspect", "host", "-i", "a.yml", "-K"), "-K/--ask-become-pass needs a terminal"),
        (("apply", "nccl-env", "-i", "nowhere.yml"), "nowhere.yml: no such inventory file or directory"),
    ]
    for (args, expected), done in zip(cases, gpuops_each([args for args, _ in cases], tmp_path)):
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)


def test_short_flags_exist() -> None:
    from click.testing import CliRunner

    from gpuops.cli import cli

    out = CliRunner().invoke(cli, ["apply", "--help"]).output
    for flag in ("-f, --forks", "-C, --check", "-D, --diff", "-b, --become", "-K, --ask-become-pass", "-u, --user",
                 "--private-key", "--list-hosts", "-J, --ask-vault-pass", "--vault-id", "--serial", "--max-fail-percentage"):
        assert flag in out, flag
    # become is one option of every command that reaches hosts (the connection does the rest)
    for command in (["inspect", "host"], ["inspect", "gates"], ["bench", "decode"], ["bench"], ["tune"],
                    ["apply"], ["rollback"], ["history"]):
        out = CliRunner().invoke(cli, [*command, "--help"]).output
        assert "-b, --become" in out and "-K, --ask-become-pass" in out, command


def test_user_and_key_flags_rank_below_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("all:\n  hosts:\n    gpu01: {ansible_user: ops}\n    gpu02:\n")
    spec = InventorySpec(("a.yml",), defaults={"ansible_user": "cli-user", "ansible_ssh_private_key_file": "/k"})
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        gpu01, gpu02 = load_inventory(spec).hosts
    finally:
        os.chdir(cwd)
    assert (gpu01.user, gpu02.user) == ("ops", "cli-user") and gpu02.key_file == "/k"


def test_ansible_python_interpreter_runs_the_helpers_unless_gpuops_python_is_set(tmp_path: Path) -> None:
    path = tmp_path / "a.yml"
    path.write_text("all:\n  vars: {ansible_python_interpreter: /opt/py/bin/python3}\n  hosts:\n"
                    "    gpu01:\n    gpu02: {gpuops_python: /usr/bin/python3}\n"
                    "    gpu03: {ansible_python_interpreter: auto_silent}\n")
    gpu01, gpu02, gpu03 = load_inventory(str(path)).hosts
    assert gpu01.vars["gpuops_python"] == "/opt/py/bin/python3"
    assert gpu02.vars["gpuops_python"] == "/usr/bin/python3"
    assert "gpuops_python" not in gpu03.vars


def test_verbosity_levels_add_commands_timings_then_raw_output(tmp_path: Path) -> None:
    (tmp_path / "local.yml").write_text(
        f"all:\n  hosts:\n    here: {{ansible_connection: local, gpuops_state_dir: '{tmp_path / 'state'}'}}\n")
    seen = {}
    for flag in ("", "-v", "-vv", "-vvv"):
        done = gpuops("history", "-i", "local.yml", *([flag] if flag else []), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        seen[flag] = done.stderr
    assert seen[""] == ""
    assert "here: exec " in seen["-v"] and " in 0." not in seen["-v"] and "stdout:" not in seen["-v"]
    # history runs its helper on a transaction channel (conn.open_stream), not through conn.run
    assert "here: connected in " in seen["-vv"] and "here: transaction " in seen["-vv"] and "stdout:" not in seen["-vv"]


def test_extra_vars_files_with_vault_values_need_the_password(tmp_path: Path) -> None:
    from test_inventory_vault import DB_PASSWORD_11

    (tmp_path / "a.yml").write_text("all:\n  hosts: {gpu01: {ansible_connection: local}}\n")
    (tmp_path / "secrets.yml").write_text(DB_PASSWORD_11)
    (tmp_path / "pw").write_text("first-pw\n")
    done = gpuops("apply", "nccl-env", "-i", "a.yml", "-e", "@secrets.yml", cwd=tmp_path)
    assert done.returncode == 2 and "-e @secrets.yml:1: variable db_password is vault-encrypted" in done.stderr, done.stderr
    from gpuops.commands.apply import _decrypted
    from gpuops.extravars import parse_extra_vars
    from gpuops.inventory.vault import VaultText, vault_from_options

    spec = InventorySpec((), vault_from_options(password_files=[str(tmp_path / "pw")]))
    value = _decrypted(parse_extra_vars([f"@{tmp_path / 'secrets.yml'}"]), spec)["db_password"]
    assert value == "s3cret-value" and isinstance(value, VaultText)
