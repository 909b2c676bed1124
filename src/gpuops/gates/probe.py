"""The gate-scan probe: the stdlib scanner shipped inside the gather script, run with the python
the preamble chose for the host (``$GPUOPS_PY``: the SGLang server's own interpreter when known).

The scanner's text travels in a quoted heredoc, so nothing in it is expanded by the shell; its
options travel as one shell-quoted argv word of JSON.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from gpuops.gates.scan import GateScan, parse_scan_output

if TYPE_CHECKING:
    from gpuops.gather import Probe, ProbeOutput

PROBE_NAME = "gates.scan"
_EOF = "GPUOPS_GATE_SCAN_EOF"


def scanner_source() -> str:
    from gpuops.remote import source

    return source("gate_scan")


def scan_options(with_sources: bool = False, root: str | None = None, keywords: list[str] | None = None,
                 jobs: int | None = None) -> dict[str, Any]:
    """The scanner's options. ``keywords``: regexes naming the files worth returning whole (and the
    unparseable files that may matter); by default, the keywords of the catalog features with a patch. ``jobs``:
    worker processes (default: the host's CPUs, at most 8)."""
    if keywords is None:
        from gpuops.gates.catalog import load_catalog

        # Only the features a patch can change need their files whole (the fusion patch); the
        # others are judged from the gates alone, and their files stay on the host.
        keywords = [p.pattern for f in load_catalog().features if f.patchable for p in f.keywords]
    opts: dict[str, Any] = {"keywords": keywords}
    if with_sources:
        opts["with_sources"] = True
    if root:
        opts["root"] = root
    if jobs:
        opts["jobs"] = int(jobs)
    return opts


def gate_scan_script(options: dict[str, Any]) -> str:
    """POSIX sh: run the scanner with ``$GPUOPS_PY``, or say why it cannot run (as scanner JSON)."""
    text = scanner_source()
    if any(line.strip() == _EOF for line in text.splitlines()):
        raise ValueError("the scanner's text contains its own heredoc terminator")
    no_python = json.dumps({"scanner": 1, "ok": False, "reason": "no python 3.8+ found on the host"})
    return (
        'if [ -z "$GPUOPS_PY" ]; then\n'
        f"  printf '%s\\n' {shlex.quote(no_python)}\n"
        "else\n"
        f'  "$GPUOPS_PY" - {shlex.quote(json.dumps(options, sort_keys=True))} <<\'{_EOF}\'\n'
        f"{text.rstrip()}\n"
        f"{_EOF}\n"
        "fi"
    )


def parse_gate_scan(out: ProbeOutput) -> GateScan:
    return parse_scan_output(out.stdout, out.stderr, out.exit_status)


def gate_scan_probe(with_sources: bool = False, root: str | None = None) -> Probe[GateScan]:
    """The probe for ``gpuops.gather``; ``with_sources`` also returns the text of every file holding
    a catalog feature's gates (the patch planner's input)."""
    from gpuops.gather import Probe

    return Probe(PROBE_NAME, gate_scan_script(scan_options(with_sources, root)), parse_gate_scan)
