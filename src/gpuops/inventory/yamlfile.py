"""Reading YAML/JSON files with errors that name the file and the line.

Mappings come back as ``MarkedDict`` (a dict that remembers the line it started on), so structural
errors found later can still point at a line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml

from gpuops.errors import InventoryError
from gpuops.inventory.vault import EncryptedValue, Vault, as_secret, is_encrypted


class MarkedDict(dict):
    """A dict from a YAML file that knows the (1-based) line it started on."""

    line: int | None = None
    key_lines: Mapping[str, int] = MappingProxyType({})  # key -> 1-based line where it is written (scalar keys only)


class _MarkingLoader(yaml.SafeLoader):
    def construct_yaml_map(self, node: yaml.MappingNode):  # type: ignore[override]
        data = MarkedDict()
        data.line = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))
        data.key_lines = {
            key_node.value: key_node.start_mark.line + 1
            for key_node, _ in node.value
            if isinstance(key_node, yaml.ScalarNode)
        }


_MarkingLoader.add_constructor("tag:yaml.org,2002:map", _MarkingLoader.construct_yaml_map)


def _loader_for(path: str) -> type[_MarkingLoader]:
    """A loader that knows the file it reads, so a ``!vault`` value can say where it was written."""

    def construct_vault(loader: yaml.SafeLoader, node: yaml.Node) -> EncryptedValue:
        if not isinstance(node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(None, None, "a !vault value must be a string", node.start_mark)
        return EncryptedValue(str(node.value), f"{path}:{node.start_mark.line + 1}")

    def construct_unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        # Ansible's !unsafe only stops templating; gpuops reads the value as the plain string it is.
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]

    loader = type("_FileLoader", (_MarkingLoader,), {})
    loader.add_constructor("!vault", construct_vault)
    loader.add_constructor("!unsafe", construct_unsafe)
    return loader


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read: {exc.strerror}") from None


def parse_yaml_text(text: str, path: str) -> Any:
    """YAML (or JSON, which YAML reads) from `text`; a syntax error names path:line:column."""
    try:
        return yaml.load(text, Loader=_loader_for(path))  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = exc.problem or exc.context or "malformed YAML"
        raise InventoryError(f"{where}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: malformed YAML: {' '.join(str(exc).split())}") from None


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
    from gpuops.inventory.json_source import from_json_tags

    try:
        data = json.loads(text) if text.strip() else None
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from None
    return from_json_tags(data, path)


def plain(value: Any) -> Any:
    """The same data with MarkedDicts turned back into plain dicts (recursively)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
