"""Gate scans kept on the client, per host and fingerprint, so an unchanged tree is never scanned twice.

A full gate scan costs the host seconds of CPU; its result depends only on what the host digests in
``remote/scan_fingerprint.py``. The client keeps each scan it received (``memo.Kind.SCANS``: one
scope per host, the key's digest the tree fingerprint the host computed), and offers the fingerprints
it holds with the next scan; a host whose tree still has one of them answers "unchanged" and the kept
scan is used.

Beside its own, a host is offered the fingerprints of the scans kept for other hosts (the newest
``MAX_OFFERED_OTHERS``, by file name alone: none is read unless the host names it): the fingerprint
names a tree by its files, not by where it lies (the root's device, every file's path under the
root, size, mtime and inode, and the python), so the hosts of a fleet cloned from one image, or the
lab's hosts, which hard-link one unpacked release, are scanned once between them, however many
other trees were scanned meanwhile. The scan used is then kept for this host too, with the root and
python its own answer named (a patch is written under that root).

Trust: an entry is used only when its file name, its recorded fingerprint and the scan's own
fingerprint agree, it is a complete scan of this scanner version, and the host named that very
fingerprint. The host's own entries are read before they are offered, so a torn, edited or foreign
one is ignored and the host scans again. Another host's entry is read only after the host named it
(one pruned meanwhile is read from any other host that keeps the same tree's scan): one that fails
then is removed, and with no other copy the scan is reported unknown ("run again"), never used. Entries are
written atomically (``memo.put``) and the memo's format is one of the scan's options (so of its
fingerprint), so that takes an edited or damaged file. The host identity only spreads entries over
directories: correctness rests on the fingerprint. A host is told no more than sha256 digests of
other hosts' trees' stat data; a host that lies about its tree misleads only its own report, as a
host that lies in a full scan does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from gpuops import memo
from gpuops.gates.scan import SUPPORTED_SCANNER
from gpuops.frozen import frozen

if TYPE_CHECKING:
    from gpuops.inventory import Host

MAX_OFFERED = 2          # this host's own entries: read (parsed, ~5 ms each) and checked before the exec
MAX_OFFERED_OTHERS = 24  # other hosts' fingerprints, offered by name (64 bytes each on the command line)


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


@frozen
class Offer:
    """What one gate scan offers the host: this host's kept scans (read and checked), and the keys of
    other hosts' (read only when the host names one)."""

    own: dict[str, dict[str, Any]]
    others: dict[str, memo.Key]
    need_sources: bool = False

    def fingerprints(self) -> list[str]:
        return sorted({*self.own, *self.others})

    def __bool__(self) -> bool:
        return bool(self.own or self.others)

    def scan(self, fingerprint: str) -> dict[str, Any] | None:
        """The kept scan of ``fingerprint``, which the host named; None when it was not offered or
        another host's entry proves not to be a whole scan of it (that entry is then removed)."""
        if fingerprint in self.own:
            return self.own[fingerprint]
        key = self.others.get(fingerprint)
        if key is None:
            return None
        # The entry offered may have been pruned since (its host kept newer scans, in another
        # command): any other host's copy of the same tree's scan serves as well.
        for where in [key, *(k for k in memo.keys_of_other_scopes(memo.Kind.SCANS, key.scope)
                             if k.digest == fingerprint)]:
            data = memo.get(where)
            if data is None and not memo.exists(where):
                continue  # gone
            scan = valid_entry(data, fingerprint)
            if scan is not None and (not self.need_sources or "sources" in scan):
                return scan
            memo.discard(where)  # torn, or not a whole scan of that tree: never offered again
        return None


NO_OFFER = Offer({}, {})


@frozen
class HostScanCache:
    """The scans kept for one host (a memo scope)."""

    scope: str

    def offer(self, need_sources: bool) -> Offer:
        """This host's newest valid entries (at most ``MAX_OFFERED``; with ``need_sources``, only
        scans that carry the patchable files' sources), and the newest other hosts' fingerprints
        (at most ``MAX_OFFERED_OTHERS``; the module's docstring says why that is sound)."""
        own = _valid_scans(memo.keys(memo.Kind.SCANS, self.scope), need_sources)
        others: dict[str, memo.Key] = {}
        for key in memo.keys_of_other_scopes(memo.Kind.SCANS, self.scope):
            if len(others) >= MAX_OFFERED_OTHERS:
                break
            if _is_fingerprint(key.digest) and key.digest not in own:
                others.setdefault(key.digest, key)  # a fleet's hosts share fingerprints: each offered once
        return Offer(own, others, need_sources)

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


def _valid_scans(keys: Iterable[memo.Key], need_sources: bool) -> dict[str, dict[str, Any]]:
    """The newest ``MAX_OFFERED`` whole scans among ``keys`` (newest first), each read only when
    it may be offered (an entry is ~0.4 MB of JSON for a release's tree: ~3 ms to read)."""
    found: dict[str, dict[str, Any]] = {}
    for key in keys:
        if len(found) >= MAX_OFFERED:
            break
        if not _is_fingerprint(key.digest) or key.digest in found:
            continue
        scan = valid_entry(memo.get(key), key.digest)
        if scan is not None and (not need_sources or "sources" in scan):
            found[key.digest] = scan
    return found


def for_host(host: "Host") -> HostScanCache | None:
    return None if memo.root() is None else HostScanCache(memo.host_identity(host))
