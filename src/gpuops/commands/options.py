"""Click options shared by every command that works on inventory hosts, defined once (pip-tools' way).

``inventory_options`` adds Ansible's host-selection and connection flags and hands the command one
``InventorySpec`` as its ``inventory`` argument (``load_inventory`` takes it as it takes a path):

    -i/--inventory (repeatable, merged in order)   -l/--limit   --list-hosts
    --vault-password-file   --vault-id   -J/--ask-vault-pass
    -u/--user   --private-key   -b/--become   -K/--ask-become-pass   -v/-vv/-vvv

``-u``, ``--private-key``, ``-b`` and ``-K`` become the defaults of ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_become`` and ``ansible_become_password`` (with ``-b``
or ``-K``, ``$GPUOPS_BECOME_PASS`` is that password when set): the inventory's own values win, as
in Ansible. So every command that reaches hosts becomes the same way: the connection runs each of
its commands through sudo (``gpuops.transport.become``). ``--list-hosts`` prints the hosts the
command would work on and exits.

Other modules add their own options next to these; keep additions here additive.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from gpuops import memo, timings
from gpuops.errors import GpuopsError
from gpuops.inventory import load_inventory
from gpuops.inventory.loader import InventorySpec
from gpuops.inventory.vault import VaultText, vault_from_options
from gpuops.transport.rollout import Rollout
from gpuops.transport.verbose import configure

INVENTORY_HELP = ("Inventory: file, directory, executable script, `ansible-inventory --list` JSON, plugin file "
                  "or host list (repeatable; default: $GPUOPS_INVENTORY, else this machine).")
BECOME_PASS_ENV = "GPUOPS_BECOME_PASS"

_INVENTORY_PARAMS = ("vault_password_files", "vault_ids", "ask_vault_pass", "list_hosts", "remote_user",
                     "private_key", "become", "ask_become_pass", "verbose", "connection", "timings")


def guide(*pages: str) -> str:
    """A command's ``--help`` epilog naming its pages of the user guide (``docs/``, installed with the
    package as ``gpuops/data/docs/``), so the help a user reads points at the longer text."""
    return "User guide: " + ", ".join(f"docs/{page}" for page in pages) + " (README.md lists every page)."


def inventory_options(fn: Callable[..., Any] | None = None, *, limit_help: str = "Only hosts matching an Ansible-like pattern (name, group, glob, a:b, a:&b, a:!b, ~regex).") -> Any:
    """Add the host-selection options; the command receives ``inventory`` (an InventorySpec) and ``limit``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            popped = {name: kwargs.pop(name) for name in _INVENTORY_PARAMS}
            if popped["verbose"]:
                configure(popped["verbose"])
            if popped["timings"] or popped["verbose"] >= 2:
                timings.enable()
                try:
                    return _run_command(command, popped, args, kwargs)
                finally:
                    timings.finish()
            return _run_command(command, popped, args, kwargs)

        options = [
            click.option("-i", "--inventory", "inventory", multiple=True, metavar="INVENTORY", help=INVENTORY_HELP),
            click.option("-l", "--limit", metavar="PATTERN", help=limit_help),
            click.option("--list-hosts", "list_hosts", is_flag=True, help="Print the hosts that would be worked on, then stop."),
            click.option("--vault-password-file", "vault_password_files", multiple=True, metavar="FILE",
                         help="Vault password file, or a script that prints it (repeatable; default $ANSIBLE_VAULT_PASSWORD_FILE)."),
            click.option("--vault-id", "vault_ids", multiple=True, metavar="[ID@]FILE|prompt",
                         help="A vault password with its vault id (repeatable)."),
            click.option("-J", "--ask-vault-pass", "ask_vault_pass", is_flag=True, help="Ask for the vault password."),
            click.option("-u", "--user", "remote_user", metavar="USER", help="SSH user for hosts without ansible_user."),
            click.option("--private-key", "private_key", metavar="FILE", type=click.Path(dir_okay=False),
                         help="SSH private key for hosts without ansible_ssh_private_key_file."),
            click.option("-b", "--become", "become", is_flag=True,
                         help="Run every command on the hosts through sudo (hosts without ansible_become; "
                              f"password: -K, ansible_become_password or ${BECOME_PASS_ENV})."),
            click.option("-K", "--ask-become-pass", "ask_become_pass", is_flag=True,
                         help=f"Ask for the sudo password (else ansible_become_password, ${BECOME_PASS_ENV})."),
            click.option("--connection", "connection", type=click.Choice(["paramiko", "openssh"]),
                         help="SSH client for hosts without gpuops_connection: paramiko (default) or the system's "
                              "OpenSSH (all of ~/.ssh/config, connection sharing with ControlPersist)."),
            click.option("-v", "--verbose", "verbose", count=True,
                         help="On stderr: -v each remote command, -vv with timings, -vvv with the raw host output."),
            click.option("--timings", "timings", is_flag=True,
                         help="On stderr at the end: the wall time by phase (start-up, imports, inventory, "
                              "connect, auth, exec, parse, plan, render; -vv prints it too)."),
        ]
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate(fn) if fn is not None else decorate


def _run_command(command: Callable[..., Any], popped: dict[str, Any], args: Any, kwargs: dict[str, Any]) -> Any:
    spec = inventory_spec(kwargs.get("inventory") or (), popped)
    kwargs["inventory"] = spec
    if popped["list_hosts"]:
        _list_hosts(spec, kwargs.get("limit"))
        sys.exit(0)
    return command(*args, **kwargs)


def inventory_spec(sources: tuple[str, ...] | str, flags: dict[str, Any]) -> Any:
    """The InventorySpec for the -i sources and the flags ``inventory_options`` collected."""

    if isinstance(sources, str):
        sources = (sources,)
    prompt = _prompt if sys.stdin.isatty() else None
    vault = vault_from_options(flags.get("vault_password_files") or (), flags.get("vault_ids") or (),
                               ask=bool(flags.get("ask_vault_pass")), prompt=prompt)
    vault_args: list[str] = []
    for path in flags.get("vault_password_files") or ():
        vault_args += ["--vault-password-file", path]
    for spec in flags.get("vault_ids") or ():
        if not spec.endswith("@prompt") and spec != "prompt":
            vault_args += ["--vault-id", spec]
    defaults: dict[str, Any] = {}
    if flags.get("remote_user"):
        defaults["ansible_user"] = flags["remote_user"]
    if flags.get("connection"):
        defaults["gpuops_connection"] = flags["connection"]
    if flags.get("private_key"):
        defaults["ansible_ssh_private_key_file"] = os.path.abspath(os.path.expanduser(flags["private_key"]))
    if flags.get("ask_become_pass"):
        password = os.environ.get(BECOME_PASS_ENV)
        if password is None:
            if prompt is None:
                raise GpuopsError(f"-K/--ask-become-pass needs a terminal to ask on (or set ${BECOME_PASS_ENV})")
            password = prompt("BECOME password: ")
        defaults["ansible_become_password"] = VaultText(password)
    elif flags.get("become") and os.environ.get(BECOME_PASS_ENV) is not None:
        defaults["ansible_become_password"] = VaultText(os.environ[BECOME_PASS_ENV])  # as -b always took it
    if flags.get("become"):
        defaults["ansible_become"] = True
    return InventorySpec(tuple(sources), vault, tuple(vault_args), defaults)


def _prompt(text: str) -> str:
    return click.prompt(text.rstrip(": "), hide_input=True, default="", show_default=False, err=True)


def _list_hosts(spec: Any, limit: str | None) -> None:
    """Ansible's --list-hosts: the hosts a command would work on, one a line, nothing contacted."""

    hosts = load_inventory(spec).select(limit)
    click.echo(f"  hosts ({len(hosts)}):")
    for host in hosts:
        click.echo(f"    {host.name}")


def forks_option(help: str = "Hosts worked on at once.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("-f", "--forks", type=click.IntRange(1, 256), default=16, show_default=True, help=help)


def host_key_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--accept-new-host-keys", is_flag=True, help="Record unknown SSH host keys (a changed key still fails the host)."),
        click.option("--known-hosts", "known_hosts", multiple=True, type=click.Path(dir_okay=False), help="Extra known_hosts file (repeatable)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def rollout_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--serial and --max-fail-percentage, handed to the command as one ``rollout`` (or None)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        serial, max_fail = kwargs.pop("serial"), kwargs.pop("max_fail_percentage")
        kwargs["rollout"] = Rollout.parse(serial, max_fail)
        return fn(*args, **kwargs)

    options = [
        click.option("--serial", metavar="N|N%|N,M%,...",
                     help="Work on hosts in batches, each finished (restarted, healthy) before the next: "
                          "a count, a percentage, or Ansible's list of batch sizes (the last repeats)."),
        click.option("--max-fail-percentage", "max_fail_percentage", type=click.FloatRange(0, 100), metavar="P",
                     help="Stop before the next batch once more than P% of a batch failed (0: any failure stops)."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


# One switch for what gpuops keeps between runs (gpuops/memo.py), on every command that recalls it.
flush_cache_option = click.option(
    "--flush-cache", "flush_cache", is_flag=True,
    help="Forget what is kept between runs for the selected hosts (GPU facts, gate scans, verdicts, no-op "
         "plans), then gather, scan, judge and plan afresh; what this run finds is kept again. "
         "GPUOPS_KEEP=off keeps nothing at all.")


def forget_kept(hosts: Any) -> None:
    """--flush-cache: the selected hosts' kept results are deleted before the run (memo.forget_hosts)."""
    import logging

    removed = memo.forget_hosts(hosts)
    logging.getLogger("gpuops.transport").info("--flush-cache: forgot %d kept results of %d hosts", removed, len(hosts))
