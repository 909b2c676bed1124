"""The interconnect fact, whole: `nvidia-smi topo -m` (how GPUs are linked) and `topo -p2p r` (can
they peer); its probes, parsers, summary, JSON shape and human rendering.

Probes (nvidia-smi calls run side by side with the GPU fact's: ``facts/smi_command.py``):

``gpu.topo``  ``nvidia-smi topo -m``       -> ``TopologyMatrix``
``gpu.p2p``   ``nvidia-smi topo -p2p r``   -> ``P2PMatrix``

Both summarised into ``Interconnect`` (``from_values``). Recorded outputs and the values they
parse to: ``tests/facts/<probe>/<case>.json``; JSON keys: docs/inspect-json.md (``interconnect``).

On a two-socket PCIe box (the RTX PRO 6000 story) GPUs on different sockets often cannot do
peer-to-peer at all ("CNS", chipset not supported). IPC-based all-reduce (SGLang's custom
all-reduce, FlashInfer's IPC fusion kernels) needs P2P between every pair of ranks, so that is
worth a warning before anyone benchmarks a tensor-parallel setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import field
from typing import TypedDict

from gpuops.facts.smi_command import failure_reason, smi_probe, strip_ansi
from gpuops.gather import Probe, ProbeOutput, value_or_unknown
from gpuops.frozen import frozen

TOPO_PROBE, P2P_PROBE = "gpu.topo", "gpu.p2p"
# probe -> nvidia-smi arguments (the lab's fake nvidia-smi answers the same, tests/facts replay it)
SMI_ARGS: dict[str, tuple[str, ...]] = {
    TOPO_PROBE: ("topo", "-m"),
    P2P_PROBE: ("topo", "-p2p", "r"),
}

# What each `topo -m` link code means, nearest first.
LINK_KINDS: dict[str, str] = {
    "X": "self",
    "NV": "NVLink (a bonded set of links)",
    "PIX": "PCIe, at most one bridge",
    "PXB": "PCIe, several bridges, no host bridge",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe between host bridges within a NUMA node",
    "SYS": "PCIe plus the inter-socket link (QPI/UPI/xGMI)",
    "SOC": "PCIe plus the inter-socket link (older name for SYS)",
}

P2P_STATUS: dict[str, str] = {
    "X": "self",
    "OK": "OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}

_DEVICE_RE = re.compile(r"^(GPU|NIC)\d+$")
_NVLINK_RE = re.compile(r"^NV(\d+)$")


@frozen
class GpuAffinity:
    """A GPU's CPU and NUMA affinity, from the last columns of its ``topo -m`` row."""

    cpu_affinity: str | None  # "0-31,64-95"
    numa_node: str | None  # "0"; "0-1" on some boxes; None when N/A


@frozen
class TopologyMatrix:
    """`nvidia-smi topo -m`: link code between every pair of devices, and each GPU's affinity."""

    known: bool
    reason: str | None = None
    devices: tuple[str, ...] = ()  # column order: "GPU0", ..., "NIC0", ...
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # row -> column -> "NODE"
    affinity: dict[str, GpuAffinity] = field(default_factory=dict)  # "GPU0" -> affinity


@frozen
class P2PMatrix:
    """`nvidia-smi topo -p2p r`: peer-to-peer read status between every pair of GPUs."""

    known: bool
    reason: str | None = None
    gpus: tuple[str, ...] = ()
    status: dict[str, dict[str, str]] = field(default_factory=dict)


@frozen
class Interconnect:
    """How the host's GPUs are linked and whether each pair can peer (``topo -m`` and ``topo -p2p r`` summarised
    by ``from_values``), with the warnings worth giving before a tensor-parallel run."""

    known: bool
    reason: str | None
    nvlink: bool | None  # any NVLink between two GPUs
    link_counts: dict[str, int]  # link kind -> number of GPU pairs ("NV" kinds kept as "NV18" etc.)
    matrix: dict[str, dict[str, str]]  # GPU x GPU link codes
    numa: dict[str, GpuAffinity]
    p2p_known: bool
    p2p_reason: str | None
    p2p_all_pairs: bool | None
    p2p_matrix: dict[str, dict[str, str]]
    p2p_failed_pairs: tuple[tuple[str, str, str], ...]  # (GPUa, GPUb, status)
    warnings: tuple[str, ...]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in strip_ansi(line).rstrip("\n").split("\t")]


def parse_topo_text(text: str) -> TopologyMatrix:
    """Parse the matrix part of `topo -m` (everything before "Legend:")."""
    lines = [line for line in text.splitlines()]
    header_index = next(
        (i for i, line in enumerate(lines) if any(_DEVICE_RE.match(c) for c in _cells(line)) and _cells(line)[0] == ""),
        None,
    )
    if header_index is None:
        return TopologyMatrix(known=False, reason="no GPU matrix in `nvidia-smi topo -m` output")
    header = _cells(lines[header_index])[1:]
    devices = tuple(c for c in header if _DEVICE_RE.match(c))
    trailing = [c for c in header[len(devices):] if c]  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, GpuAffinity] = {}
    for line in lines[header_index + 1:]:
        cells = _cells(line)
        if not cells or not cells[0]:
            if links:
                break  # the blank line before "Legend:" ends the matrix
            continue
        if cells[0].startswith("Legend") or cells[0].startswith("NIC Legend"):
            break
        label = cells[0]
        if not _DEVICE_RE.match(label):
            continue
        values = cells[1:]
        links[label] = {device: values[i] for i, device in enumerate(devices) if i < len(values)}
        if label.startswith("GPU"):
            # The real tool leaves an empty cell before "GPU NUMA ID": match non-empty cells in order.
            extra = dict(zip(trailing, [v for v in values[len(devices):] if v]))
            numa = extra.get("NUMA Affinity")
            affinity[label] = GpuAffinity(
                cpu_affinity=None if extra.get("CPU Affinity") in (None, "N/A") else extra["CPU Affinity"],
                numa_node=None if numa in (None, "N/A") else numa,
            )
    if not links:
        return TopologyMatrix(known=False, reason="`nvidia-smi topo -m` printed a header but no rows")
    return TopologyMatrix(known=True, devices=devices, links=links, affinity=affinity)


def parse_p2p_text(text: str) -> P2PMatrix:
    lines = text.splitlines()
    header_index = next(
        (i for i, line in enumerate(lines) if [c for c in _cells(line) if c] and all(_DEVICE_RE.match(c) for c in _cells(line) if c)),
        None,
    )
    if header_index is None:
        return P2PMatrix(known=False, reason="no GPU matrix in `nvidia-smi topo -p2p r` output")
    gpus = tuple(c for c in _cells(lines[header_index]) if c)
    status: dict[str, dict[str, str]] = {}
    for line in lines[header_index + 1:]:
        cells = [c for c in _cells(line) if c]
        if not cells or not _DEVICE_RE.match(cells[0]):
            break
        status[cells[0]] = {gpu: cells[1 + i] for i, gpu in enumerate(gpus) if 1 + i < len(cells)}
    if not status:
        return P2PMatrix(known=False, reason="`nvidia-smi topo -p2p r` printed a header but no rows")
    return P2PMatrix(known=True, gpus=gpus, status=status)


def parse_topo(out: ProbeOutput) -> TopologyMatrix:
    reason = failure_reason(out)
    return TopologyMatrix(known=False, reason=reason) if reason else parse_topo_text(out.stdout)


def parse_p2p(out: ProbeOutput) -> P2PMatrix:
    reason = failure_reason(out)
    return P2PMatrix(known=False, reason=reason) if reason else parse_p2p_text(out.stdout)


def _link_kind(code: str) -> str:
    return "NV" if _NVLINK_RE.match(code) else code


def _pairs(labels: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]


def _pair_list(pairs: list[tuple[str, str, str]], limit: int = 4) -> str:
    shown = ", ".join(f"{a}-{b} {s}" for a, b, s in pairs[:limit])
    return shown + (f", ... ({len(pairs)} pairs)" if len(pairs) > limit else "")


def summarize(topo: TopologyMatrix, p2p: P2PMatrix) -> Interconnect:
    """Combine both matrices into the interconnect facts, with warnings a TP setup should heed."""
    gpus = tuple(d for d in topo.devices if d.startswith("GPU")) if topo.known else p2p.gpus
    matrix = {g: {h: topo.links.get(g, {}).get(h, "?") for h in gpus} for g in gpus} if topo.known else {}
    counts: dict[str, int] = {}
    for a, b in _pairs(gpus) if topo.known else []:
        code = matrix[a][b]
        counts[code] = counts.get(code, 0) + 1
    nvlink = any(_link_kind(code) == "NV" for code in counts) if topo.known else None
    warnings: list[str] = []

    failed: list[tuple[str, str, str]] = []
    all_pairs: bool | None = None
    if p2p.known:
        for a, b in _pairs(p2p.gpus):
            ab = p2p.status.get(a, {}).get(b, "U")
            ba = p2p.status.get(b, {}).get(a, "U")
            if ab != "OK" or ba != "OK":
                failed.append((a, b, ab if ab != "OK" else ba))
        all_pairs = not failed
        if failed:
            total = len(_pairs(p2p.gpus))
            warnings.append(
                f"peer-to-peer is not possible between {len(failed)} of {total} GPU pairs "
                f"({_pair_list(failed)}; {', '.join(sorted({P2P_STATUS.get(s, s) + ' (' + s + ')' for _, _, s in failed}))}): "
                "IPC-based all-reduce (SGLang's custom all-reduce, FlashInfer's IPC all-reduce fusion) "
                "needs P2P between every pair of TP ranks, so a TP group spanning these pairs "
                "falls back to NCCL or fails; keep TP within a P2P group or expect NCCL all-reduce"
            )
    if topo.known:
        sys_pairs = [(a, b, matrix[a][b]) for a, b in _pairs(gpus) if matrix[a][b] in ("SYS", "SOC")]
        if sys_pairs:
            warnings.append(
                f"{len(sys_pairs)} GPU pairs cross the inter-socket link (SYS: {_pair_list(sys_pairs)}): "
                "all-reduce across them is bounded by the CPU interconnect"
            )
    return Interconnect(
        known=topo.known,
        reason=topo.reason,
        nvlink=nvlink,
        link_counts=counts,
        matrix=matrix,
        numa={g: topo.affinity[g] for g in gpus if g in topo.affinity},
        p2p_known=p2p.known,
        p2p_reason=p2p.reason,
        p2p_all_pairs=all_pairs,
        p2p_matrix={g: dict(p2p.status.get(g, {})) for g in p2p.gpus} if p2p.known else {},
        p2p_failed_pairs=tuple(failed),
        warnings=tuple(warnings),
    )


class NumaJSON(TypedDict):
    """One GPU's entry of ``interconnect.numa``: a ``GpuAffinity``."""

    cpu_affinity: str | None
    numa_node: str | None


class InterconnectJSON(TypedDict):
    """The ``interconnect`` key of the inspect document (``interconnect_json``)."""

    known: bool
    reason: str | None
    nvlink: bool | None
    link_counts: dict[str, int]
    matrix: dict[str, dict[str, str]]
    numa: dict[str, NumaJSON]
    p2p_known: bool
    p2p_reason: str | None
    p2p_all_pairs: bool | None
    p2p_matrix: dict[str, dict[str, str]]
    p2p_failed_pairs: list[list[str]]
    warnings: list[str]


def probes() -> list[Probe[object]]:
    return [smi_probe(TOPO_PROBE, SMI_ARGS[TOPO_PROBE], parse_topo), smi_probe(P2P_PROBE, SMI_ARGS[P2P_PROBE], parse_p2p)]


def from_values(values: Mapping[str, object]) -> Interconnect:
    """The interconnect fact from the parsed probe values (a failed probe: unknown, with its reason)."""
    topo = value_or_unknown(values, TOPO_PROBE, TopologyMatrix, lambda r: TopologyMatrix(known=False, reason=r))
    p2p = value_or_unknown(values, P2P_PROBE, P2PMatrix, lambda r: P2PMatrix(known=False, reason=r))
    return summarize(topo, p2p)


def interconnect_json(ic: Interconnect) -> InterconnectJSON:
    """The ``interconnect`` key of the inspect document (docs/inspect-json.md): only ever added to."""
    return {
        "known": ic.known,
        "reason": ic.reason,
        "nvlink": ic.nvlink,
        "link_counts": dict(ic.link_counts),
        "matrix": ic.matrix,
        "numa": {g: {"cpu_affinity": a.cpu_affinity, "numa_node": a.numa_node} for g, a in ic.numa.items()},
        "p2p_known": ic.p2p_known,
        "p2p_reason": ic.p2p_reason,
        "p2p_all_pairs": ic.p2p_all_pairs,
        "p2p_matrix": ic.p2p_matrix,
        "p2p_failed_pairs": [list(p) for p in ic.p2p_failed_pairs],
        "warnings": list(ic.warnings),
    }


def _gpu_ranges(labels: list[str]) -> str:
    """["GPU0", "GPU1", "GPU2", "GPU5"] -> "GPU0-2,5"."""
    numbers = sorted(int(label[3:]) for label in labels if label[3:].isdigit())
    spans: list[str] = []
    for n in numbers:
        if spans and spans[-1].split("-")[-1] == str(n - 1):
            spans[-1] = f"{spans[-1].split('-')[0]}-{n}"
        else:
            spans.append(str(n))
    return "GPU" + ",".join(spans) if spans else "-"


def interconnect_line(ic: InterconnectJSON) -> str:
    """The report's interconnect line, from ``interconnect_json``'s document."""
    if not ic["known"]:
        return f"unknown ({ic['reason']})"
    links = ", ".join(f"{kind} x{count}" for kind, count in sorted(ic["link_counts"].items()))
    nvlink = "NVLink" if ic["nvlink"] else "no NVLink"
    if ic["p2p_all_pairs"] is None:
        p2p = f"P2P unknown ({ic['p2p_reason']})"
    elif ic["p2p_all_pairs"]:
        p2p = "P2P between all GPU pairs"
    else:
        p2p = f"P2P NOT between all pairs ({len(ic['p2p_failed_pairs'])} pairs fail)"
    return f"{nvlink}; {links or 'single GPU'}; {p2p}"


def numa_line(ic: InterconnectJSON) -> str | None:
    """GPUs by NUMA node ("GPU0-3 on node 0; GPU4-7 on node 1"), or None when unknown."""
    nodes: dict[str, list[str]] = {}
    for gpu, affinity in ic["numa"].items():
        nodes.setdefault(affinity["numa_node"] or "N/A", []).append(gpu)
    if not nodes:
        return None
    return "; ".join(f"{_gpu_ranges(gpus)} on node {node}" for node, gpus in sorted(nodes.items()))
