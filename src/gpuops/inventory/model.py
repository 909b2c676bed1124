"""The inventory as values: hosts, groups, and the inventory that holds them.

Everything here is immutable once loaded: a ``Host`` is what the transport needs to reach a machine
plus the merged variables that roles read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.limit import Names, select_names
from gpuops.inventory.vault import NO_PASSWORD_HINT, find_encrypted
from gpuops.frozen import frozen


@frozen
class Host:
    """One machine of the inventory, with its variables already merged (Ansible precedence)."""

    name: str  # inventory name
    address: str | None  # ansible_host; None: the transport resolves `name` (~/.ssh/config)
    port: int | None  # ansible_port
    user: str | None  # ansible_user
    key_file: str | None  # ansible_ssh_private_key_file, ~ and relative paths expanded
    connection: str  # "ssh" | "local"
    groups: tuple[str, ...]  # every group it belongs to, "all" first, then by depth and name
    # Merged: inventory group vars (all < parent < child) < group_vars files (same order)
    #         < inventory host vars < host_vars files. Read-only at the top level.
    vars: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # A group_vars/host_vars file of this host encrypted as a whole, that no password given could
    # open: its variables are unknown, so selecting the host fails (Inventory.select), not loading.
    unread_vault_file: str | None = None
    # Where a vault password was given and these variables hold something encrypted: the same
    # host with its vault values and files opened (a wrong password names the file). Called by
    # Inventory.select for the hosts a command acts on only (inventory/builder.resolve).
    open_vault: Callable[[], "Host"] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def is_local(self) -> bool:
        return self.connection == "local"


@frozen
class Group:
    """A group of the inventory; `hosts` lists its members including those of its descendants."""

    name: str
    depth: int  # all = 0, its children 1, ...: deeper groups' vars win
    parents: tuple[str, ...]
    children: tuple[str, ...]
    hosts: tuple[str, ...]
    vars: Mapping[str, Any] = field(default_factory=dict, hash=False)


@frozen
class Inventory:
    """Hosts and groups loaded from one inventory source (a file, a directory, or the default)."""

    source: str  # what the user named with -i (or "<localhost>"): used in error messages
    hosts: tuple[Host, ...]
    groups: Mapping[str, Group] = field(default_factory=dict, hash=False)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InventoryError(f"no host named {name!r} in {self.source}")

    def select(self, limit: str | None) -> list[Host]:
        """The hosts a command acts on: all of them, or those an Ansible-like --limit matches.

        Raises InventoryError when nothing matches, when a term names no host or group, or when a
        selected host's private key file does not exist (checked here, not at load, so that a
        broken host left out by --limit does not block the others).
        """
        if limit is None or not limit.strip():
            selected = list(self.hosts)
            if not selected:
                raise InventoryError(f"no hosts in inventory {self.source}")
        else:
            names = Names(self.source, [host.name for host in self.hosts],
                          {name: group.hosts for name, group in self.groups.items()})
            chosen = set(select_names(names, limit))
            selected = [host for host in self.hosts if host.name in chosen]
        selected = [host.open_vault() if host.open_vault is not None else host for host in selected]
        for host in selected:
            _refuse_encrypted(host)
            if host.key_file is not None and not os.path.isfile(host.key_file):
                raise InventoryError(
                    f"{host.name}: private key file {host.key_file} does not exist "
                    f"(ansible_ssh_private_key_file in {self.source})"
                )
        return selected


def _refuse_encrypted(host: Host) -> None:
    """A selected host whose variables still hold a vault value nobody could decrypt: one clear line."""

    if host.unread_vault_file is not None:
        raise InventoryError(f"{host.unread_vault_file} is vault-encrypted (variables of host {host.name}): "
                             f"{NO_PASSWORD_HINT}")
    for name, value in (host.vars or {}).items():
        found = find_encrypted(value, name)
        if found:
            raise InventoryError(
                f"{found[1].where}: variable {name} (host {host.name}) is vault-encrypted: {NO_PASSWORD_HINT}")
