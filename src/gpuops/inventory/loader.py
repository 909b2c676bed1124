"""``load_inventory``: from what the user passed with -i (or nothing) to an ``Inventory``.

-i may name a YAML or INI inventory file, a directory of them (merged; group_vars/ and host_vars/
inside it), or a comma-separated host list (``gpu01,gpu02:2222``) like Ansible's. No -i and no
$GPUOPS_INVENTORY: the machine you stand on, as host ``localhost`` with a local connection.
"""

from __future__ import annotations

import os
from types import MappingProxyType

from gpuops.errors import InventoryError
from gpuops.inventory.builder import ALL, InventoryBuilder, resolve
from gpuops.inventory.hostnames import HostPatternError, expand_host_entry
from gpuops.inventory.ini_source import read_ini_inventory
from gpuops.inventory.model import Group, Host, Inventory
from gpuops.inventory.varsfiles import VarsDirectory
from gpuops.inventory.yaml_source import read_yaml_inventory
from gpuops.inventory.yamlfile import parse_yaml_text, read_text

INVENTORY_ENV = "GPUOPS_INVENTORY"
_YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Files in an inventory directory that are not inventories (editor leftovers, docs, ...).
_IGNORED_EXTENSIONS = (".md", ".txt", ".rst", ".cfg", ".retry", ".orig", ".bak", ".swp", ".pyc", ".pyo", "~")
_VARS_DIRS = ("group_vars", "host_vars")


def load_inventory(path: str | None) -> Inventory:
    if path is None:
        path = os.environ.get(INVENTORY_ENV) or None
    if path is None:
        return local_inventory()
    if os.path.isdir(path):
        files = _inventory_files(path)
        if not files:
            raise InventoryError(f"{path}: the directory holds no inventory files")
        base_dir = path
    elif os.path.isfile(path):
        files = [path]
        base_dir = os.path.dirname(os.path.abspath(path))
    elif "," in path:
        return _host_list_inventory(path)
    else:
        raise InventoryError(f"{path}: no such inventory file or directory")
    builder = InventoryBuilder()
    for file in files:
        _read_inventory_file(file, builder)
    return resolve(
        builder,
        source=path,
        base_dir=base_dir,
        group_vars=VarsDirectory([os.path.join(base_dir, "group_vars")]),
        host_vars=VarsDirectory([os.path.join(base_dir, "host_vars")]),
    )


def local_inventory() -> Inventory:
    """The default inventory: this machine, reached without ssh."""
    host = Host(
        name="localhost",
        address=None,
        port=None,
        user=None,
        key_file=None,
        connection="local",
        groups=(ALL, "ungrouped"),
        vars=MappingProxyType({"ansible_connection": "local"}),
    )
    groups = {
        ALL: Group(ALL, 0, (), ("ungrouped",), ("localhost",), MappingProxyType({})),
        "ungrouped": Group("ungrouped", 1, (ALL,), (), ("localhost",), MappingProxyType({})),
    }
    return Inventory(source="<localhost>", hosts=(host,), groups=MappingProxyType(groups))


def _read_inventory_file(path: str, builder: InventoryBuilder) -> None:
    text = read_text(path)
    if path.endswith(_YAML_EXTENSIONS):
        read_yaml_inventory(parse_yaml_text(text, path), path, builder)
    elif path.endswith(".ini"):
        read_ini_inventory(text, path, builder)
    else:
        # No telling extension: a file that reads as a YAML mapping is YAML, anything else INI.
        try:
            data = parse_yaml_text(text, path)
        except InventoryError:
            data = None
        if isinstance(data, dict):
            read_yaml_inventory(data, path, builder)
        else:
            read_ini_inventory(text, path, builder)


def _inventory_files(directory: str) -> list[str]:
    found: list[str] = []
    for entry in sorted(os.listdir(directory)):
        full = os.path.join(directory, entry)
        if entry.startswith(".") or entry.endswith(_IGNORED_EXTENSIONS):
            continue
        if os.path.isdir(full):
            if entry not in _VARS_DIRS:
                found.extend(_inventory_files(full))
        elif os.path.isfile(full):
            found.append(full)
    return found


def _host_list_inventory(spec: str) -> Inventory:
    builder = InventoryBuilder()
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        try:
            names, port = expand_host_entry(entry)
        except HostPatternError as exc:
            raise InventoryError(f"host list {spec!r}: {exc}") from None
        for name in names:
            builder.add_host(name, "ungrouped", {"ansible_port": port} if port else {})
    return resolve(builder, source=spec, base_dir=os.getcwd(), group_vars=lambda _: {}, host_vars=lambda _: {})
