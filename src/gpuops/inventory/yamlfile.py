"""The inventory's YAML/JSON files: gpuops' one YAML loader (``gpuops.yamlfile``) with the
inventory's rules added: ``!vault`` values (each knows the ``file:line`` it was written at), whole
vault-encrypted files, Ansible's JSON vault form, and ``InventoryError`` for every problem.

Mappings come back as ``MarkedDict`` (a dict that remembers the line it started on), so structural
errors found later can still point at a line.
"""

from __future__ import annotations

import json
from typing import Any

from gpuops.errors import InventoryError
from gpuops.inventory.vault import EncryptedValue, Vault, as_secret, is_encrypted
from gpuops.yamlfile import MarkedDict, plain
from gpuops.yamlfile import parse_yaml_text as _parse_yaml_text
from gpuops.yamlfile import read_text as _read_text

__all__ = ["MarkedDict", "load_json_text", "load_yaml_file", "parse_yaml_text", "plain", "read_text"]

_TAGS = {"!vault": EncryptedValue}  # EncryptedValue(ciphertext, "file:line")


def read_text(path: str) -> str:
    return _read_text(path, InventoryError)


def parse_yaml_text(text: str, path: str) -> Any:
    """YAML (or JSON, which YAML reads) from `text`; a syntax error names path:line:column."""
    return _parse_yaml_text(text, path, marks=True, error=InventoryError, tags=_TAGS)


def load_yaml_file(path: str, vault: Vault | None = None) -> Any:
    """A YAML/JSON file's data; a vault-encrypted file is decrypted first (its values are secrets)."""
    text = read_text(path)
    if is_encrypted(text):
        plaintext = (vault or Vault()).decrypt(text, path).decode("utf-8", errors="replace")
        return as_secret(plain(parse_yaml_text(plaintext, path)))
    if path.endswith(".json"):
        return load_json_text(text, path)
    return parse_yaml_text(text, path)


def load_json_text(text: str, path: str) -> Any:
    """JSON, with Ansible's ``{"__ansible_vault": ...}`` values read as encrypted values."""
    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from None
    return from_json_tags(data, path)


def from_json_tags(value: Any, where: str) -> Any:
    """Ansible's JSON spelling of tagged values: ``__ansible_vault`` (encrypted), ``__ansible_unsafe``."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("__ansible_vault"), str):
            return EncryptedValue(value["__ansible_vault"], where)
        if len(value) == 1 and "__ansible_unsafe" in value:
            return value["__ansible_unsafe"]
        return {key: from_json_tags(item, where) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json_tags(item, where) for item in value]
    return value
