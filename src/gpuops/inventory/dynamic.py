"""Inventories that are programs: executable inventory scripts, and plugin files Ansible resolves.

A script (an executable file starting with ``#!``) is run as Ansible runs it: ``SCRIPT --list``,
then ``SCRIPT --host NAME`` per host when its answer has no ``_meta``. Every run has a timeout
(``$GPUOPS_INVENTORY_TIMEOUT`` seconds, default 60) and a failure names the script and its last
stderr line; its stdout is never echoed (it may hold secrets).

An inventory plugin file (YAML with ``plugin:``: ``constructed``, ``amazon.aws.aws_ec2``, ...) is
Ansible's own code to run: gpuops hands every source to ``ansible-inventory --list`` when that is
installed, and reads the JSON it prints. Without it, one line names the plugin and what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

from gpuops.errors import InventoryError

TIMEOUT_ENV = "GPUOPS_INVENTORY_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
ANSIBLE_INVENTORY_ENV = "GPUOPS_ANSIBLE_INVENTORY"  # the ansible-inventory to use (default: PATH)


def timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InventoryError(f"${TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def is_inventory_script(path: str) -> bool:
    """An executable file that starts with ``#!``: Ansible's script inventory."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def run_json(argv: Sequence[str], what: str, env: dict[str, str] | None = None,
             explain: Callable[[list[str]], str] | None = None) -> object:
    """Run a program that prints one JSON document; errors name `what` and say why, in one line.

    `explain(stderr_lines)` picks the reason from stderr (default: its last line).
    """
    limit = timeout()
    try:
        done = subprocess.run(list(argv), capture_output=True, timeout=limit, check=False, stdin=subprocess.DEVNULL,
                              env=env)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"{what} did not finish within {limit:g} s (${TIMEOUT_ENV} sets the limit)") from None
    except OSError as exc:
        raise InventoryError(f"{what} cannot be run: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.decode("utf-8", errors="replace").splitlines() if line.strip()]
        tail = (explain or _last_line)(lines) if lines else "no message on stderr"
        tail = " ".join(tail.split())
        raise InventoryError(f"{what} failed (exit status {done.returncode}): {tail[:300]}")
    try:
        return json.loads(done.stdout.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise InventoryError(f"{what} did not print a JSON document: {exc}") from None


def _last_line(lines: list[str]) -> str:
    return lines[-1]


def _ansible_reason(lines: list[str]) -> str:
    """Ansible's last error, with its first warning (usually the plugin's own complaint) beside it."""
    errors = [line for line in lines if line.startswith("[ERROR]")]
    warnings = [line for line in lines if line.startswith("[WARNING]")]
    last = errors[-1] if errors else lines[-1]
    return f"{last} ({warnings[0]})" if warnings else last


def script_list(path: str) -> object:
    return run_json([os.path.abspath(path), "--list"], f"inventory script {path} --list")


def script_host(path: str, host: str) -> dict:
    data = run_json([os.path.abspath(path), "--host", host], f"inventory script {path} --host {host}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError(f"inventory script {path} --host {host}: expected a JSON object of variables")
    return data


def ansible_inventory_command() -> str | None:
    """``ansible-inventory`` on PATH (or beside this python, as in a venv), or None."""
    configured = os.environ.get(ANSIBLE_INVENTORY_ENV)
    if configured:
        return configured
    found = shutil.which("ansible-inventory")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    return beside if os.access(beside, os.X_OK) else None


def ansible_list(sources: Sequence[str], vault_args: Sequence[str], why: str) -> object:
    """Every source resolved by Ansible itself, as the JSON of ``ansible-inventory --list``."""
    command = ansible_inventory_command()
    if command is None:
        raise InventoryError(
            f"{why}: that is Ansible's own code; install ansible-core (ansible-inventory on PATH) and gpuops "
            f"asks it, or pass the JSON that `ansible-inventory -i SOURCE --list` prints")
    argv = [command]
    for source in sources:
        argv += ["-i", source]
    argv += [*vault_args, "--list"]
    # Ansible only warns about a source it cannot parse and goes on with fewer hosts: make it fail.
    env = {**os.environ, "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"}
    return run_json(argv, f"ansible-inventory ({why})", env=env, explain=_ansible_reason)
