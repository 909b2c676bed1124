"""The GPU fact, whole: its probes, parsers, JSON shape and human rendering.

Probes (each one nvidia-smi call, run side by side: ``facts/smi_command.py``):

``gpu.query``   ``nvidia-smi --query-gpu=QUERY_FIELDS --format=csv``   -> ``GpuQuery``
``gpu.banner``  ``nvidia-smi``                                         -> ``SmiBanner``
``gpu.procfs``  ``/proc/driver/nvidia`` when nvidia-smi is missing      -> its text (or None)

Recorded outputs and the values they parse to: ``tests/facts/<probe>/<case>.json``. The JSON keys
(``gpu_json``) are documented in docs/inspect-json.md; ``render.py`` prints ``gpu_rows``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import field
from typing import TypedDict

from gpuops.facts.arch import identify
from gpuops.facts.smi_command import failure_reason, smi_probe
from gpuops.gather import Probe, ProbeOutput, value_or_unknown
from gpuops.frozen import frozen

QUERY_PROBE, BANNER_PROBE, PROCFS_PROBE = "gpu.query", "gpu.banner", "gpu.procfs"
# The query's field list is the one the fixtures were captured with.
QUERY_FIELDS = (
    "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm"
)
# probe -> nvidia-smi arguments (the lab's fake nvidia-smi answers the same, tests/facts replay it)
SMI_ARGS: dict[str, tuple[str, ...]] = {
    QUERY_PROBE: (f"--query-gpu={QUERY_FIELDS}", "--format=csv"),
    BANNER_PROBE: (),
}

_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")  # "memory.total [MiB]" -> "memory.total"
_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_CUDA_RE = re.compile(r"CUDA Version\s*:\s*([0-9]+\.[0-9]+)")
_DRIVER_RE = re.compile(r"Driver Version\s*:\s*([0-9][0-9.]*)")
_NVRM_RE = re.compile(r"NVRM version:.*?\s([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)\s")
_PROC_FILE_RE = re.compile(r"^== (\S+)$", re.M)


@frozen
class Gpu:
    """One GPU as nvidia-smi's query reports it (or the driver's /proc listing, with fewer fields), with its SM
    and architecture identified (``sm_source`` says from what)."""

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


@frozen
class GpuQuery:
    """The parsed ``--query-gpu`` table (or the driver's /proc listing), or why there is none."""

    known: bool
    reason: str | None = None
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    source: str = "nvidia-smi"  # "nvidia-smi" | "procfs" (/proc/driver/nvidia, no nvidia-smi)
    note: str | None = None  # caveats of a known answer (e.g. compute capability guessed from names)


@frozen
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
    return None if value is None or _missing(value) else value.strip()


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


def parse_procfs_output(out: ProbeOutput) -> str | None:
    """The ``gpu.procfs`` probe: the driver's listing, kept as text (``parse_procfs`` reads it once
    the query says why nvidia-smi gave nothing); None where there is none."""
    return out.stdout if out.stdout.strip() else None


# No nvidia-smi (a container without the tools, a broken install): the kernel driver may still
# list its GPUs under /proc/driver/nvidia; ship that instead. Prints nothing when nvidia-smi is there.
PROCFS_SCRIPT = (
    "if ! command -v nvidia-smi >/dev/null 2>&1 && [ -r /proc/driver/nvidia/version ]; then\n"
    "  for gpuops_f in /proc/driver/nvidia/version /proc/driver/nvidia/gpus/*/information; do\n"
    "    [ -r \"$gpuops_f\" ] && { printf '== %s\\n' \"$gpuops_f\"; cat \"$gpuops_f\"; }\n"
    "  done\n"
    "fi\n"
    "exit 0"
)


class GpuStatusJSON(TypedDict):
    """``gpu_status``: whether the GPUs are known, and from where."""

    known: bool
    reason: str | None
    source: str
    note: str | None


class GpuEntryJSON(TypedDict):
    """One element of ``gpus``: a ``Gpu``, key for key in its field order."""

    index: int
    name: str
    uuid: str | None
    compute_capability: str | None
    sm: str | None
    arch: str | None
    sm_source: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    driver_version: str | None
    pci_bus_id: str | None
    pcie_gen: int | None
    pcie_width: int | None
    power_limit_w: float | None
    clocks_max_sm_mhz: int | None


class GpuPartJSON(TypedDict):
    """The GPU keys of the inspect document (``gpu_json``), at its top level."""

    gpu_status: GpuStatusJSON
    gpu_count: int
    gpus: list[GpuEntryJSON]
    compute_capability: str | None
    sm: str | None
    arch: str | None
    driver_version: str | None
    cuda_driver_version: str | None
    cuda_driver_reason: str | None


def gpu_entry_json(g: Gpu) -> GpuEntryJSON:
    return GpuEntryJSON(
        index=g.index, name=g.name, uuid=g.uuid, compute_capability=g.compute_capability, sm=g.sm, arch=g.arch,
        sm_source=g.sm_source, memory_total_mib=g.memory_total_mib, memory_used_mib=g.memory_used_mib,
        driver_version=g.driver_version, pci_bus_id=g.pci_bus_id, pcie_gen=g.pcie_gen, pcie_width=g.pcie_width,
        power_limit_w=g.power_limit_w, clocks_max_sm_mhz=g.clocks_max_sm_mhz,
    )


def probes() -> list[Probe[object]]:
    return [
        smi_probe(QUERY_PROBE, SMI_ARGS[QUERY_PROBE], parse_query),
        smi_probe(BANNER_PROBE, SMI_ARGS[BANNER_PROBE], parse_banner),
        Probe(PROCFS_PROBE, PROCFS_SCRIPT, parse_procfs_output),
    ]


def from_values(values: Mapping[str, object]) -> tuple[GpuQuery, SmiBanner]:
    """The GPU fact from the parsed probe values (a probe that failed: unknown, with its reason)."""
    query = value_or_unknown(values, QUERY_PROBE, GpuQuery, lambda r: GpuQuery(known=False, reason=r))
    banner = value_or_unknown(values, BANNER_PROBE, SmiBanner, lambda r: SmiBanner(known=False, reason=r))
    procfs = values.get(PROCFS_PROBE)
    if not query.known and isinstance(procfs, str):
        query, banner = parse_procfs(procfs, query.reason)
    return query, banner


def lowest_compute_capability(query: GpuQuery) -> str | None:
    """The compute capability gates are judged against: the lowest of the host's GPUs."""
    caps = [g.compute_capability for g in query.gpus if g.compute_capability]
    return min(caps, key=lambda c: tuple(int(p) for p in c.split("."))) if caps else None


def gpu_json(query: GpuQuery, banner: SmiBanner) -> GpuPartJSON:
    """The GPU keys of the inspect document (docs/inspect-json.md): only ever added to."""
    first = query.gpus[0] if query.gpus else None
    compute_capability = lowest_compute_capability(query)
    lowest = next((g for g in query.gpus if g.compute_capability == compute_capability), first)
    return {
        "gpu_status": {"known": query.known, "reason": query.reason, "source": query.source, "note": query.note},
        "gpu_count": len(query.gpus),
        "gpus": [gpu_entry_json(g) for g in query.gpus],
        "compute_capability": compute_capability,
        "sm": lowest.sm if lowest else None,
        "arch": lowest.arch if lowest else None,
        "driver_version": banner.driver_version or (first.driver_version if first else None),
        "cuda_driver_version": banner.cuda_driver_version,
        "cuda_driver_reason": None if banner.cuda_driver_version else (banner.reason or "not reported"),
    }


GPU_HEADERS = ["#", "name", "cc", "sm", "arch", "memory", "pcie"]


def gpu_heading(doc: GpuPartJSON) -> str:
    """The report's GPU line, from the inspect document (``gpu_json``'s keys)."""
    if not doc["gpu_status"]["known"]:
        return f"GPUs: unknown ({doc['gpu_status']['reason']})"
    return f"GPUs ({doc['gpu_count']}): driver {doc['driver_version'] or '?'}, CUDA {doc['cuda_driver_version'] or '?'}"


def gpu_rows(doc: GpuPartJSON) -> list[list[object]]:
    """One table row per GPU (``GPU_HEADERS``), from the inspect document."""
    rows: list[list[object]] = []
    for g in doc["gpus"]:
        pcie = f"Gen{g['pcie_gen']} x{g['pcie_width']}" if g.get("pcie_gen") else "?"
        sm = g["sm"] or "?"
        if g.get("sm_source") == "name":
            sm += " (from name)"
        rows.append([g["index"], g["name"], g["compute_capability"] or "?", sm, g["arch"] or "?",
                     f"{g['memory_total_mib']} MiB" if g.get("memory_total_mib") else "?", pcie])
    return rows


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
    for _path, body in sorted((p, b) for p, b in files.items() if p.endswith("/information")):
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
