"""The gate scanner's JSON report, as a value (pure: no I/O).

The scanner (``gpuops/remote/gate_scan.py``) runs on the host and prints one JSON document; this
module turns it into a ``GateScan``. Gates stay plain dicts (their condition is a JSON tree that
``gpuops.gates.logic`` reads) so that nothing is lost between the host's view and ours.
"""

from __future__ import annotations

import json
from dataclasses import field
from typing import Any, Mapping
from gpuops.frozen import frozen

SUPPORTED_SCANNER = 1


@frozen
class GateScan:
    """Every GPU-generation gate the scanner found in a host's installed SGLang, with the predicates' meanings,
    the files it could not read or parse, and the sources the patch planner asked for; ``known`` False, with
    ``reason``, when there is no usable scan."""

    known: bool
    reason: str | None = None
    root: str | None = None
    version: str | None = None
    python: str | None = None
    gates: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    predicates: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    platform_attrs: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[Mapping[str, Any], ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict, repr=False)
    files_total: int = 0
    files_parsed: int = 0
    elapsed_s: float | None = None
    cpu_s: float | None = None
    # The digest of the scan's inputs on the host (remote/scan_fingerprint.py); None: not cacheable.
    fingerprint: str | None = None
    # True when this scan came from the client's cache because the host said its tree is unchanged.
    cached: bool = False
    # True for the host's short answer "unchanged since the scan of ``fingerprint``" (no gates in it):
    # only the cache-aware probe (gates/probe.py) asks for it, and it replaces it with the scan it holds.
    unchanged: bool = False

    def gate(self, gate_id: str) -> Mapping[str, Any] | None:
        for gate in self.gates:
            if gate.get("id") == gate_id:
                return gate
        return None


def unknown_scan(reason: str) -> GateScan:
    return GateScan(known=False, reason=reason)


def scan_from_dict(data: Any) -> GateScan:
    """A ``GateScan`` from the scanner's decoded JSON; anything malformed gives ``known=False``."""
    if not isinstance(data, dict):
        return unknown_scan("gate scanner output is not a JSON object")
    if data.get("scanner") != SUPPORTED_SCANNER:
        return unknown_scan(f"gate scanner output has version {data.get('scanner')!r}, expected {SUPPORTED_SCANNER}")
    if not data.get("ok"):
        return GateScan(known=False, reason=str(data.get("reason") or "gate scan failed"),
                        python=data.get("python"), elapsed_s=data.get("elapsed_s"))
    if data.get("unchanged"):
        return GateScan(known=False, reason="the host's tree is unchanged since a scan this client holds",
                        root=data.get("root"), version=data.get("version"), python=data.get("python"),
                        fingerprint=_text_or_none(data.get("fingerprint")), unchanged=True)
    gates = data.get("gates")
    if not isinstance(gates, list) or not all(isinstance(g, dict) and "id" in g and "condition" in g for g in gates):
        return unknown_scan("gate scanner output has no valid gate list")
    return GateScan(
        known=True,
        root=data.get("root"),
        version=data.get("version"),
        python=data.get("python"),
        gates=tuple(gates),
        predicates=tuple(p for p in data.get("predicates") or () if isinstance(p, dict)),
        platform_attrs=dict(data.get("platform_attrs") or {}),
        errors=tuple(e for e in data.get("errors") or () if isinstance(e, dict)),
        sources=dict(data.get("sources") or {}),
        files_total=int(data.get("files_total") or 0),
        files_parsed=int(data.get("files_parsed") or 0),
        elapsed_s=data.get("elapsed_s"),
        cpu_s=data.get("cpu_s"),
        fingerprint=_text_or_none(data.get("fingerprint")),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_scan_output(stdout: str, stderr: str = "", exit_status: int = 0) -> GateScan:
    """The scanner's stdout (one JSON document, possibly after noise lines) as a ``GateScan``."""
    text = stdout.strip()
    if not text:
        last = (stderr.strip().splitlines() or [f"exit status {exit_status}"])[-1]
        return unknown_scan(f"gate scanner printed nothing ({last[:200]})")
    data = scanner_json(text)
    if data is None:
        return unknown_scan("gate scanner output is not JSON")
    return scan_from_dict(data)


def scanner_json(stdout: str) -> Any:
    """The scanner's decoded JSON document, or None when its output holds none."""
    text = stdout.strip()
    if not text:
        return None
    # The JSON document is the last line; anything a sitecustomize printed before it is ignored.
    try:
        return json.loads(text.splitlines()[-1])
    except ValueError:
        return None
