"""The GPU a gate is judged for: a compute capability (and the CUDA version), read from the text
hosts and operators write ("12.0", "sm120", "SM_90")."""

from __future__ import annotations

import re
from gpuops.frozen import frozen


@frozen
class GpuTarget:
    """The GPU a gate is judged for: its compute capability and CUDA version (not a device as
    nvidia-smi reports it: that is ``gpuops.facts.gpu.Gpu``)."""

    major: int
    minor: int
    cuda: tuple[int, int] | None = None

    @property
    def sm(self) -> str:
        return f"sm{self.major}{self.minor}"


def parse_capability(text: str | None) -> tuple[int, int] | None:
    """``"12.0"``, ``"12"``, ``"sm120"``, ``"SM_90"`` -> (major, minor); None when unreadable."""
    if text is None:
        return None
    value = str(text).strip().lower().replace("sm_", "sm")
    match = re.fullmatch(r"(\d+)\.(\d+)", value)
    if match:
        return int(match.group(1)), int(match.group(2))
    match = re.fullmatch(r"(?:sm)?(\d{2,3})", value)
    if match:
        major, minor = divmod(int(match.group(1)), 10)
        return major, minor
    return None


def parse_cuda(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    match = re.match(r"\s*(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def make_gpu(compute_capability: str | None, cuda_version: str | None) -> GpuTarget | None:
    cc = parse_capability(compute_capability)
    if cc is None:
        return None
    return GpuTarget(cc[0], cc[1], parse_cuda(cuda_version))
