"""Running nvidia-smi inside a probe, and saying clearly why it gave nothing.

nvidia-smi fails in a few recognisable ways: it is not installed (no driver), it cannot talk to the
driver (module not loaded: it prints "NVIDIA-SMI has failed ..." and exits 9), or it hangs on a
wedged GPU. Each becomes one readable reason instead of a crash or an empty table.
"""

from __future__ import annotations

import re
import shlex

from gpuops.gather import ProbeOutput

SMI_TIMEOUT_S = 30
NOT_FOUND_STATUS = 127
TIMEOUT_STATUS = 124

QUERY_FIELDS = (
    "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm"
)

# ANSI escapes: real `nvidia-smi topo -m` underlines its header even when writing to a file.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def smi_script(*args: str) -> str:
    """sh text that runs ``nvidia-smi ARGS`` with a time limit, or explains that it is missing."""
    command = " ".join(shlex.quote(a) for a in ("nvidia-smi", *args))
    return (
        "command -v nvidia-smi >/dev/null 2>&1 || "
        f"{{ echo 'gpuops: nvidia-smi: not found on PATH' >&2; exit {NOT_FOUND_STATUS}; }}\n"
        "if command -v timeout >/dev/null 2>&1; then "
        f"timeout {SMI_TIMEOUT_S} {command}; else {command}; fi"
    )


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def failure_reason(out: ProbeOutput) -> str | None:
    """Why an nvidia-smi run gave no usable output, or None when it succeeded."""
    both = f"{out.stdout}\n{out.stderr}"
    if "couldn't communicate with the NVIDIA driver" in both or "NVIDIA-SMI has failed" in both:
        return (
            "nvidia-smi cannot communicate with the NVIDIA driver (driver not loaded, or a "
            f"driver/library version mismatch; exit status {out.exit_status})"
        )
    if out.exit_status == NOT_FOUND_STATUS:
        return "nvidia-smi not found on PATH (no NVIDIA driver installed?)"
    if out.exit_status == TIMEOUT_STATUS:
        return f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s (wedged GPU or driver?)"
    if out.exit_status != 0:
        first = next((line.strip() for line in both.splitlines() if line.strip()), "no output")
        return f"nvidia-smi exited with status {out.exit_status}: {first[:200]}"
    if not out.stdout.strip():
        return "nvidia-smi printed nothing"
    return None
