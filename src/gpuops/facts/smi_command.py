"""One nvidia-smi call as a gather probe, and saying clearly why it gave nothing.

Every nvidia-smi call initialises NVML, which costs from a tenth of a second to seconds on a big
box; the calls are independent, so each probe STARTS its call in the background (``Probe.start``)
and the gather waits for all of them at once: the facts cost the slowest call, not the sum. The
probe's own script then prints what its call wrote, so each call comes back in the gather's own
frame (one framing scheme, one nonce).

nvidia-smi fails in a few recognisable ways: it is not installed (no driver), it cannot talk to the
driver (module not loaded: it prints "NVIDIA-SMI has failed ..." and exits 9), or it hangs on a
wedged GPU. Each becomes one readable reason instead of a crash or an empty table.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuops.gather import Probe, ProbeOutput, in_background

T = TypeVar("T")

SMI_TIMEOUT_S = 30
NOT_FOUND_STATUS = 127
TIMEOUT_STATUS = 124
NOT_FOUND_MESSAGE = "gpuops: nvidia-smi: not found on PATH"

# ANSI escapes: real `nvidia-smi topo -m` underlines its header even when writing to a file.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


def smi_command(args: Sequence[str]) -> str:
    """sh text that runs ``nvidia-smi ARGS`` (cut off after ``SMI_TIMEOUT_S`` where ``timeout``
    exists), or says it is not on PATH with status ``NOT_FOUND_STATUS``."""
    command = " ".join(shlex.quote(a) for a in ("nvidia-smi", *args))
    return (
        "if command -v nvidia-smi >/dev/null 2>&1; then\n"
        f"  if command -v timeout >/dev/null 2>&1; then timeout {SMI_TIMEOUT_S} {command}; else {command}; fi\n"
        "else\n"
        f"  echo {shlex.quote(NOT_FOUND_MESSAGE)} >&2; exit {NOT_FOUND_STATUS}\n"
        "fi"
    )


def smi_probe(name: str, args: Sequence[str], parse: Callable[[ProbeOutput], T]) -> Probe[T]:
    """The probe ``name``: ``nvidia-smi ARGS`` run side by side with the other nvidia-smi probes."""
    return in_background(Probe(name, smi_command(args), parse))
