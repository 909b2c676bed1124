"""Gate scans kept on the client, per host and fingerprint, so an unchanged tree is never scanned twice.

A full gate scan costs the host seconds of CPU; its result depends only on what the host digests in
``remote/scan_fingerprint.py``. The client keeps each scan it received (``memo.Kind.SCANS``: one
scope per host, the key's digest the tree fingerprint the host computed), and offers the fingerprints
it holds with the next scan; a host whose tree still has one of them answers "unchanged" and the kept
scan is used.

Trust: an entry is used only when its file name, its recorded fingerprint and the scan's own
fingerprint agree, it is a complete scan of this scanner version, and the host named that very
fingerprint; anything else (a torn, edited or foreign file) is ignored and the host scans again.
Entries are written atomically (``memo.put``). The host
identity only spreads entries over directories: correctness rests on the fingerprint, which covers the root, the python and
every file's size, mtime and inode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

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
        with ``need_sources``, only scans that carry the patchable files' sources."""
        found: dict[str, dict[str, Any]] = {}
        for key, data in memo.newest(memo.Kind.SCANS, self.scope):
            if len(found) >= MAX_OFFERED:
                break
            if not _is_fingerprint(key.digest):
                continue
            scan = valid_entry(data, key.digest)
            if scan is not None and (not need_sources or "sources" in scan):
                found[key.digest] = scan
        return found

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


def for_host(host: "Host") -> HostScanCache | None:
    return None if memo.root() is None else HostScanCache(memo.host_identity(host))
