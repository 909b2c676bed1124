"""Gate scans kept on the client, per host and fingerprint, so an unchanged tree is never scanned twice.

A full gate scan costs the host seconds of CPU; its result depends only on what the host digests in
``remote/scan_fingerprint.py``. The client keeps each scan it received (``memo.Kind.SCANS``: one
scope per host, the key's digest the tree fingerprint the host computed), and offers the fingerprints
it holds with the next scan; a host whose tree still has one of them answers "unchanged" and the kept
scan is used.

A host the client holds no scan for (the first contact) is offered the newest scans kept for other
hosts instead: the fingerprint names a tree by its files, not by where it lies (the root's device,
every file's path under the root, size, mtime and inode, and the python), so the hosts of a fleet
cloned from one image, or the lab's hosts, which hard-link one unpacked release, are scanned once
between them. The scan used is then kept for this host too, with the root and python its own
answer named (a patch is written under that root).

Trust: an entry is used only when its file name, its recorded fingerprint and the scan's own
fingerprint agree, it is a complete scan of this scanner version, and the host named that very
fingerprint; anything else (a torn, edited or foreign file) is ignored and the host scans again.
Entries are written atomically (``memo.put``). The host identity only spreads entries over
directories: correctness rests on the fingerprint. A host is told no more than sha256 digests of
other hosts' trees' stat data; a host that lies about its tree misleads only its own report, as a
host that lies in a full scan does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from gpuops import memo
from gpuops.gates.scan import SUPPORTED_SCANNER

if TYPE_CHECKING:
    from gpuops.inventory import Host

MAX_OFFERED = 2  # entries read and offered per command (each is parsed before the exec)


def _is_fingerprint(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def valid_entry(data: Any, fingerprint: str) -> dict[str, Any] | None:
    """The scanner JSON inside a kept entry, when the entry is whole and is the scan of ``fingerprint``."""
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    scan = data.get("scan")
    if not isinstance(scan, dict) or scan.get("fingerprint") != fingerprint or scan.get("unchanged"):
        return None
    if scan.get("scanner") != SUPPORTED_SCANNER or scan.get("ok") is not True or not isinstance(scan.get("gates"), list):
        return None
    if bool(data.get("has_sources")) != isinstance(scan.get("sources"), dict):
        return None
    return scan


@dataclass(frozen=True)
class HostScanCache:
    """The scans kept for one host (a memo scope)."""

    scope: str

    def held(self, need_sources: bool) -> dict[str, dict[str, Any]]:
        """fingerprint -> scanner JSON of the newest valid entries (at most ``MAX_OFFERED``);
        with ``need_sources``, only scans that carry the patchable files' sources. When this host
        has none, the newest of the other hosts' (the module's docstring says why that is sound)."""
        found = _valid_scans(memo.newest(memo.Kind.SCANS, self.scope), need_sources)
        return found or _valid_scans(_other_hosts_newest(self.scope), need_sources)

    def holds(self, fingerprint: str) -> bool:
        """Whether this host's own entries hold the scan of ``fingerprint`` (not another host's)."""
        return memo.exists(memo.Key(memo.Kind.SCANS, fingerprint, self.scope))

    def store(self, scan: Mapping[str, Any], has_sources: bool) -> None:
        """Keep a full scan (with a fingerprint) for the next command; never fails the command."""
        fingerprint = scan.get("fingerprint")
        if not _is_fingerprint(fingerprint) or scan.get("unchanged") or scan.get("ok") is not True:
            return
        key = memo.Key(memo.Kind.SCANS, str(fingerprint), self.scope)
        if not has_sources:
            old = valid_entry(memo.get(key), str(fingerprint))
            if old is not None and "sources" in old:
                memo.touch(key)  # the same tree with sources is already kept: keep it, as the newest
                return
        memo.put(key, {"fingerprint": fingerprint, "has_sources": has_sources, "scan": dict(scan)})


def _valid_scans(entries: Iterable[tuple[memo.Key, Any]], need_sources: bool) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for key, data in entries:
        if len(found) >= MAX_OFFERED:
            break
        if not _is_fingerprint(key.digest) or key.digest in found:
            continue
        scan = valid_entry(data, key.digest)
        if scan is not None and (not need_sources or "sources" in scan):
            found[key.digest] = scan
    return found


def _other_hosts_newest(scope: str) -> Iterator[tuple[memo.Key, dict[str, Any]]]:
    """The entries kept for every other host, newest first, each read only when reached."""
    read: set[str] = set()
    for key in memo.keys_of_other_scopes(memo.Kind.SCANS, scope):
        if key.digest in read:  # a fleet's hosts share fingerprints: each tree's scan is read once
            continue
        read.add(key.digest)
        data = memo.get(key)
        if data is not None:
            yield key, data


def for_host(host: "Host") -> HostScanCache | None:
    return None if memo.root() is None else HostScanCache(memo.host_identity(host))
