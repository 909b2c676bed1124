"""Host entries as inventories write them: ranges (``gpu[01:08].lab``) and ``name:port``.

Pure string work; a host name is only ever data here (never handed to a shell).
"""

from __future__ import annotations

import re
import string

# One range: [start:end] or [start:end:stride]; numeric (optionally zero-padded) or letters.
_RANGE = re.compile(r"\[([^\[\]:]*):([^\[\]:]*)(?::([^\[\]:]*))?\]")
_IPV6_WITH_PORT = re.compile(r"^\[(?P<name>[0-9A-Fa-f]*:[0-9A-Fa-f:.]*)\]:(?P<port>[0-9]+)$")
_IPV6_BARE = re.compile(r"^\[(?P<name>[0-9A-Fa-f]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)\]$")


class HostPatternError(ValueError):
    """A host entry that cannot be expanded; the caller adds the file and line."""


def expand_host_entry(entry: str) -> tuple[list[str], int | None]:
    """Names an inventory host entry stands for, and the port written after it (or None)."""
    entry = entry.strip()
    if not entry:
        raise HostPatternError("empty host name")
    port: int | None = None
    bracketed_ipv6 = _IPV6_WITH_PORT.match(entry) or _IPV6_BARE.match(entry)
    if bracketed_ipv6:
        entry = bracketed_ipv6.group("name")
        port = int(bracketed_ipv6.group("port")) if bracketed_ipv6.groupdict().get("port") else None
        _check_port(port, entry)
        return [entry], port
    head, sep, tail = entry.rpartition(":")
    # A trailing :NNN is a port unless the rest still has a colon outside ranges (a bare IPv6).
    if sep and tail.isdigit() and ":" not in _RANGE.sub("", head):
        entry, port = head, int(tail)
    _check_port(port, entry)
    return expand_ranges(entry), port


def _check_port(port: int | None, entry: str) -> None:
    if port is not None and not 0 < port < 65536:
        raise HostPatternError(f"port {port} out of range in host {entry!r}")


def expand_ranges(name: str) -> list[str]:
    """Expand every ``[a:b]`` / ``[a:b:step]`` range of a host name, left to right."""
    match = _RANGE.search(name)
    if match is None:
        if "[" in name and "]" in name and ":" in name[name.index("[") :]:
            raise HostPatternError(f"malformed host range in {name!r}")
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    start, end, stride_text = match.group(1), match.group(2), match.group(3)
    values = _range_values(start, end, stride_text, name)
    out: list[str] = []
    for value in values:
        out.extend(expand_ranges(f"{head}{value}{tail}"))
    return out


def _range_values(start: str, end: str, stride_text: str | None, name: str) -> list[str]:
    if not end:
        raise HostPatternError(f"host range in {name!r} needs an end")
    stride = 1
    if stride_text:
        if not stride_text.isdigit() or int(stride_text) == 0:
            raise HostPatternError(f"host range stride {stride_text!r} in {name!r} is not a positive integer")
        stride = int(stride_text)
    if not start:
        start = "0"
    if start.isdigit() and end.isdigit():
        width = 0
        if start.startswith("0") and len(start) > 1:
            if len(start) != len(end):
                raise HostPatternError(
                    f"host range in {name!r} must write start and end with the same number of digits"
                )
            width = len(start)
        low, high = int(start), int(end)
        if low > high:
            raise HostPatternError(f"host range in {name!r} ends before it starts")
        return [str(n).zfill(width) for n in range(low, high + 1, stride)]
    letters = string.ascii_letters
    if len(start) == 1 and len(end) == 1 and start in letters and end in letters:
        low, high = letters.index(start), letters.index(end)
        if low > high:
            raise HostPatternError(f"host range in {name!r} ends before it starts")
        return list(letters[low : high + 1 : stride])
    raise HostPatternError(f"host range [{start}:{end}] in {name!r} mixes numbers and letters")
