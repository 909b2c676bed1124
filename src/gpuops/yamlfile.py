"""YAML (and JSON, which YAML reads) files read one way, with errors that name ``file:line:column``.

The one YAML loader of gpuops: inventories, group/host vars and ``-e @file`` (``inventory/``), roles
(``plan/roles.py``), the gate catalog (``gates/catalog.py``), ``-e`` text (``extravars.py``) and the
lab's GPU descriptions. A safe loader always (libyaml's when installed: several times faster, and
the catalog and roles are read on every command); Ansible's ``!unsafe`` is read as the plain value
it is; other tags only where a caller gives their constructor (the inventory's ``!vault``, whose
values must say where they were written, so constructors get the ``file:line`` of their node).
With ``marks=True`` mappings come back as ``MarkedDict`` (a dict that remembers the line it started
on and the line of each key), so structural errors found later can still point at a line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuops.errors import GpuopsError

# A tag's constructor: (the node's scalar text, "file:line" where it is written) -> value.
TagConstructor = Callable[[str, str], Any]


class MarkedDict(dict):
    """A dict from a YAML file that knows the (1-based) line it started on."""

    line: int | None = None
    key_lines: Mapping[str, int] = MappingProxyType({})  # key -> 1-based line where it is written (scalar keys only)


def _base() -> type:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def _loader(marks: bool, tags: tuple[tuple[str, TagConstructor], ...]) -> Any:
    import yaml

    def construct_marked_map(loader: Any, node: Any):  # type: ignore[no-untyped-def]
        data = MarkedDict()
        data.line = node.start_mark.line + 1
        yield data
        data.update(loader.construct_mapping(node))
        data.key_lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}

    def construct_unsafe(loader: Any, node: Any) -> Any:
        # Ansible's !unsafe only stops templating; gpuops reads the value as the plain value it is.
        if isinstance(node, yaml.ScalarNode):
            return loader.construct_scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_mapping(node, deep=True)

    def scalar_tag(tag: str, build: TagConstructor) -> Callable[[Any, Any], Any]:
        def construct(loader: Any, node: Any) -> Any:
            if not isinstance(node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(None, None, f"a {tag} value must be a string", node.start_mark)
            return build(str(node.value), f"{loader.gpuops_path}:{node.start_mark.line + 1}")
        return construct

    loader: Any = type("GpuopsLoader", (_base(),), {})
    if marks:
        loader.add_constructor("tag:yaml.org,2002:map", construct_marked_map)
    loader.add_constructor("!unsafe", construct_unsafe)
    for tag, build in tags:
        loader.add_constructor(tag, scalar_tag(tag, build))
    return loader


def parse_yaml_text(text: str, path: str | Path, *, marks: bool = False, error: type[GpuopsError] = GpuopsError,
                    tags: Mapping[str, TagConstructor] | None = None) -> Any:
    """The data of YAML ``text`` read from ``path``; malformed YAML raises ``error`` as one line,
    ``path:line:column: malformed YAML: <problem>``."""
    import yaml

    loader = _loader(marks, tuple(sorted((tags or {}).items())))(text)
    loader.gpuops_path = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join(str(exc.problem or exc.context or "malformed YAML").split())
        raise error(f"{where}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: malformed YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def read_text(path: str | Path, error: type[GpuopsError] = GpuopsError) -> str:
    """A UTF-8 text file's text; a missing or unreadable file raises ``error`` naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None


def load_yaml_file(path: str | Path, *, marks: bool = False, error: type[GpuopsError] = GpuopsError,
                   tags: Mapping[str, TagConstructor] | None = None) -> Any:
    """A YAML file's data (``read_text`` + ``parse_yaml_text``)."""
    return parse_yaml_text(read_text(path, error), path, marks=marks, error=error, tags=tags)


def plain(value: Any) -> Any:
    """The same data with MarkedDicts turned back into plain dicts (recursively)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
