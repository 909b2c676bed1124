"""``--limit`` patterns, as Ansible reads them.

Terms are separated by ``,`` (or ``:`` when there is no comma). A term is a host name, a group
name, ``all``, a glob (``gpu*``), a regex (``~gpu0[1-4]``), a subscript of a group
(``gpus[0]``, ``gpus[1:3]``) or ``@file`` (one pattern per line). ``&term`` intersects and
``!term`` excludes; as in Ansible, plain terms are united first, then intersections, then
exclusions. Unlike Ansible (which warns), a term that names nothing is an error: a typo in --limit
must not silently act on the wrong hosts.

Patterns are matched against names only (``Names``: the inventory's host names and each group's
members), so this module sits below ``inventory/model.py``, which calls it from ``Inventory.select``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence

from gpuops.errors import InventoryError
from gpuops.frozen import frozen

_SUBSCRIPT = re.compile(r"^(?P<base>.+?)\[(?P<start>-?\d*)(?::(?P<end>-?\d*))?\]$")
_GLOB_CHARS = ("*", "?", "[", ".")


def split_terms(limit: str) -> list[str]:
    if "," in limit:
        parts = limit.split(",")
    else:
        # ':' separates terms, but not inside a subscript like gpus[1:3].
        parts, depth, current = [], 0, ""
        for char in limit:
            depth += char == "["
            depth -= char == "]"
            if char == ":" and depth == 0:
                parts.append(current)
                current = ""
            else:
                current += char
        parts.append(current)
    return [part.strip() for part in parts if part.strip()]


@frozen
class Names:
    """What a --limit pattern is matched against: an inventory's host names, in its order, and
    each group's members (descendants included), with the inventory's source for error messages."""

    source: str
    hosts: Sequence[str]
    groups: Mapping[str, Sequence[str]]


def select_names(inventory: Names, limit: str) -> list[str]:
    """The host names ``limit`` selects, in the inventory's order (InventoryError when none)."""
    terms = _expand_files(split_terms(limit), inventory, limit)
    regular = [t for t in terms if t[0] not in "&!"]
    intersect = [t[1:] for t in terms if t[0] == "&"]
    exclude = [t[1:] for t in terms if t[0] == "!"]
    if not regular:
        regular = ["all"]
    chosen: dict[str, None] = {}
    for term in regular:
        for name in _match(inventory, term, limit):
            chosen[name] = None
    for term in intersect:
        keep = set(_match(inventory, term, limit))
        chosen = {name: None for name in chosen if name in keep}
    for term in exclude:
        drop = set(_match(inventory, term, limit))
        chosen = {name: None for name in chosen if name not in drop}
    selected = [name for name in inventory.hosts if name in chosen]
    if not selected:
        raise InventoryError(f"no hosts match --limit {limit!r} in {inventory.source}")
    return selected


def _expand_files(terms: list[str], inventory: Names, limit: str) -> list[str]:
    out: list[str] = []
    for term in terms:
        prefix, body = (term[0], term[1:]) if term[0] in "&!" else ("", term)
        if body.startswith("@"):
            try:
                with open(body[1:], encoding="utf-8") as handle:
                    lines = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
            except OSError as exc:
                raise InventoryError(f"--limit {limit!r}: cannot read {body[1:]}: {exc.strerror}") from None
            out.extend(prefix + line for line in lines)
        elif not body:
            raise InventoryError(f"--limit {limit!r}: empty pattern after {prefix!r}")
        else:
            out.append(term)
    return out


def _match(inventory: Names, term: str, limit: str) -> list[str]:
    """Host names a single term stands for; a term naming nothing is an error."""
    subscript = _SUBSCRIPT.match(term)
    if subscript and not term.startswith("~") and subscript.group("base") in inventory.groups:
        return _subscript(inventory, subscript, term, limit)
    names: list[str] = []
    matches: Callable[[str], object]
    if term.startswith("~"):
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise InventoryError(f"--limit {limit!r}: bad regular expression {term[1:]!r}: {exc}") from None
        matches = regex.match
    elif any(char in term for char in ("*", "?", "[")):
        matches = re.compile(fnmatch.translate(term)).match
    else:
        matches = term.__eq__
    matched_groups = [g for g in inventory.groups if matches(g)]
    for group in matched_groups:
        names.extend(inventory.groups[group])
    if not matched_groups or term.startswith("~") or any(c in term for c in _GLOB_CHARS):
        names.extend(name for name in inventory.hosts if matches(name))
    if not names and not matched_groups:
        raise InventoryError(
            f"no hosts match --limit {limit!r} in {inventory.source}: {term!r} names no host or group"
        )
    return names


def _subscript(inventory: Names, match: re.Match, term: str, limit: str) -> list[str]:
    hosts = list(inventory.groups[match.group("base")])
    start, end = match.group("start"), match.group("end")
    try:
        if end is None:
            return [hosts[int(start)]] if start else []
        # Ansible's subscripts are inclusive of the end.
        low = int(start) if start else 0
        high = int(end) if end else len(hosts) - 1
        if high < 0:
            high += len(hosts)
        return hosts[low : high + 1]
    except (IndexError, ValueError):
        raise InventoryError(
            f"no hosts match --limit {limit!r} in {inventory.source}: {term!r} is outside the group "
            f"({len(hosts)} hosts)"
        ) from None
