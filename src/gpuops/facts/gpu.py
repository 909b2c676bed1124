"""GPU facts: what `nvidia-smi --query-gpu ... --format=csv` and the `nvidia-smi` banner say."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from gpuops.facts.arch import identify
from gpuops.facts.nvidia_smi import failure_reason
from gpuops.gather import ProbeOutput

_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")  # "memory.total [MiB]" -> "memory.total"
_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_CUDA_RE = re.compile(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)")
_DRIVER_RE = re.compile(r"Driver Version\s*:\s*([0-9][0-9.]*)")
_NVRM_RE = re.compile(r"NVRM version:.*?\s([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)\s")
_PROC_FILE_RE = re.compile(r"^== (\S+)$", re.M)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str | None
    compute_capability: str | None  # "12.0"
    sm: str | None  # "sm120"
    arch: str | None  # "Blackwell"
    sm_source: str  # "compute_cap" | "name" | "unknown"
    memory_total_mib: int | None
    memory_used_mib: int | None
    driver_version: str | None
    pci_bus_id: str | None
    pcie_gen: int | None
    pcie_width: int | None
    power_limit_w: float | None
    clocks_max_sm_mhz: int | None


@dataclass(frozen=True)
class GpuQuery:
    """The parsed ``--query-gpu`` table (or the driver's /proc listing), or why there is none."""

    known: bool
    reason: str | None = None
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    source: str = "nvidia-smi"  # "nvidia-smi" | "procfs" (/proc/driver/nvidia, no nvidia-smi)
    note: str | None = None  # caveats of a known answer (e.g. compute capability guessed from names)


@dataclass(frozen=True)
class SmiBanner:
    """Driver and CUDA (driver API) versions from the plain `nvidia-smi` banner."""

    known: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None


def _missing(value: str | None) -> bool:
    # nvidia-smi writes "[N/A]", "N/A" or "[Not Supported]" for fields a GPU or driver lacks.
    return value is None or not value.strip() or value.strip().strip("[]").lower() in ("n/a", "not supported", "unknown error")


def _text(value: str | None) -> str | None:
    return None if _missing(value) else value.strip()


def _number(value: str | None) -> float | None:
    if _missing(value):
        return None
    match = _NUMBER_RE.match(value or "")
    return float(match.group(1)) if match else None


def _int(value: str | None) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def parse_query_csv(text: str) -> tuple[Gpu, ...]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv`` (header included), by header name.

    Columns are looked up by name, not position, so an older nvidia-smi that lacks a field (or a
    reordered query) still parses; a missing ``compute_cap`` falls back to the GPU's name.
    """
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return ()
    header = [_UNIT_RE.sub("", cell).strip() for cell in rows[0]]
    gpus: list[Gpu] = []
    for position, row in enumerate(rows[1:]):
        if not any(cell.strip() for cell in row):
            continue
        cells = dict(zip(header, (cell.strip() for cell in row)))
        name = cells.get("name") or "unknown GPU"
        what = identify(cells.get("compute_cap"), name)
        index = _int(cells.get("index"))
        gpus.append(
            Gpu(
                index=index if index is not None else position,
                name=name,
                uuid=_text(cells.get("uuid")),
                compute_capability=what.compute_capability,
                sm=what.sm,
                arch=what.arch,
                sm_source=what.source,
                memory_total_mib=_int(cells.get("memory.total")),
                memory_used_mib=_int(cells.get("memory.used")),
                driver_version=_text(cells.get("driver_version")),
                pci_bus_id=_text(cells.get("pci.bus_id")),
                pcie_gen=_int(cells.get("pcie.link.gen.max")),
                pcie_width=_int(cells.get("pcie.link.width.max")),
                power_limit_w=_number(cells.get("power.limit")),
                clocks_max_sm_mhz=_int(cells.get("clocks.max.sm")),
            )
        )
    return tuple(gpus)


def parse_query(out: ProbeOutput) -> GpuQuery:
    reason = failure_reason(out)
    if reason:
        return GpuQuery(known=False, reason=reason)
    gpus = parse_query_csv(out.stdout)
    if not gpus:
        return GpuQuery(known=False, reason="nvidia-smi listed no GPUs")
    return GpuQuery(known=True, gpus=gpus)


def parse_banner_text(text: str) -> SmiBanner:
    """``Driver Version: 580.159.04     CUDA Version: 13.0`` from `nvidia-smi` (or `nvidia-smi -q`)."""
    cuda = _CUDA_RE.search(text)
    driver = _DRIVER_RE.search(text)
    if not cuda and not driver:
        return SmiBanner(known=False, reason="no driver or CUDA version in nvidia-smi's banner")
    return SmiBanner(
        known=True,
        driver_version=driver.group(1) if driver else None,
        cuda_driver_version=cuda.group(1) if cuda else None,
    )


def parse_banner(out: ProbeOutput) -> SmiBanner:
    reason = failure_reason(out)
    if reason:
        return SmiBanner(known=False, reason=reason)
    return parse_banner_text(out.stdout)



def parse_procfs(text: str, smi_reason: str | None) -> tuple[GpuQuery, SmiBanner]:
    """GPUs as the kernel driver lists them (``/proc/driver/nvidia``), for hosts without nvidia-smi.

    Gives names, UUIDs and bus ids but no compute capability: that is guessed from the name and
    marked so (``sm_source: "name"``). The driver version comes from ``version``.
    """
    chunks = _PROC_FILE_RE.split(text)
    files = {chunks[i]: chunks[i + 1] for i in range(1, len(chunks) - 1, 2)}
    nvrm = _NVRM_RE.search(files.get("/proc/driver/nvidia/version", ""))
    driver = nvrm.group(1) if nvrm else None
    gpus: list[Gpu] = []
    for path, body in sorted((p, b) for p, b in files.items() if p.endswith("/information")):
        info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in body.splitlines()) if k.strip()}
        name = info.get("Model") or "unknown GPU"
        what = identify(None, name)
        minor = _int(info.get("Device Minor"))
        gpus.append(Gpu(
            index=minor if minor is not None else len(gpus), name=name, uuid=_text(info.get("GPU UUID")),
            compute_capability=what.compute_capability, sm=what.sm, arch=what.arch, sm_source=what.source,
            memory_total_mib=None, memory_used_mib=None, driver_version=driver,
            pci_bus_id=_text(info.get("Bus Location")), pcie_gen=None, pcie_width=None,
            power_limit_w=None, clocks_max_sm_mhz=None,
        ))
    gpus.sort(key=lambda g: g.index)
    banner = SmiBanner(known=driver is not None, reason=f"{smi_reason}; CUDA version unknown", driver_version=driver)
    if not gpus:
        return GpuQuery(known=False, reason=f"{smi_reason}; the driver lists no GPUs in /proc/driver/nvidia"), banner
    note = ("nvidia-smi is not on PATH, but the loaded NVIDIA driver lists these GPUs in /proc/driver/nvidia; "
            "compute capability guessed from their names")
    return GpuQuery(known=True, gpus=tuple(gpus), source="procfs", note=note), banner
