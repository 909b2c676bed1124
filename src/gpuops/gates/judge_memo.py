"""A kept gate scan's verdicts, recalled instead of judged again when nothing they depend on changed.

Judging (``gates/evaluate.judge``) is pure: the scan, the GPU's compute capability, the CUDA
version, what the server runs and the interconnect, read through gpuops' own code and catalog. A
kept scan (``gates/scan_cache.py``) is pinned down by its tree fingerprint, so the digest of
(gpuops' code, the fingerprint, the scan's sources, and those facts) names the report exactly; the
report of a known scan is kept under it (``memo.Kind.JUDGED``). Any other input (a restarted server with other flags, another GPU, another
tree) is another digest, and is judged.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from gpuops import memo
from gpuops.gates.evaluate import GateReport

if TYPE_CHECKING:
    from gpuops.gates.evaluate import GateReport
    from gpuops.gates.scan import GateScan

# Server facts judging never reads, left out of the digest: the other SGLang servers on the host
# (their pids and ports come and go on a shared machine, and would make every digest new).
# tests/unit/test_scan_cache.py judges with different values of each and holds the reports equal,
# so a judge that starts reading one fails there, not here.
SERVER_FIELDS_NOT_JUDGED = ("others",)
_FIELDS = {"gates", "features", "version", "gpu", "known", "reason", "errors"}


def memo_key(scan: "GateScan", compute_capability: str | None, cuda: str | None,
             server: Mapping[str, Any] | None, interconnect: Mapping[str, Any] | None) -> memo.Key | None:
    """Every input judging reads: gpuops' code and catalog, the scan (its tree fingerprint and the
    patchable files' sources), and the host's facts judged with."""
    judged_server = {k: v for k, v in (server or {}).items() if k not in SERVER_FIELDS_NOT_JUDGED} if server is not None else None
    return memo.key(memo.Kind.JUDGED, memo.code_digest(), scan.fingerprint, dict(scan.sources or {}),
                    compute_capability, cuda, judged_server, interconnect)


def judge_or_recall(scan: "GateScan", compute_capability: str | None, cuda: str | None,
                    server: Mapping[str, Any] | None, interconnect: Mapping[str, Any] | None,
                    judge: Callable[[], "GateReport"], host: str = "", recall: bool = True) -> "GateReport":
    """``judge()``, or the report kept for the same inputs (``memo_key``); ``recall=False``
    (``--flush-cache``): judged in any case, and the report kept again."""

    if (memo.root() is None or not scan.known or not scan.fingerprint
            or {f.name for f in dataclasses.fields(GateReport)} != _FIELDS):
        return judge()
    key = memo_key(scan, compute_capability, cuda, server, interconnect)
    if key is None:
        return judge()
    data = memo.get(key) if recall else None
    if data is not None:
        try:
            report = GateReport(**{name: data[name] for name in _FIELDS})
        except (KeyError, TypeError):
            report = None
        if report is not None and isinstance(report.gates, list) and isinstance(report.features, dict):
            logging.getLogger("gpuops.transport").info(
                "%s: gates: same scan and facts as a kept report (digest %s), not judged again", host, key.digest[:16])
            return report
    report = judge()
    if report.known:
        # the scan's fingerprint: what --flush-cache of the scan's host forgets it by (memo.forget_hosts)
        memo.put(key, {"fingerprint": scan.fingerprint, **{name: getattr(report, name) for name in _FIELDS}})
    return report
