"""``-e/--extra-vars``, read the way ansible-playbook reads them.

Each value is one of:
  ``key=value key2='two words'``   Ansible's k=v form; values stay strings (as in Ansible)
  ``{"key": 1}`` / ``[...]``       inline YAML or JSON (typed values); must be a mapping
  ``@vars.yml``                    a YAML or JSON file holding a mapping
Later values override earlier ones, key by key (top level only, like Ansible's default).

``merged`` is the one way a host's variables and the run's extra vars combine (``-e`` wins), for
every layer: ``apply/extra_vars.ExtraVars.for_host`` (the checked value apply carries) and
``multi_node.py`` (which hosts form a deployment) both use it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError
from gpuops.errors import InventoryError
from gpuops.inventory.varsfiles import load_vars_file
from gpuops.yamlfile import parse_yaml_text

if TYPE_CHECKING:
    from gpuops.inventory import Host


class ExtraVarsError(GpuopsError):
    """An -e value that cannot be read: names the value or the file."""


def merged(host: "Host", extra: Mapping[str, Any]) -> dict[str, Any]:
    """The host's variables with the extra vars over them (Ansible's precedence: ``-e`` wins)."""
    return {**dict(host.vars or {}), **dict(extra)}


def parse_extra_vars(values: list[str] | tuple[str, ...]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for value in values:
        merged.update(parse_one(value))
    return merged


def parse_one(value: str) -> dict[str, Any]:
    text = value.strip()
    if not text:
        return {}
    if text.startswith("@"):
        return _from_file(text[1:])
    if text[0] in "{[":
        return _mapping(_yaml(text, f"-e {_short(value)}"), f"-e {_short(value)}")
    return _key_values(text, value)


def _from_file(path: str) -> dict[str, Any]:
    """``-e @file``: a vars file, read exactly as group_vars/host_vars files are."""

    if not path:
        raise ExtraVarsError("-e @: a file name must follow '@'")
    try:
        return load_vars_file(path)
    except InventoryError as exc:  # its message starts with the path
        raise ExtraVarsError(f"-e @{exc}") from None


def _yaml(text: str, where: str) -> Any:
    return parse_yaml_text(text, where, error=ExtraVarsError)


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ExtraVarsError(f"{where}: extra vars must be a mapping of names to values, not a {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ExtraVarsError(f"{where}: variable name {key!r} is not a string")
    return dict(data)


def _key_values(text: str, original: str) -> dict[str, Any]:
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ExtraVarsError(f"-e {_short(original)}: {exc}") from None
    out: dict[str, Any] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ExtraVarsError(
                f"-e {_short(original)}: expected key=value, a YAML/JSON mapping or @file, got {token!r}"
            )
        if not key.isidentifier():
            raise ExtraVarsError(f"-e {_short(original)}: {key!r} is not a valid variable name")
        out[key] = value
    return out


def _short(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:57] + "...")
