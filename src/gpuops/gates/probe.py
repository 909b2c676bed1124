"""The gate-scan probe: the stdlib scanner shipped inside the gather script, run with the python
the preamble chose for the host (``$GPUOPS_PY``: the SGLang server's own interpreter when known).

The scanner's text travels in a quoted heredoc, so nothing in it is expanded by the shell; its
options travel as one shell-quoted argv word of JSON.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gpuops import memo
from gpuops.gates import BUILTIN_CATALOG, catalog, scan_cache
from gpuops.gates.kernels import probe_reads
from gpuops.gates.scan import (
    GateScan,
    parse_scan_output,
    scan_from_dict,
    scanner_json,
    unknown_scan,
)
from gpuops.gather import LARGE_PROBE_OUTPUT_LIMIT, Probe
from gpuops.shipping import source

if TYPE_CHECKING:
    from gpuops.gather import ProbeOutput
    from gpuops.inventory import Host

PROBE_NAME = "gates.scan"
_EOF = "GPUOPS_GATE_SCAN_EOF"
_CHECK_EOF = "GPUOPS_SCAN_CHECK_EOF"


def scanner_source() -> str:
    return source("gate_scan")


def scanner_digest(text: str | None = None) -> str:
    """The sha256 of the scanner's text (``scanner_source()`` unless given): what a scan made by
    one scanner is told apart by, on the host (its fingerprint) and by anyone keeping scans."""
    import hashlib

    return hashlib.sha256((scanner_source() if text is None else text).encode("utf-8")).hexdigest()


def scan_options(with_sources: bool = False, root: str | None = None, keywords: list[str] | None = None,
                 jobs: int | None = None) -> dict[str, Any]:
    """The scanner's options. ``keywords``: regexes naming the files worth returning whole (and the
    unparseable files that may matter); by default, the keywords of the catalog features with a patch. ``jobs``:
    worker processes (default: the host's CPUs, at most 8)."""
    if keywords is None:
        keywords = patch_keywords()
    opts: dict[str, Any] = {"keywords": keywords}
    if with_sources:
        opts["with_sources"] = True
    if root:
        opts["root"] = root
    if jobs:
        opts["jobs"] = int(jobs)
    return opts


def patch_keywords(catalog_path: Path | None = None) -> list[str]:
    """The keyword regexes of the catalog's features that have a patch: only their files are needed
    whole (the fusion patch); the others are judged from the gates alone, and their files stay on
    the host. ``catalog_path``: another catalog file (tests). Kept (``catalog_derived``)."""

    def from_catalog() -> list[str]:
        return [p.pattern for f in catalog.load_catalog(catalog_path).features if f.patchable for p in f.keywords]

    kept = catalog_derived("patch-keywords", from_catalog, catalog_path)
    return kept if isinstance(kept, list) and all(isinstance(k, str) for k in kept) else from_catalog()


def kernel_reads(catalog_path: Path | None = None) -> dict[str, Any]:
    """What the software probe reads of the kernel libraries for the catalog's ``kernels:`` needs
    (``gates/kernels.probe_reads``). Kept (``catalog_derived``)."""

    def from_catalog() -> dict[str, Any]:
        return probe_reads(catalog.load_catalog(catalog_path))

    kept = catalog_derived("kernel-reads", from_catalog, catalog_path)
    return kept if isinstance(kept, dict) else from_catalog()


def catalog_key(kind: str, catalog_path: Path | None = None) -> "Any":
    """The memo key of a value made from the catalog: gpuops' code (``memo.code_digest``, which a
    command that plans or judges computes anyway) and the catalog file's path, size, mtime and
    inode. None when the file cannot be read (then it is parsed, and says what is wrong)."""

    path = catalog_path or BUILTIN_CATALOG
    try:
        info = os.stat(path)
    except OSError:
        return None
    return memo.key(memo.Kind.CATALOG, kind, memo.code_digest(), str(path), info.st_size, info.st_mtime_ns, info.st_ino)


def catalog_derived(kind: str, from_catalog: Callable[[], Any], catalog_path: Path | None = None) -> Any:
    """A value made from the catalog, kept (``memo.Kind.CATALOG``) under ``catalog_key``: a command
    with nothing to scan does not import and parse the catalog just for this (~3 ms), and any edit
    of the catalog or of the code that reads it is a miss."""

    if memo.root() is None:
        return from_catalog()
    key = catalog_key(kind, catalog_path)
    if key is None:
        return from_catalog()
    data = memo.get(key)
    if data and "value" in data:
        return data["value"]
    value = from_catalog()
    memo.put(key, {"value": value})
    return value


def gate_scan_script(options: dict[str, Any]) -> str:
    """POSIX sh: run the scanner with ``$GPUOPS_PY``, or say why it cannot run (as scanner JSON)."""
    text = scanner_source()
    if any(line.strip() == _EOF for line in text.splitlines()):
        raise ValueError("the scanner's text contains its own heredoc terminator")
    # The scanner's own text is part of its options, so of the host's fingerprint of a scan: a
    # client with another scanner never takes a scan made by this one for its own.
    options = {**options, "scanner_digest": scanner_digest(text)}
    no_python = json.dumps({"scanner": 1, "ok": False, "reason": "no python 3.8+ found on the host"})
    argv = shlex.quote(json.dumps(options, sort_keys=True))
    check = ""
    if options.get("known"):
        # Offered kept scans: the small fingerprint check runs first and, on a match, answers alone.

        check_text = source("scan_fingerprint")
        if any(line.strip() == _CHECK_EOF for line in check_text.splitlines()):
            raise ValueError("the fingerprint check's text contains its own heredoc terminator")
        check = (f'elif "$GPUOPS_PY" - {argv} <<\'{_CHECK_EOF}\'\n'
                 f"{check_text.rstrip()}\n"
                 f"{_CHECK_EOF}\n"
                 "then\n"
                 "  :\n")
    return (
        'if [ -z "$GPUOPS_PY" ]; then\n'
        f"  printf '%s\\n' {shlex.quote(no_python)}\n"
        f"{check}"
        "else\n"
        f'  "$GPUOPS_PY" - {argv} <<\'{_EOF}\'\n'
        f"{text.rstrip()}\n"
        f"{_EOF}\n"
        "fi"
    )


def parse_gate_scan(out: ProbeOutput) -> GateScan:
    return parse_scan_output(out.stdout, out.stderr, out.exit_status)


def gate_scan_probe(with_sources: bool = False, root: str | None = None, host: Host | None = None,
                    offer: bool = True) -> Probe[GateScan]:
    """The probe for ``gpuops.gather``; ``with_sources`` also returns the text of every file holding
    a catalog feature's gates (the patch planner's input).

    With ``host``, the scans kept for it (``gates/scan_cache.py``) are offered: a host whose tree is
    unchanged answers in a line and the kept scan is used; a new scan is kept for the next command.
    A scan that will be kept is always asked with the sources, and handed to a caller that did not
    ask for them without: the sources are a few files (130-430 KB on 0.5.8-0.5.23) beside a scan
    of the whole tree, and a kept scan without them cannot serve apply, whose patch planner needs
    them, so the first ``apply`` after ``inspect``/``advise`` scanned the whole tree again.
    ``offer=False`` (``--flush-cache``): nothing offered, the host scans, the new scan is kept."""

    cache = scan_cache.for_host(host) if host is not None else None
    if cache is None:
        return Probe(PROBE_NAME, gate_scan_script(scan_options(with_sources, root)), parse_gate_scan,
                     output_limit=LARGE_PROBE_OUTPUT_LIMIT)
    # The memo's format is part of a kept scan's fingerprint: an entry kept in another format is
    # never named by the host (other hosts' entries are offered unread: scan_cache.py).
    options = {**scan_options(True, root), "kept_format": memo.FORMAT}
    offered = cache.offer(need_sources=with_sources) if offer else scan_cache.NO_OFFER
    if offered:
        options["known"] = offered.fingerprints()
    return Probe(PROBE_NAME, gate_scan_script(options), _cached_parse(host.name, cache, offered, with_sources),  # type: ignore[union-attr]
                 output_limit=LARGE_PROBE_OUTPUT_LIMIT)  # a scan's report with its source excerpts


def _cached_parse(host_name: str, cache: scan_cache.HostScanCache, offered: scan_cache.Offer,
                  with_sources: bool) -> Callable[[ProbeOutput], GateScan]:
    import dataclasses
    import logging

    log = logging.getLogger("gpuops.transport")  # shown with -v, as the commands themselves are

    def parse(out: ProbeOutput) -> GateScan:
        data = scanner_json(out.stdout)
        if not isinstance(data, dict) or not data.get("ok"):
            return parse_gate_scan(out)
        fingerprint = data.get("fingerprint")
        if data.get("unchanged"):
            if not isinstance(fingerprint, str) or fingerprint not in offered.fingerprints():
                # never offered: a confused host, not a reason to trust anything
                return unknown_scan("the host answered 'unchanged' for a gate scan this client does not hold")
            kept = offered.scan(fingerprint)
            if kept is None:
                return unknown_scan(f"another host's kept scan of this tree (fingerprint {fingerprint[:16]}) could "
                                    "not be read; it was removed: run the command again to scan the tree")
            if isinstance(data.get("root"), str):
                kept = {**kept, "root": data["root"]}  # where this host's tree lies (a patch is written there)
            whose = "at home"
            if not cache.holds(fingerprint):  # another host's scan of the same tree: keep it as this host's
                cache.store(kept, has_sources=isinstance(kept.get("sources"), dict))
                whose = "at home for another host with the same files"
            if not with_sources:  # judged exactly as a scan without sources would be
                kept = {k: v for k, v in kept.items() if k != "sources"}
            log.info("%s: gate scan: tree unchanged (fingerprint %s), used the scan kept %s",
                     host_name, str(fingerprint)[:16], whose)
            return dataclasses.replace(scan_from_dict(kept), cached=True)
        scan = scan_from_dict(data)
        if scan.known and scan.fingerprint:
            cache.store(data, has_sources=isinstance(data.get("sources"), dict))  # asked with them (gate_scan_probe)
            log.info("%s: gate scan: scanned %d files (fingerprint %s), kept for the next command",
                     host_name, scan.files_total, scan.fingerprint[:16])
        if not with_sources:  # judged exactly as a scan without sources would be
            scan = scan_from_dict({k: v for k, v in data.items() if k != "sources"})
        return scan

    return parse
