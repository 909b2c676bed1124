"""Compute capability -> SM number and architecture name.

The compute capability nvidia-smi reports (``compute_cap``) is authoritative: "12.0" is sm120 no
matter what the marketing name says. Names are only a fallback for drivers too old to report
``compute_cap``, and the table below is deliberately explicit because the names are easy to get
wrong: H100/H200 are Hopper sm90 (not sm100), B200/GB200 sm100, B300/GB300 sm103, RTX PRO 6000
Blackwell and RTX 50xx sm120, GB10 sm121, A100 Ampere sm80, L40S Ada sm89.
"""

from __future__ import annotations

import re
from gpuops.frozen import frozen

# (major, minor) -> architecture; a missing minor falls back to the major's entry.
_ARCH_BY_CC: dict[tuple[int, int | None], str] = {
    (5, None): "Maxwell",
    (6, None): "Pascal",
    (7, 0): "Volta",
    (7, 2): "Volta",
    (7, 5): "Turing",
    (8, 0): "Ampere",
    (8, 6): "Ampere",
    (8, 7): "Ampere",
    (8, 9): "Ada Lovelace",
    (9, None): "Hopper",
    (10, None): "Blackwell",
    (11, None): "Blackwell",
    (12, None): "Blackwell",
}

# Name patterns (matched case-insensitively against nvidia-smi's name) -> compute capability.
# Order matters: the first match wins, so more specific names come first.
_CC_BY_NAME: tuple[tuple[str, str], ...] = (
    (r"\bGB10\b", "12.1"),
    (r"\bRTX PRO \d+ Blackwell", "12.0"),
    (r"\bRTX 50\d0\b", "12.0"),
    (r"\bG?B300\b", "10.3"),
    (r"\bG?B200\b", "10.0"),
    (r"\bB100\b", "10.0"),
    (r"\bG?H200\b", "9.0"),
    (r"\bH100\b", "9.0"),
    (r"\bH800\b", "9.0"),
    (r"\bH20\b", "9.0"),
    (r"\bL40S?\b", "8.9"),
    (r"\bL4\b", "8.9"),
    (r"\bRTX 40\d0\b", "8.9"),
    (r"\bRTX 6000 Ada\b", "8.9"),
    (r"\bA100\b", "8.0"),
    (r"\bA800\b", "8.0"),
    (r"\bA30\b", "8.0"),
    (r"\bA10G?\b", "8.6"),
    (r"\bA40\b", "8.6"),
    (r"\bRTX A6000\b", "8.6"),
    (r"\bRTX 30\d0\b", "8.6"),
    (r"\bT4\b", "7.5"),
    (r"\bV100\b", "7.0"),
)

_CC_RE = re.compile(r"^\s*(\d{1,2})\.(\d{1,2})\s*$")


@frozen
class GpuArch:
    """What a GPU is, in the terms SGLang's gates use."""

    compute_capability: str | None  # "12.0"
    sm: str | None  # "sm120"
    arch: str | None  # "Blackwell"
    source: str  # "compute_cap" (authoritative), "name" (fallback) or "unknown"


def parse_compute_capability(text: str | None) -> tuple[int, int] | None:
    """"9.0" -> (9, 0); anything else (``[N/A]``, empty) -> None."""
    if not text:
        return None
    match = _CC_RE.match(text)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2))


def sm_of(major: int, minor: int) -> str:
    """(12, 0) -> "sm120", (9, 0) -> "sm90", (10, 3) -> "sm103"."""
    return f"sm{major}{minor}"


def arch_of(major: int, minor: int) -> str | None:
    return _ARCH_BY_CC.get((major, minor)) or _ARCH_BY_CC.get((major, None))


def compute_capability_from_name(name: str) -> str | None:
    for pattern, cc in _CC_BY_NAME:
        if re.search(pattern, name, re.IGNORECASE):
            return cc
    return None


def identify(compute_cap: str | None, name: str | None) -> GpuArch:
    """The SM and architecture of one GPU: from ``compute_cap`` when reported, else from its name."""
    parsed = parse_compute_capability(compute_cap)
    source = "compute_cap"
    if parsed is None and name:
        guessed = compute_capability_from_name(name)
        parsed = parse_compute_capability(guessed)
        source = "name"
    if parsed is None:
        return GpuArch(None, None, None, "unknown")
    major, minor = parsed
    return GpuArch(f"{major}.{minor}", sm_of(major, minor), arch_of(major, minor), source)
