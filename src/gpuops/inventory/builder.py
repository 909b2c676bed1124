"""Collects what the inventory parsers read, then resolves it into an ``Inventory``.

The parsers (YAML, INI) only describe: this group has these hosts, these children, these vars.
Resolution does what Ansible does afterwards: implicit ``all``/``ungrouped``, group depth, and the
variable merge in Ansible's precedence order.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.model import Group, Host, Inventory
from gpuops.inventory.vault import Vault, decrypt_values, find_encrypted
from gpuops.inventory.varsfiles import UNREAD_VAULT_FILE

ALL = "all"
UNGROUPED = "ungrouped"

# Connection values that mean "OpenSSH-style ssh" to us.
_SSH_CONNECTIONS = {"ssh", "smart", "paramiko", "paramiko_ssh"}


@dataclass
class GroupDefinition:
    """A group as the inventory files describe it, before resolution: its own vars, its child groups and the
    hosts listed in it directly."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # direct members only


@dataclass
class InventoryBuilder:
    """Mutable collector used while parsing one or more inventory files."""

    groups: dict[str, GroupDefinition] = field(default_factory=dict)
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)  # insertion = inventory order

    def __post_init__(self) -> None:
        self.group(ALL)
        self.group(UNGROUPED)
        self.add_child(ALL, UNGROUPED)

    def group(self, name: str) -> GroupDefinition:
        if name not in self.groups:
            self.groups[name] = GroupDefinition(name)
        return self.groups[name]

    def add_child(self, parent: str, child: str) -> None:
        children = self.group(parent).children
        self.group(child)
        if child not in children:
            children.append(child)

    def add_host(self, name: str, group: str, variables: Mapping[str, Any] | None = None) -> None:
        self.host_vars.setdefault(name, {}).update(variables or {})
        members = self.group(group).hosts
        if name not in members:
            members.append(name)

    def set_group_vars(self, group: str, variables: Mapping[str, Any]) -> None:
        self.group(group).vars.update(variables)


# Loads the group_vars/ or host_vars/ variables for one name ({} when there are none), opening
# vault-encrypted files with the given vault (None: an encrypted file is named, not opened).
VarsLookup = Callable[[str, "Vault | None"], dict[str, Any]]


def resolve(
    builder: InventoryBuilder,
    source: str,
    base_dir: str,
    group_vars: VarsLookup,
    host_vars: VarsLookup,
    vault: Vault | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Inventory:
    """Turn what the parsers collected into immutable hosts with merged variables."""
    _refuse_loops(builder, source)
    _attach_top_level_groups(builder)
    depths = _group_depths(builder, source)
    parents = _parents(builder)
    members = _members(builder)

    ordered_groups = sorted(builder.groups, key=lambda g: (depths[g], g))

    groups = {
        name: Group(
            name=name,
            depth=depths[name],
            parents=tuple(sorted(parents[name])),
            children=tuple(builder.groups[name].children),
            hosts=tuple(h for h in builder.host_vars if h in members[name]),
            vars=MappingProxyType(dict(builder.groups[name].vars)),
        )
        for name in ordered_groups
    }

    def merged_vars(name: str, host_groups: list[str], opening: Vault | None) -> dict[str, Any]:
        # Ansible's order: all's inventory vars < other groups' inventory vars (by depth, name)
        # < group_vars/all < group_vars/<group> (by depth, name) < inventory host vars < host_vars/.
        others = [g for g in host_groups if g != ALL]
        merged: dict[str, Any] = dict(defaults or {})  # command-line flags rank below the inventory
        for group in [ALL, *others]:
            merged.update(builder.groups[group].vars)
        for group in [ALL, *others]:
            merged.update(group_vars(group, opening))
        merged.update(builder.host_vars[name])
        merged.update(host_vars(name, opening))
        return decrypt_values(merged, opening)

    def make(name: str, host_groups: list[str], merged: dict[str, Any]) -> Host:
        unread = merged.pop(UNREAD_VAULT_FILE, None)  # a whole vars file nobody could decrypt
        host = _make_host(name, tuple(host_groups), copy.deepcopy(merged), source, base_dir)
        return dataclasses.replace(host, unread_vault_file=unread) if unread else host

    hosts: list[Host] = []
    for name in builder.host_vars:
        host_groups = [g for g in ordered_groups if name in members[g]]
        if host_groups == [ALL]:
            # Ansible puts hosts that belong to no group in "ungrouped".
            builder.groups[UNGROUPED].hosts.append(name)
            members[UNGROUPED].add(name)
            host_groups = [ALL, UNGROUPED]
            groups[UNGROUPED] = _with_host(groups[UNGROUPED], name)
        # Read without opening the vault: encrypted values and files stay encrypted. Where a
        # password was given and this host's variables hold something encrypted, the host is
        # opened only when a command selects it (Inventory.select), as Ansible decrypts only what
        # the selected hosts need: a host left out by --limit never needs the password.
        merged = merged_vars(name, host_groups, None)
        host = make(name, host_groups, merged)
        if vault is not None and vault.secrets and (host.unread_vault_file is not None or _holds_encrypted(merged)):
            def opened(name: str = name, host_groups: list[str] = host_groups) -> Host:
                return make(name, host_groups, merged_vars(name, host_groups, vault))

            host = dataclasses.replace(host, open_vault=opened)
        hosts.append(host)
    return Inventory(source=source, hosts=tuple(hosts), groups=MappingProxyType(groups))


def _holds_encrypted(merged: Mapping[str, Any]) -> bool:
    return any(find_encrypted(value, name) for name, value in merged.items())


def _with_host(group: Group, host: str) -> Group:
    return Group(group.name, group.depth, group.parents, group.children, (*group.hosts, host), group.vars)


def _attach_top_level_groups(builder: InventoryBuilder) -> None:
    # A group nobody lists as a child is a child of "all" (as in Ansible).
    listed = {child for g in builder.groups.values() for child in g.children}
    for name in list(builder.groups):
        if name != ALL and name not in listed:
            builder.add_child(ALL, name)


def _parents(builder: InventoryBuilder) -> dict[str, set[str]]:
    parents: dict[str, set[str]] = {name: set() for name in builder.groups}
    for group in builder.groups.values():
        for child in group.children:
            parents[child].add(group.name)
    return parents


def _refuse_loops(builder: InventoryBuilder, source: str) -> None:
    done: set[str] = set()

    def walk(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise InventoryError(f"{source}: group children form a loop: {cycle}")
        if name in done:
            return
        for child in builder.groups[name].children:
            walk(child, (*path, name))
        done.add(name)

    for name in list(builder.groups):
        walk(name, ())


def _group_depths(builder: InventoryBuilder, source: str) -> dict[str, int]:
    """Depth = longest path from "all" (there are no loops by now)."""
    depths: dict[str, int] = {}

    def walk(name: str, depth: int) -> None:
        if depths.get(name, -1) >= depth:
            return
        depths[name] = depth
        for child in builder.groups[name].children:
            walk(child, depth + 1)

    walk(ALL, 0)
    return depths


def _members(builder: InventoryBuilder) -> dict[str, set[str]]:
    """Every host of each group, including the hosts of its descendant groups."""
    cache: dict[str, set[str]] = {}

    def collect(name: str) -> set[str]:
        if name not in cache:
            found = set(builder.groups[name].hosts)
            for child in builder.groups[name].children:
                found |= collect(child)
            cache[name] = found
        return cache[name]

    for name in builder.groups:
        collect(name)
    cache[ALL] = set(builder.host_vars)
    return cache


def _first(variables: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = variables.get(name)
        if value is not None:
            return value
    return None


def _make_host(
    name: str, groups: tuple[str, ...], variables: dict[str, Any], source: str, base_dir: str
) -> Host:
    connection = str(_first(variables, "ansible_connection") or "ssh")
    if connection in _SSH_CONNECTIONS:
        connection = "ssh"
    elif connection != "local":
        raise InventoryError(
            f"{source}: host {name}: ansible_connection {connection!r} is not supported (use ssh or local)"
        )
    interpreter = variables.get("ansible_python_interpreter")
    if interpreter is not None and "gpuops_python" not in variables and not str(interpreter).startswith("auto"):
        # Ansible's interpreter runs gpuops' host-side helpers too ("auto*" asks for discovery,
        # which gpuops does by itself).
        variables["gpuops_python"] = str(interpreter)
    address = _first(variables, "ansible_host", "ansible_ssh_host")
    user = _first(variables, "ansible_user", "ansible_ssh_user")
    key_file = _first(variables, "ansible_ssh_private_key_file", "ansible_private_key_file")
    if key_file is not None:
        key_file = os.path.expanduser(str(key_file))
        if not os.path.isabs(key_file):
            key_file = os.path.normpath(os.path.join(base_dir, key_file))
    return Host(
        name=name,
        address=None if address is None else str(address),
        port=_port(_first(variables, "ansible_port", "ansible_ssh_port"), name, source),
        user=None if user is None else str(user),
        key_file=key_file,
        connection=connection,
        groups=groups,
        vars=MappingProxyType(variables),
    )


def _port(value: Any, host: str, source: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())
    ):
        raise InventoryError(f"{source}: host {host}: ansible_port {value!r} is not an integer")
    port = int(value)
    if not 0 < port < 65536:
        raise InventoryError(f"{source}: host {host}: ansible_port {port} is out of range (1-65535)")
    return port
