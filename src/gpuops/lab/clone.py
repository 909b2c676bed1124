"""``gpuops lab clone HOST``: a lab host shaped like a real one.

The real host's facts (one gather exec, the same as ``gpuops inspect``) become a GPU description:
its GPUs, topology, P2P matrix, driver/CUDA versions, the installed torch/flashinfer/sgl-kernel/NCCL
versions, and the SGLang server's flags and NCCL/SGLang environment. The lab host then gets the
same SGLang release's real source. ``description_from_facts`` is pure (facts JSON in, YAML data out).
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from gpuops.errors import GpuopsError
from gpuops.inspection import inspect_host
from gpuops.facts.to_json import facts_json
from gpuops.remote.sglang_argv import launch_args
from gpuops.inventory import load_inventory
from gpuops.lab.hosts import LAB_RECORD, LabSpec, relabel_gpu, start_lab
from gpuops.secret_policy import is_secret_name
from gpuops.transport import ConnectOptions

# Server environment worth copying; anything the secrets policy calls a credential never is.
_ENV_PREFIXES = ("NCCL_", "SGLANG_", "CUDA_", "TORCH_", "PYTORCH_", "FLASHINFER_", "NVSHMEM_", "OMP_")
_TOPO_CELL = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV[0-9]+)$")
_P2P_CELL = {"X", "OK", "CNS", "GNS", "TNS", "NS", "U"}


def description_from_facts(facts: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A GPU description (the YAML data of gpuops.lab.gpu_description) of a host's facts JSON."""
    gpus = facts.get("gpus") or []
    if not gpus:
        raise GpuopsError(f"lab clone: {source}: no GPU facts ({(facts.get('gpu_status') or {}).get('reason')})")
    desc: dict[str, Any] = {
        "description": f"clone of {source} (from its facts)",
        "gpus": [
            {
                "gpu_name": g.get("name") or "Unknown GPU",
                "compute_capability": g.get("compute_capability") or "0.0",
                "memory_mib": int(g.get("memory_total_mib") or 0),
                "memory_used_mib": int(g.get("memory_used_mib") or 0),
                "power_limit_w": float(g.get("power_limit_w") or 0),
                "clocks_max_sm_mhz": int(g.get("clocks_max_sm_mhz") or 0),
                "pcie_gen_max": int(g.get("pcie_gen") or 0),
                "pcie_width_max": int(g.get("pcie_width") or 0),
            }
            for g in gpus
        ],
        "uuids": [str(g.get("uuid") or f"GPU-{i:08x}-0000-0000-0000-000000000000") for i, g in enumerate(gpus)],
        "pci_bus_ids": [str(g.get("pci_bus_id") or f"00000000:{i:02X}:00.0") for i, g in enumerate(gpus)],
        "driver_version": facts.get("driver_version") or gpus[0].get("driver_version") or "unknown",
        "cuda_driver_version": facts.get("cuda_driver_version") or "unknown",
    }
    desc.update(_interconnect(facts.get("interconnect") or {}, len(gpus)))
    desc["packages"] = _packages(facts.get("software") or {})
    server = _server(facts.get("server") or {})
    if server is not None:
        desc["server"] = server
    return desc


def _names(count: int) -> list[str]:
    return [f"GPU{i}" for i in range(count)]


def _interconnect(ic: Mapping[str, Any], count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = _names(count)
    numa = ic.get("numa") or {}
    nodes: dict[int, list[int]] = {}
    affinity: dict[int, str] = {}
    for i, name in enumerate(names):
        entry = numa.get(name) or {}
        node_text = str(entry.get("numa_node", "0"))
        node = int(node_text) if node_text.isdigit() else 0
        nodes.setdefault(node, []).append(i)
        if entry.get("cpu_affinity"):
            affinity[node] = str(entry["cpu_affinity"])
    out["numa_nodes"] = nodes
    if affinity:
        out["cpu_affinity"] = affinity
    matrix = _matrix(ic.get("matrix"), names, lambda c: bool(_TOPO_CELL.match(c)))
    if matrix:
        out["topology"] = matrix
    p2p = _matrix(ic.get("p2p_matrix"), names, lambda c: c in _P2P_CELL)
    if p2p:
        out["p2p_read"] = p2p
    counts = [c for c in (ic.get("link_counts") or {}) if str(c).startswith("NV")]
    if ic.get("nvlink") and counts:
        links = max(int(str(c)[2:]) for c in counts if str(c)[2:].isdigit())
        out["nvlink"] = {"links": links, "gbps": 26.562}
    return out


def _matrix(raw: Any, names: list[str], valid: Callable[[str], bool]) -> list[str] | None:
    if not isinstance(raw, dict):
        return None
    rows = []
    for row_name in names:
        row = raw.get(row_name)
        if not isinstance(row, dict):
            return None
        cells = [str(row.get(col, "")).strip() for col in names]
        if not all(valid(c) for c in cells):
            return None
        rows.append(" ".join(cells))
    return rows


def _packages(software: Mapping[str, Any]) -> dict[str, str]:
    packages: dict[str, str] = {}
    for key, dist in (("sglang", "sglang"), ("flashinfer", "flashinfer-python"), ("sgl_kernel", "sgl-kernel"),
                      ("sglang_kernel", "sglang-kernel"), ("torch", "torch")):
        info = software.get(key)
        if isinstance(info, dict) and info.get("version"):
            packages[dist] = str(info["version"])
    nccl = software.get("nccl")
    if isinstance(nccl, dict) and nccl.get("version"):
        source = str(nccl.get("source") or "")
        packages[source if source.startswith("nvidia-nccl-") else "nvidia-nccl-cu12"] = str(nccl["version"])
    return packages


def _server(server: Mapping[str, Any]) -> dict[str, Any] | None:
    # The flags after the launch however it is spelled (-m sglang.launch_server, sglang serve: the
    # entrypoint a release recommends, which gpuops launches where the release has it).
    launched = launch_args([str(a) for a in server.get("argv") or []])
    if launched is None:
        return None
    args = list(launched)
    env = {
        str(k): str(v)
        for k, v in (server.get("env") or {}).items()
        if str(k).startswith(_ENV_PREFIXES) and not is_secret_name(str(k)) and "<masked:" not in str(v)
    }
    out: dict[str, Any] = {"cmdline": "python3 -m sglang.launch_server " + shlex.join(args), "env": env}
    if server.get("port"):
        out["port"] = int(server["port"])
    return out


def describe_host(inventory: str | None, host_name: str, say: Callable[[str], None] | None = None,
                  command: str = "lab describe") -> tuple[Any, dict[str, Any]]:
    """Gather HOST's facts (one exec, as `inspect`) and turn them into a GPU description."""

    selected = load_inventory(inventory).select(host_name)
    host = selected[0] if selected else None
    if host is None:
        raise GpuopsError(f"{command}: no host {host_name!r} in the inventory")
    (say or (lambda _msg: None))(f"gathering the facts of {host.name}")
    # Host keys are verified as for any command (the transport honours gpuops_known_hosts).
    facts = facts_json(inspect_host(host, ConnectOptions(), with_gates=False).facts)
    return host, description_from_facts(facts, host.name)


def description_text(data: Mapping[str, Any], source: str) -> str:
    """The YAML file ``gpuops lab describe`` writes, with a header saying what it is."""
    import yaml

    header = (f"# GPU description of {source} for a gpuops lab host (gpuops lab describe), from its facts.\n"
              "# Every key: docs/lab-host-description.md. Use: gpuops lab up --gpu THIS_FILE\n")
    return header + yaml.safe_dump(dict(data), sort_keys=False)


def clone_host(
    root: Path | str,
    inventory: str | None,
    host_name: str,
    name: str | None = None,
    server: bool = True,
    progress: Callable[[str], None] | None = None,
):
    """Gather HOST's facts, describe it, and start a lab host from that description."""
    import yaml

    say = progress or (lambda _msg: None)
    root = Path(root).expanduser().absolute()
    host, data = describe_host(inventory, host_name, say, "lab clone")
    sglang = (data.get("packages") or {}).get("sglang")
    lab_name = name or re.sub(r"[^A-Za-z0-9_.-]", "-", f"{host.name}-lab")
    with tempfile.TemporaryDirectory() as tmp:
        desc_file = Path(tmp) / f"{lab_name}.yaml"
        desc_file.write_text(yaml.safe_dump(data, sort_keys=False))
        spec = LabSpec(gpu=str(desc_file), sglang=sglang, server=server and "server" in data, names=(lab_name,))
        say(f"starting {lab_name} (SGLang {sglang or 'not installed'}, {len(data['gpus'])} GPU(s))")
        lab = start_lab(root, [spec], add=(root / LAB_RECORD).exists(), progress=progress)
        kept = root / lab_name / "gpu-description.yaml"
        shutil.copyfile(desc_file, kept)
    # The description outlives the temp dir inside the host's own dir: record that path.
    return relabel_gpu(lab, lab_name, str(kept))
