"""``group_vars/`` and ``host_vars/`` beside the inventory, read the way Ansible reads them.

For a name N the candidates are ``N``, ``N.yml``, ``N.yaml``, ``N.json`` and a directory ``N/``
whose files (recursively, sorted, hidden ones skipped) are merged in order.
"""

from __future__ import annotations

import os
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.vault import Vault, decrypt_values, is_encrypted
from gpuops.inventory.yamlfile import load_yaml_file, plain, read_text

# Where a vars file is vault-encrypted as a whole and no password was given: its variables are
# unknown, so this key (never a variable name Ansible allows) names the file instead, and only a
# host a command selects fails for it (Inventory.select), as Ansible decrypts only what it needs.
UNREAD_VAULT_FILE = "<vault-encrypted file>"

VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


class VarsDirectory:
    """The group_vars/ (or host_vars/) directories of an inventory, read lazily, once per name and
    per vault: with ``None``, an encrypted file is named and its values stay encrypted (what every
    host is read with first); with the vault, they are opened (a host a command selects)."""

    def __init__(self, directories: list[str]) -> None:
        self._directories = [d for d in directories if os.path.isdir(d)]
        self._cache: dict[tuple[str, bool], dict[str, Any]] = {}

    def __call__(self, name: str, vault: Vault | None = None) -> dict[str, Any]:
        key = (name, vault is not None)
        if key not in self._cache:
            merged: dict[str, Any] = {}
            for directory in self._directories:
                for path in _files_for(directory, name):
                    merged.update(load_vars_file(path, vault))
            self._cache[key] = merged
        return self._cache[key]


def _files_for(directory: str, name: str) -> list[str]:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return []  # a name that cannot be a file there (also keeps lookups inside the directory)
    found: list[str] = []
    for extension in VARS_EXTENSIONS:
        candidate = os.path.join(directory, name + extension)
        if os.path.isfile(candidate):
            found.append(candidate)
        elif extension == "" and os.path.isdir(candidate):
            found.extend(_files_under(candidate))
    return found


def _files_under(directory: str) -> list[str]:
    found: list[str] = []
    for entry in sorted(os.listdir(directory)):
        if entry.startswith("."):
            continue
        path = os.path.join(directory, entry)
        if os.path.isdir(path):
            found.extend(_files_under(path))
        elif os.path.splitext(entry)[1] in VARS_EXTENSIONS:
            found.append(path)
    return found


def load_vars_file(path: str, vault: Vault | None = None) -> dict[str, Any]:
    """A vars file's mapping: ``!vault`` values decrypted when `vault` has a password, else kept
    encrypted; a file encrypted as a whole, with no password given: ``{UNREAD_VAULT_FILE: path}``."""
    if (vault is None or not vault.secrets) and is_encrypted(read_text(path)):
        return {UNREAD_VAULT_FILE: path}
    data = load_yaml_file(path, vault)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: variables file must be a mapping of names to values, not {_kind(data)}")
    for key in data:
        if not isinstance(key, str):
            raise InventoryError(f"{path}: variable name {key!r} is not a string")
    return decrypt_values(plain(data), vault)


def _kind(value: Any) -> str:
    kinds: dict[type, str] = {list: "a list", str: "a string"}
    return kinds.get(type(value), type(value).__name__)
