"""Ansible's INI inventory format, read as-is.

    gpu00 ansible_host=10.0.0.9          # before any section: ungrouped
    [gpus]
    gpu[01:08].example ansible_user=ops
    [gpus:vars]
    sglang_port=30000
    [cluster:children]
    gpus

Values are read like Ansible reads them: Python literals (``30000``, ``True``, ``['a']``,
``"quoted"``) become those values through ``ast.literal_eval`` (which evaluates nothing else);
anything else stays a string.
"""

from __future__ import annotations

import re
import shlex
import warnings
from dataclasses import dataclass
from typing import Any

from gpuops.errors import InventoryError
from gpuops import python_ast
from gpuops.inventory.builder import ALL, UNGROUPED, InventoryBuilder
from gpuops.inventory.hostnames import HostPatternError, expand_host_entry

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:[#;].*)?$")


@dataclass
class _Pending:
    """A group named by a ``[x:vars]`` section or in a ``[y:children]`` section (``parent``) before its own
    section declares it: where, for the error if it never is."""

    kind: str  # "vars" | "children"
    line: int
    parent: str


def read_ini_inventory(text: str, path: str, builder: InventoryBuilder) -> None:
    group, state = UNGROUPED, "hosts"
    # Groups named by [x:vars] or in [y:children] must be declared somewhere by their own section.
    pending: dict[str, _Pending] = {}
    declared: set[str] = {ALL, UNGROUPED}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            match = _SECTION.match(line)
            if match is None:
                raise InventoryError(f"{path}:{number}: malformed section header {line!r}")
            group, state = match.group(1), match.group(2) or "hosts"
            if state not in ("hosts", "vars", "children"):
                raise InventoryError(
                    f"{path}:{number}: section [{group}:{state}] has unknown type {state!r} "
                    "(use [group], [group:vars] or [group:children])"
                )
            builder.group(group)
            if state != "vars":
                declared.add(group)
                pending.pop(group, None)
            elif group not in declared:
                pending.setdefault(group, _Pending("vars", number, group))
            continue
        if state == "hosts":
            _read_host_line(line, number, group, path, builder)
        elif state == "vars":
            key, value = _variable(line, number, path)
            builder.set_group_vars(group, {key: value})
        else:
            child = _group_name(line, number, path)
            if child == ALL:
                raise InventoryError(f"{path}:{number}: group 'all' cannot be a child of {group!r}")
            builder.add_child(group, child)
            if child not in declared:
                pending.setdefault(child, _Pending("children", number, group))
    for name, where in pending.items():
        if where.kind == "vars":
            raise InventoryError(f"{path}:{where.line}: section [{name}:vars] is for a group that is never defined")
        raise InventoryError(
            f"{path}:{where.line}: section [{where.parent}:children] names group {name!r}, which is never defined"
        )


def _read_host_line(line: str, number: int, group: str, path: str, builder: InventoryBuilder) -> None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise InventoryError(f"{path}:{number}: cannot split host line: {exc}") from None
    if not tokens:
        return
    entry, assignments = tokens[0], tokens[1:]
    try:
        names, port = expand_host_entry(entry)
    except HostPatternError as exc:
        raise InventoryError(f"{path}:{number}: {exc}") from None
    variables: dict[str, Any] = {}
    if port is not None:
        variables["ansible_port"] = port
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise InventoryError(
                f"{path}:{number}: expected key=value host variables after {entry!r}, got {assignment!r}"
            )
        variables[key] = parse_ini_value(value)
    for name in names:
        builder.add_host(name, group, variables)


def _variable(line: str, number: int, path: str) -> tuple[str, Any]:
    key, sep, value = line.partition("=")
    key = key.strip()
    if not sep or not key or any(c.isspace() for c in key):
        raise InventoryError(f"{path}:{number}: expected key=value in a [group:vars] section, got {line!r}")
    return key, parse_ini_value(value.strip())


def _group_name(line: str, number: int, path: str) -> str:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        tokens = []
    if len(tokens) != 1:
        raise InventoryError(f"{path}:{number}: expected one group name in a [group:children] section, got {line!r}")
    return tokens[0]


def parse_ini_value(text: str) -> Any:
    """A Python literal if the text is one (as Ansible does), else the text itself."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return python_ast.literal(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
