"""Ansible's YAML inventory format, read as-is.

    all:
      vars: {...}
      hosts: {gpu01: {ansible_host: 10.0.0.1}, gpu02: }
      children:
        gpus:
          hosts: {gpu01: }
          children: {...}

Top-level keys other than ``all`` are groups too (children of ``all``).
"""

from __future__ import annotations

from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.builder import ALL, InventoryBuilder
from gpuops.inventory.hostnames import HostPatternError, expand_host_entry
from gpuops.inventory.yamlfile import MarkedDict, plain

_GROUP_KEYS = ("hosts", "children", "vars")


def read_yaml_inventory(data: Any, path: str, builder: InventoryBuilder) -> None:
    if data is None:
        raise InventoryError(f"{path}: the inventory is empty")
    if not isinstance(data, dict):
        raise InventoryError(
            f"{path}: an inventory must be a mapping of groups (e.g. 'all:'), not {_kind(data)}"
        )
    if "plugin" in data:
        raise InventoryError(
            f"{path}: inventory plugin {data['plugin']!r} is Ansible's own code: name the file with a .yml "
            f"extension so gpuops hands it to ansible-inventory")
    for name, group_data in data.items():
        _read_group(str(name), group_data, path, builder, parent=None, line=_key_line(data, name) or _line(data))


def _read_group(
    name: str, data: Any, path: str, builder: InventoryBuilder, parent: str | None, line: int | None
) -> None:
    builder.group(name)
    if parent is not None:
        if name == ALL:
            raise InventoryError(f"{_where(path, line)}: group 'all' cannot be a child of {parent!r}")
        builder.add_child(parent, name)
    if data is None:
        return
    if not isinstance(data, dict):
        raise InventoryError(
            f"{_where(path, line)}: group {name!r} must be a mapping with hosts/children/vars, not {_kind(data)}"
        )
    line = _line(data) or line
    for key in data:
        if key not in _GROUP_KEYS:
            raise InventoryError(
                f"{_where(path, _key_line(data, key) or line)}: group {name!r} has unexpected key {key!r} "
                f"(only hosts, children and vars are valid; hosts go under 'hosts:')"
            )
    variables = data.get("vars")
    if variables is not None:
        builder.set_group_vars(name, _mapping(variables, f"vars of group {name!r}", path, line))
    hosts = data.get("hosts")
    if hosts is not None:
        hosts = _mapping(hosts, f"hosts of group {name!r}", path, line, allow_marked=True)
        host_line = _line(hosts) or line
        for entry, host_data in hosts.items():
            _read_host(str(entry), host_data, name, path, builder, _key_line(hosts, entry) or host_line)
    children = data.get("children")
    if children is not None:
        children = _mapping(children, f"children of group {name!r}", path, line, allow_marked=True)
        child_line = _line(children) or line
        for child, child_data in children.items():
            _read_group(str(child), child_data, path, builder, parent=name, line=_key_line(children, child) or child_line)


def _read_host(entry: str, data: Any, group: str, path: str, builder: InventoryBuilder, line: int | None) -> None:
    if data is not None and not isinstance(data, dict):
        raise InventoryError(
            f"{_where(path, line)}: host {entry!r} in group {group!r} must map to its variables "
            f"(a mapping or nothing), not {_kind(data)}"
        )
    try:
        names, port = expand_host_entry(entry)
    except HostPatternError as exc:
        raise InventoryError(f"{_where(path, line)}: {exc}") from None
    variables: dict[str, Any] = {}
    if port is not None:
        variables["ansible_port"] = port
    for key in data or {}:
        if not isinstance(key, str):
            raise InventoryError(f"{_where(path, _line(data) or line)}: host {entry!r}: variable name {key!r} is not a string")
    variables.update(plain(data or {}))
    for name in names:
        builder.add_host(name, group, variables)


def _mapping(value: Any, what: str, path: str, line: int | None, allow_marked: bool = False) -> dict:
    if not isinstance(value, dict):
        raise InventoryError(f"{_where(path, line)}: {what} must be a mapping, not {_kind(value)}")
    for key in value:
        if not allow_marked and not isinstance(key, str):
            raise InventoryError(f"{_where(path, _line(value) or line)}: {what}: name {key!r} is not a string")
    return value if allow_marked else plain(value)


def _key_line(value: Any, key: Any) -> int | None:
    return value.key_lines.get(str(key)) if isinstance(value, MarkedDict) else None


def _line(value: Any) -> int | None:
    return value.line if isinstance(value, MarkedDict) else None


def _where(path: str, line: int | None) -> str:
    return f"{path}:{line}" if line else path


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) < 40 else "a string"
    return f"a {type(value).__name__}"
