"""Run the gate-scan probe on THIS machine, exactly as a host runs it: the probe's own sh script
under ``sh``, with ``GPUOPS_PY`` set and the SGLang site dir on ``PYTHONPATH``. Used by tests and
by anyone who wants to audit an unpacked release (``gpuops.lab.sglang_cache.sglang_site``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuops.errors import GpuopsError
from gpuops.gates.probe import gate_scan_script, parse_scan_output, scan_options
from gpuops.gates.scan import GateScan


def scan_site(site: str | Path | None, with_sources: bool = False, python: str = "python3",
              root: str | Path | None = None, timeout: float = 300, jobs: int | None = None) -> GateScan:
    """Scan the ``sglang`` package that ``python`` finds with ``site`` on its PYTHONPATH (or the
    package dir ``root`` given explicitly)."""
    return parse_scan_output(*scan_site_output(site, with_sources, python, root, timeout, jobs))


def scan_site_output(site: str | Path | None, with_sources: bool = False, python: str = "python3",
                     root: str | Path | None = None, timeout: float = 300,
                     jobs: int | None = None) -> tuple[str, str, int]:
    """``scan_site``'s run before parsing: the scanner's stdout, stderr and exit status, as a host
    would send them back (what a caller keeping scans stores: the parse is the client's own)."""
    script = gate_scan_script(scan_options(with_sources, str(root) if root else None, jobs=jobs))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["GPUOPS_PY"] = python
    if site is not None:
        env["PYTHONPATH"] = str(site)
    try:
        done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, env=env,
                              timeout=timeout, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuopsError(f"gate scan of {site or root}: {exc}") from None
    return done.stdout, done.stderr, done.returncode
