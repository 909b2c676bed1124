"""Gate scans kept on the client, per host and fingerprint, so an unchanged tree is never scanned twice.

A full gate scan costs the host seconds of CPU; its result depends only on what the host digests in
``remote/scan_fingerprint.py``. The client keeps each scan it received under
``$GPUOPS_SCAN_CACHE`` (default ``$GPUOPS_CACHE/scans``, else ``~/.cache/gpuops/scans``; ``off``
disables it), one directory per host and one file per fingerprint, and offers the fingerprints it
holds with the next scan; a host whose tree still has one of them answers "unchanged" and the kept
scan is used.

Trust: an entry is used only when its file name, its recorded fingerprint and the scan's own
fingerprint agree, it is a complete scan of this scanner version, and the host named that very
fingerprint; anything else (a torn, edited or foreign file) is ignored and the host scans again.
Entries are written atomically (temp file and rename, ``local_memo.write_entry``). The host
identity only spreads entries over directories: correctness rests on the fingerprint, which covers the root, the python and
every file's size, mtime and inode.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from gpuops import local_memo
from gpuops.gates.scan import SUPPORTED_SCANNER

if TYPE_CHECKING:
    from gpuops.inventory import Host

ENTRY_FORMAT = local_memo.FORMAT  # entries are written by local_memo.write_entry
CACHE_ENV = "GPUOPS_SCAN_CACHE"
MAX_ENTRIES_PER_HOST = 3  # the current tree, and one or two others (another python's root, the tree before a patch)
MAX_OFFERED = 2  # entries read and offered per command (each is parsed before the exec)


def cache_root() -> Path | None:
    """Where scans are kept, or None when ``$GPUOPS_SCAN_CACHE`` is ``off``."""
    return local_memo.memo_dir(CACHE_ENV, "scans")


def host_identity(host: "Host") -> str:
    """A directory name for a host: its inventory name and how it is reached."""
    ident = [host.name, host.address, host.port, host.user, host.connection]
    return hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:24]


def _is_fingerprint(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def valid_entry(data: Any, fingerprint: str) -> dict[str, Any] | None:
    """The scanner JSON inside a cache entry, when the entry is whole and is the scan of ``fingerprint``."""
    if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT or data.get("fingerprint") != fingerprint:
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
    """The scans kept for one host."""

    directory: Path

    def held(self, need_sources: bool) -> dict[str, dict[str, Any]]:
        """fingerprint -> scanner JSON of the newest valid entries (at most ``MAX_OFFERED``);
        with ``need_sources``, only scans that carry the patchable files' sources."""
        try:
            names = [(p.stat().st_mtime_ns, p) for p in self.directory.iterdir()
                     if p.suffix == ".json" and _is_fingerprint(p.stem)]
        except OSError:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for _, path in sorted(names, reverse=True):
            if len(found) >= MAX_OFFERED:
                break
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            scan = valid_entry(data, path.stem)
            if scan is not None and (not need_sources or "sources" in scan):
                found[path.stem] = scan
        return found

    def store(self, scan: Mapping[str, Any], has_sources: bool) -> None:
        """Keep a full scan (with a fingerprint) for the next command; never fails the command."""
        fingerprint = scan.get("fingerprint")
        if not _is_fingerprint(fingerprint) or scan.get("unchanged") or scan.get("ok") is not True:
            return
        path = self.directory / f"{fingerprint}.json"
        entry = {"fingerprint": fingerprint, "has_sources": has_sources, "scan": dict(scan)}
        try:
            if not has_sources and path.exists():
                old = valid_entry(json.loads(path.read_text(encoding="utf-8")), str(fingerprint))
                if old is not None and "sources" in old:
                    os.utime(path)  # the same tree with sources is already kept: keep it, as the newest
                    return
        except (OSError, ValueError):
            pass
        local_memo.write_entry(self.directory, str(fingerprint), entry, MAX_ENTRIES_PER_HOST)  # atomic; prunes the oldest


def for_host(host: "Host") -> HostScanCache | None:
    root = cache_root()
    return None if root is None else HostScanCache(root / host_identity(host))
