"""apply/kept_facts.py, tried where the first tests did not reach: a summary gathered while an
nvidia-smi call failed must not be kept (it would be served until the next reboot), and the
fingerprint must move with what decides the python's ``sys.path`` besides its directories' stat.

The fingerprint script runs for real in sh, as in tests/unit/test_kept_facts_fingerprint.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuops.apply import kept_facts
from gpuops.apply.kept_facts import FINGERPRINT_PROBE, setup_script
from gpuops.facts.gpu import GpuQuery, SmiBanner
from gpuops.facts.software import PythonPackages
from gpuops.facts.topology import P2PMatrix, TopologyMatrix
from gpuops.gather import Probe
from gpuops.inventory import Host

FP = "c" * 64
TIMED_OUT = "nvidia-smi did not answer within 30 s (wedged GPU or driver?)"


def _host() -> Host:
    return Host(name="h1", address="127.0.0.1", port=2222, user="u", key_file=None, connection="ssh",
                groups=(), vars={})


def _guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> kept_facts.Guard:
    monkeypatch.setenv("GPUOPS_FACTS_CACHE", str(tmp_path / "facts"))
    names = ["gpu.query", "gpu.banner", "gpu.procfs", "gpu.topo", "gpu.p2p", "software.python"]
    return kept_facts.guard(_host(), [Probe(name, "true", str) for name in names])


def _values(**failed: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        FINGERPRINT_PROBE: FP,
        "gpu.query": GpuQuery(known=True),
        "gpu.banner": SmiBanner(known=True, driver_version="580.65", cuda_driver_version="13.0"),
        "gpu.procfs": None,
        "gpu.topo": TopologyMatrix(known=True),
        "gpu.p2p": P2PMatrix(known=True),
        "software.python": PythonPackages(known=True, packages={}, search_path=("/site",)),
    }
    values.update(failed)
    return values


# What the summary says when one nvidia-smi call failed: the query falls back to /proc/driver/nvidia
# (capability and count still known), the interconnect is unknown, the CUDA comes from torch.
DEGRADED = {"compute_capability": "12.0", "cuda": "12.8", "gpu_count": 8, "nvlink": None,
            "p2p_all_pairs": None, "p2p_failed_pairs": []}


@pytest.mark.parametrize("probe,value", [
    ("gpu.p2p", P2PMatrix(known=False, reason=TIMED_OUT)),
    ("gpu.topo", TopologyMatrix(known=False, reason=TIMED_OUT)),
    ("gpu.banner", SmiBanner(known=False, reason=TIMED_OUT)),
    ("gpu.query", GpuQuery(known=False, reason=TIMED_OUT)),
])
def test_a_failed_nvidia_smi_call_is_never_kept(tmp_path: Path, monkeypatch, probe: str, value: Any) -> None:
    """An nvidia-smi call that timed out or failed parses to an unknown value (not a ProbeFailure),
    and the summary is still complete enough to look whole; kept, it would be served with its
    unknown interconnect until the next reboot, though the next live gather would read it."""
    for _ in range(3):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(**{probe: value}), lambda v: dict(DEGRADED))
    held = _guard(tmp_path, monkeypatch).held
    assert held is None or held.fingerprint is None
    assert not any(p.unless for p in _guard(tmp_path, monkeypatch).probes)


def test_a_whole_gather_is_still_kept(tmp_path: Path, monkeypatch) -> None:
    whole = {**DEGRADED, "nvlink": False, "p2p_all_pairs": True}
    for _ in range(2):
        kept_facts.summary(_guard(tmp_path, monkeypatch), "h1", _values(), lambda v: dict(whole))
    assert _guard(tmp_path, monkeypatch).held.fingerprint == FP
