"""Hosts, groups and their variables, from Ansible-compatible inventories (YAML, INI, directories).

    inventory = load_inventory("inventory/prod.yml")     # None: this machine, as "localhost"
    for host in inventory.select("gpus:!gpu03"):         # Ansible-like --limit
        host.address, host.port, host.vars["sglang_port"]

Loading never runs anything: host names and values are data only.
"""

from __future__ import annotations

from gpuops.errors import InventoryError
from gpuops.inventory.loader import INVENTORY_ENV, load_inventory, local_inventory
from gpuops.inventory.model import Group, Host, Inventory

__all__ = ["Group", "Host", "INVENTORY_ENV", "Inventory", "InventoryError", "load_inventory", "local_inventory"]
