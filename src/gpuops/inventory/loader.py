"""``load_inventory``: from what the user passed with -i (or nothing) to an ``Inventory``.

-i may name a YAML or INI inventory file, a directory of them (merged; group_vars/ and host_vars/
inside it), an executable inventory script, the JSON ``ansible-inventory --list`` prints, an
inventory plugin file (resolved by ``ansible-inventory`` when installed), or a comma-separated host
list (``gpu01,gpu02:2222``) like Ansible's; several -i are merged in order, as Ansible does. No -i
and no $GPUOPS_INVENTORY: the machine you stand on, as host ``localhost`` with a local connection.
Vault values are decrypted with the passwords in the ``InventorySpec``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.builder import ALL, InventoryBuilder, resolve
from gpuops.inventory.hostnames import HostPatternError, expand_host_entry
from gpuops.inventory.dynamic import ansible_list, is_inventory_script, script_host, script_list
from gpuops.inventory.ini_source import read_ini_inventory
from gpuops.inventory.json_source import looks_like_json_inventory, read_json_inventory
from gpuops.inventory.model import Group, Host, Inventory
from gpuops.inventory.varsfiles import VarsDirectory
from gpuops.inventory.yaml_source import read_yaml_inventory
from gpuops.inventory.vault import Vault, is_encrypted
from gpuops.inventory.yamlfile import load_json_text, parse_yaml_text, read_text
from gpuops import timings
from gpuops.frozen import frozen

INVENTORY_ENV = "GPUOPS_INVENTORY"
_YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Files in an inventory directory that are not inventories (editor leftovers, docs, ...).
_IGNORED_EXTENSIONS = (".md", ".txt", ".rst", ".cfg", ".retry", ".orig", ".bak", ".swp", ".pyc", ".pyo", "~")
_VARS_DIRS = ("group_vars", "host_vars")
_PLUGIN_LINE = re.compile(r"^plugin\s*:", re.MULTILINE)


@frozen
class InventorySpec:
    """What the user named: the -i sources (in order, merged as Ansible merges them) and vault passwords."""

    sources: tuple[str, ...] = ()
    vault: Vault = field(default_factory=Vault)
    vault_args: tuple[str, ...] = ()  # the file-based vault options, passed on to ansible-inventory
    # Variables from command-line flags (-u, --private-key, -K): below every inventory variable,
    # as Ansible ranks its command-line connection options below the inventory's ansible_* vars.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:  # "was an inventory named?" (commands that need one ask this)
        return bool(self.sources)


def load_inventory(spec: str | Sequence[str] | InventorySpec | None) -> Inventory:
    with timings.span("inventory"):
        return _load_inventory(spec)


def _load_inventory(spec: str | Sequence[str] | InventorySpec | None) -> Inventory:
    if not isinstance(spec, InventorySpec):
        spec = InventorySpec(sources=(spec,) if isinstance(spec, str) else tuple(spec or ()))
    sources = spec.sources or ((os.environ[INVENTORY_ENV],) if os.environ.get(INVENTORY_ENV) else ())
    if not sources:
        return local_inventory(spec.defaults)
    label = ", ".join(sources)
    if len(sources) == 1 and not os.path.exists(sources[0]) and "," in sources[0]:
        return _host_list_inventory(sources[0], spec.defaults)
    plan: list[tuple[str, list[str]]] = []  # (source, its files); a host list has no files
    for source in sources:
        if os.path.isdir(source):
            files = _inventory_files(source)
            if not files:
                raise InventoryError(f"{source}: the directory holds no inventory files")
            plan.append((source, files))
        elif os.path.isfile(source):
            plan.append((source, [source]))
        elif "," in source:
            plan.append((source, []))
        else:
            raise InventoryError(f"{source}: no such inventory file or directory")
    plugin = next((f"{f}: inventory plugin {name!r}" for _, files in plan for f in files
                   if (name := _plugin_name(f)) is not None), None)
    if plugin is not None:
        # A plugin is Ansible's code: Ansible resolves every source together (constructed groups
        # see the hosts of the other sources), group_vars/host_vars included.
        builder = InventoryBuilder()
        data = ansible_list(sources, spec.vault_args, plugin)
        read_json_inventory(data, f"ansible-inventory -i {' -i '.join(sources)}", builder)
        return resolve(builder, source=label, base_dir=os.getcwd(), group_vars=lambda *_: {},
                       host_vars=lambda *_: {}, vault=spec.vault, defaults=spec.defaults)
    builder = InventoryBuilder()
    base_dirs: list[str] = []
    for source, files in plan:
        if not files:
            _read_host_list(source, builder)
            continue
        base_dirs.append(source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source)))
        for file in files:
            _read_inventory_file(file, builder, spec.vault)
    base_dir = base_dirs[0] if base_dirs else os.getcwd()
    return resolve(
        builder,
        source=label,
        base_dir=base_dir,
        group_vars=VarsDirectory([os.path.join(d, "group_vars") for d in base_dirs]),
        host_vars=VarsDirectory([os.path.join(d, "host_vars") for d in base_dirs]),
        vault=spec.vault,
        defaults=spec.defaults,
    )


def local_inventory(defaults: Mapping[str, Any] | None = None) -> Inventory:
    """The default inventory: this machine, reached without ssh. Of the command line's defaults only
    become (``-b``, ``-K``) means anything here: ``gpuops inspect host -b`` runs its probes with sudo."""
    become = {k: v for k, v in (defaults or {}).items() if k.startswith("ansible_become")}
    host = Host(
        name="localhost",
        address=None,
        port=None,
        user=None,
        key_file=None,
        connection="local",
        groups=(ALL, "ungrouped"),
        vars=MappingProxyType({"ansible_connection": "local", **become}),
    )
    groups = {
        ALL: Group(ALL, 0, (), ("ungrouped",), ("localhost",), MappingProxyType({})),
        "ungrouped": Group("ungrouped", 1, (ALL,), (), ("localhost",), MappingProxyType({})),
    }
    return Inventory(source="<localhost>", hosts=(host,), groups=MappingProxyType(groups))


def _plugin_name(path: str) -> str | None:
    """The plugin a YAML inventory file configures (``plugin: constructed``), or None."""
    if not path.endswith((".yml", ".yaml")) or is_inventory_script(path):
        return None
    try:
        text = read_text(path)
    except InventoryError:
        return None
    if not _PLUGIN_LINE.search(text):
        return None
    try:
        data = parse_yaml_text(text, path)
    except InventoryError:
        return None
    return str(data["plugin"]) if isinstance(data, dict) and "plugin" in data else None


def _read_inventory_file(path: str, builder: InventoryBuilder, vault: Vault) -> None:
    if is_inventory_script(path):
        data = script_list(path)
        has_meta = isinstance(data, dict) and "_meta" in data
        read_json_inventory(data, f"inventory script {path}", builder,
                            host_vars=None if has_meta else (lambda host: script_host(path, host)))
        return
    text = read_text(path)
    if is_encrypted(text):  # a vault-encrypted inventory file (Ansible reads those too)
        text = vault.decrypt(text, path).decode("utf-8", errors="replace")
    if path.endswith(".json"):
        data = load_json_text(text, path)
        if looks_like_json_inventory(data):
            read_json_inventory(data, path, builder)
        else:
            read_yaml_inventory(data, path, builder)
    elif path.endswith(_YAML_EXTENSIONS):
        data = parse_yaml_text(text, path)
        if isinstance(data, dict) and "_meta" in data:  # `ansible-inventory --list` saved under .yml
            read_json_inventory(data, path, builder)
        else:
            read_yaml_inventory(data, path, builder)
    elif path.endswith(".ini"):
        read_ini_inventory(text, path, builder)
    else:
        # No telling extension: a file that reads as a YAML mapping is YAML (or the JSON shape),
        # anything else INI.
        try:
            data = parse_yaml_text(text, path)
        except InventoryError:
            data = None
        if isinstance(data, dict) and "_meta" in data:
            read_json_inventory(data, path, builder)
        elif isinstance(data, dict):
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


def _host_list_inventory(spec: str, defaults: Mapping[str, Any] | None = None) -> Inventory:
    builder = InventoryBuilder()
    _read_host_list(spec, builder)
    return resolve(builder, source=spec, base_dir=os.getcwd(), group_vars=lambda *_: {}, host_vars=lambda *_: {},
                   defaults=defaults)


def _read_host_list(spec: str, builder: InventoryBuilder) -> None:
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        try:
            names, port = expand_host_entry(entry)
        except HostPatternError as exc:
            raise InventoryError(f"host list {spec!r}: {exc}") from None
        for name in names:
            builder.add_host(name, "ungrouped", {"ansible_port": port} if port else {})
