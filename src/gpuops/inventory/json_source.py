"""The JSON inventory of Ansible's dynamic inventory scripts and of ``ansible-inventory --list``.

    {"gpus": {"hosts": ["gpu01", "gpu02"], "vars": {...}, "children": ["a100"]},
     "bastioned": ["gpu03"],                          # a group may be a bare list of hosts
     "_meta": {"hostvars": {"gpu01": {"ansible_host": "10.0.0.1"}}}}

Without ``_meta`` a script is asked ``--host NAME`` for each host's variables (the caller passes
``host_vars`` for that). ``ansible-inventory --list`` writes vault values it did not decrypt as
``{"__ansible_vault": "$ANSIBLE_VAULT;..."}``; they are read as encrypted values here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.builder import InventoryBuilder
from gpuops.inventory.yamlfile import from_json_tags

META = "_meta"


def looks_like_json_inventory(data: Any) -> bool:
    """Is this (already parsed) document in the script / ``ansible-inventory --list`` shape?

    The YAML inventory shape has ``hosts:`` and ``children:`` as mappings; this one has lists.
    """
    if not isinstance(data, dict):
        return False
    if META in data:
        return True
    for value in data.values():
        if isinstance(value, list):
            return True
        if isinstance(value, dict) and (isinstance(value.get("hosts"), list) or isinstance(value.get("children"), list)):
            return True
    return False


def read_json_inventory(data: Any, source: str, builder: InventoryBuilder,
                        host_vars: Callable[[str], Mapping[str, Any]] | None = None) -> None:
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: a JSON inventory must be an object of groups, not {type(data).__name__}")
    meta = data.get(META)
    hostvars: Mapping[str, Any] | None = None
    if meta is not None:
        if not isinstance(meta, dict) or not isinstance(meta.get("hostvars", {}), dict):
            raise InventoryError(f"{source}: _meta must be an object with a 'hostvars' object")
        hostvars = meta.get("hostvars", {})
    mine: list[str] = []  # this source's hosts (others may come from earlier -i sources)
    for name, value in data.items():
        if name == META:
            continue
        for host in _read_group(str(name), value, source, builder):
            if host not in mine:
                mine.append(host)
    for host in mine:
        if hostvars is not None:
            variables = hostvars.get(host) or {}
        elif host_vars is not None:
            variables = host_vars(host)
        else:
            variables = {}
        if not isinstance(variables, dict):
            raise InventoryError(f"{source}: the variables of host {host!r} must be an object")
        builder.host_vars[host].update(from_json_tags(variables, f"{source} (host {host})"))


def _read_group(name: str, value: Any, source: str, builder: InventoryBuilder) -> list[str]:
    builder.group(name)
    if isinstance(value, list):  # "group": ["host", ...]
        value = {"hosts": value}
    if not isinstance(value, dict):
        raise InventoryError(f"{source}: group {name!r} must be an object or a list of hosts")
    hosts, children, variables = value.get("hosts", []), value.get("children", []), value.get("vars", {})
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise InventoryError(f"{source}: the hosts of group {name!r} must be a list of host names")
    if not isinstance(children, list) or not all(isinstance(c, str) and c for c in children):
        raise InventoryError(f"{source}: the children of group {name!r} must be a list of group names")
    if not isinstance(variables, dict):
        raise InventoryError(f"{source}: the vars of group {name!r} must be an object")
    for host in hosts:
        builder.add_host(host, name)
    for child in children:
        if child == "all":
            raise InventoryError(f"{source}: group 'all' cannot be a child of {name!r}")
        builder.add_child(name, child)
    if variables:
        builder.set_group_vars(name, from_json_tags(variables, f"{source} (group {name})"))
    return hosts
