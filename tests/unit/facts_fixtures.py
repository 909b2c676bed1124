"""Shared helpers for the facts tests: where the captured fixtures live, and output builders."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from gpuops.gather import ProbeOutput
from labtools import fixtures_path

FIXTURES = fixtures_path()
H200 = FIXTURES / "real" / "h200-x1"
RTX8 = FIXTURES / "synthetic" / "rtx-pro-6000-server-x8"

DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)


def fixture_text(directory: Path, name: str) -> str:
    path = directory / name
    if not path.is_file():
        # Not a skip: the captures are committed under tests/fixtures, so a missing one is a broken tree.
        pytest.fail(f"fixture {path} is missing (tests/fixtures, or $GPUOPS_FIXTURES)")
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


# The synthetic 8x RTX PRO 6000 host's server (fixtures/synthetic/.../host.yaml), as argv.
KIMI = (
    "python3 -m sglang.launch_server --model-path /models/Kimi-K2.5 --tp 8 --port 30000 "
    "--trust-remote-code --speculative-algorithm EAGLE3 "
    "--speculative-draft-model-path /models/Kimi-K2.5-eagle3 --speculative-num-steps 3 "
    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
).split()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def server_output(argv: list[str], env: str | None = "NCCL_P2P_LEVEL=SYS\nNCCL_IB_DISABLE=1\nSGLANG_ADMIN_TOKEN=x\n",
                   cgroup: str = "0::/system.slice/sglang.service\n", extra: str = "", health: str = "health=200") -> ProbeOutput:
    argv_bytes = b"".join(word.encode() + b"\0" for word in argv)
    lines = [
        "want_port=30000", "others= 999:30001", "pid=4242", "ppid=1", "exe=/usr/bin/python3.12",
        f"argv_b64={b64(argv_bytes)}", f"cgroup_b64={b64(cgroup.encode())}",
    ]
    lines.append(f"env_b64={b64(env.replace(chr(10), chr(0)).encode())}" if env is not None else "env_error=cannot read /proc/4242/environ (the server runs as another user; inspect as that user or root)")
    lines += ["health_url=http://127.0.0.1:30000/health", health]
    return ProbeOutput("\n".join(lines) + "\n" + extra, "", 0)
