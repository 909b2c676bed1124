"""Shared helpers for the facts tests: where the captured fixtures live, and output builders."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.gather import ProbeOutput

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures"
H200 = FIXTURES / "real" / "h200-x1"
RTX8 = FIXTURES / "synthetic" / "rtx-pro-6000-server-x8"

DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


def fixture_text(directory: Path, name: str) -> str:
    path = directory / name
    if not path.is_file():
        pytest.skip(f"fixture {path} is missing (the shared/ checkout beside the repo holds it)")
    # newline="" keeps the bytes exactly as captured (tabs, ANSI escapes, line ends).
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def ok(stdout: str) -> ProbeOutput:
    return ProbeOutput(stdout=stdout, stderr="", exit_status=0)


def driver_error() -> ProbeOutput:
    return ProbeOutput(stdout=DRIVER_FAILURE, stderr="", exit_status=9)


def not_found() -> ProbeOutput:
    return ProbeOutput(stdout="", stderr="gpuops: nvidia-smi: not found on PATH\n", exit_status=127)


def topo_matrix(links: list[list[str]], affinity: list[tuple[str, str]], nics: int = 0) -> str:
    """A `nvidia-smi topo -m` text in the real tool's format (ANSI header, tab separated)."""
    n = len(links)
    devices = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)]
    lines = ["\t\x1b[4m" + "\t".join(devices + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for i, row in enumerate(links):
        cells = [" X " if c == "X" else c for c in row] + ["PXB"] * nics
        lines.append("\t".join([f"GPU{i}", *cells, affinity[i][0], affinity[i][1], "", "N/A"]))
    for k in range(nics):
        lines.append("\t".join([f"NIC{k}", *(["PXB"] * n), *(" X " if j == k else "SYS" for j in range(nics))]))
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks", ""]
    if nics:
        lines += ["NIC Legend:", ""] + [f"  NIC{k}: mlx5_{k}" for k in range(nics)]
    return "\n".join(lines) + "\n"


def p2p_matrix(status: list[list[str]]) -> str:
    n = len(status)
    lines = [" \t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(n)) + "\t\x1b[0m"]
    for i, row in enumerate(status):
        lines.append(f" GPU{i}\t" + "\t".join(row) + "\t")
    lines += ["", "Legend:", "", "  X    = Self", "  OK   = Status Ok", "  CNS  = Chipset not supported", ""]
    return "\n".join(lines) + "\n"
