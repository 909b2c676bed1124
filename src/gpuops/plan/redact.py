"""Secrets never reach output or journals: names that look secret have their values masked."""

from __future__ import annotations

import fnmatch
from typing import Any, Iterable, Mapping

MASK = "********"
_SECRET_PATTERNS = ("*password*", "*passwd*", "*token*", "*secret*", "*key*")
_NOT_SECRET = ("*key_file*", "*key_path*", "*keyfile*", "*_keys", "ansible_ssh_private_key_file")


def is_secret_name(name: str) -> bool:
    lowered = name.lower()
    if lowered == "hf_token":
        return True
    if any(fnmatch.fnmatch(lowered, pattern) for pattern in _NOT_SECRET):
        return False
    return any(fnmatch.fnmatch(lowered, pattern) for pattern in _SECRET_PATTERNS)


def _from_vault(value: Any) -> bool:
    """A value decrypted from an Ansible vault is a secret whatever its name."""
    from gpuops.inventory.vault import VaultText

    return isinstance(value, VaultText)


def secret_values(variables: Mapping[str, Any]) -> list[str]:
    """Every string value held under a secret-looking name, at any depth (env dicts included)."""
    found: list[str] = []

    def walk(name: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(str(key), inner)
        elif isinstance(value, (list, tuple)):
            for inner in value:
                walk(name, inner)
        elif (is_secret_name(name) or _from_vault(value)) and value not in (None, "") and not isinstance(value, bool):
            text = str(value)
            if len(text) >= 4:  # masking "1" would mask every digit in a diff
                found.append(text)

    for key, value in variables.items():
        walk(str(key), value)
    return sorted(set(found), key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def redact_vars(variables: Mapping[str, Any]) -> dict[str, Any]:
    def walk(name: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(str(k), v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(name, v) for v in value]
        if (is_secret_name(name) or _from_vault(value)) and value not in (None, ""):
            return MASK
        return value

    return {k: walk(str(k), v) for k, v in variables.items()}
