"""GPU descriptions for simulated lab hosts: load a YAML file, check it, expand it for the replayer.

A description is the shape of ``tests/fixtures/synthetic/.../host.yaml`` (that file is a
valid description as it stands) plus optional keys for what the replaying ``nvidia-smi`` prints:

``gpus``                 number of GPUs, or a list of per-GPU mappings overriding the keys below
``gpu_name``             e.g. ``NVIDIA H200``                                 (required)
``compute_capability``   ``"major.minor"``, e.g. ``"12.0"``                   (required)
``memory_mib``           total memory per GPU                                 (required)
``driver_version``, ``cuda_driver_version``                                   (required)
``memory_used_mib`` (0), ``power_limit_w`` (700), ``power_draw_w`` (100), ``clocks_max_sm_mhz``
(1980), ``temperature_c`` (35), ``pcie_gen_max`` (5), ``pcie_width_max`` (16), ``pcie_gen_current``
and ``pcie_width_current`` (the max), ``pci_bus_ids`` (list), ``uuids`` (list)
``numa_nodes``           ``{node: [gpu indices]}`` (default: all on node 0)
``cpu_affinity``         ``{node: "0-31,64-95"}``
``nvlink``               ``{links: 18, gbps: 26.562}``: every pair ``NV<links>``, p2p OK
``topology``             explicit ``topo -m`` matrix: a list of rows like ``"X NODE SYS"``
``p2p_read``             explicit ``topo -p2p r`` matrix, same shape (default: derived)
``fail``                 ``driver``: every call fails like a host whose driver is not loaded
``captured``             ``{smi|smi_q|smi_q_xml|topo|p2p|nvlink: file}`` replayed byte for byte
``packages``             ``{dist name: version}`` shown as installed (``sglang`` picks the source)
``server``               ``{cmdline, env, port}``: the SGLang server the host runs at first

Loading is pure apart from reading the file(s); errors name the file and the problem.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Mapping

from gpuops.errors import GpuopsError
from gpuops.remote.sglang_argv import flag_value, launch_args, parse_flags, with_flag
from gpuops.yamlfile import load_yaml_file
from gpuops.frozen import frozen

BUILTIN_DIR = Path(__file__).parent / "gpus"
NO_GPU = "none"

_CAPTURE_KEYS = ("smi", "smi_q", "smi_q_xml", "topo", "p2p", "nvlink")
_FAILURES = ("driver",)
_P2P_STATES = {"X", "OK", "CNS", "GNS", "TNS", "NS", "U"}
_TOPO_STATE = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV[0-9]+)$")
_CC = re.compile(r"^[0-9]+\.[0-9]+$")
_DEFAULT_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_MAX_GPUS = 64
_DOC = " (docs/lab-host-description.md)"
# A valid value of each required field, shown when one is missing or wrong.
_EXAMPLES = {"gpu_name": "NVIDIA H100 80GB HBM3", "driver_version": "570.133.20", "cuda_driver_version": "12.8",
             "memory_mib": 81559, "power_limit_w": 700}


@frozen
class ServerSpec:
    """The SGLang server a lab host starts with: launch flags (after ``-m sglang.launch_server``)."""

    args: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    # The served model's Hugging Face config.json (architectures, hidden_size, ...): the lab writes
    # it into the host's own models/ dir and points --model-path there, so facts, gate clauses
    # (model architecture) and the all-reduce sizes (hidden size) see a real config file.
    model_config: Mapping[str, Any] | None = None


@frozen
class GpuDescription:
    """A checked description. ``replay`` is the JSON document the host's ``nvidia-smi`` reads."""

    name: str
    path: Path
    replay: Mapping[str, Any]
    packages: Mapping[str, str]
    server: ServerSpec | None
    compute_capability: str
    gpu_count: int


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def description_path(gpu: str) -> Path | None:
    """A builtin name or a path to a YAML file; ``none`` means a host without nvidia-smi."""
    if gpu == NO_GPU:
        return None
    if gpu in builtin_names():
        return BUILTIN_DIR / f"{gpu}.yaml"
    path = Path(gpu).expanduser()
    if not path.is_file():
        names = ", ".join(builtin_names() + [NO_GPU])
        raise GpuopsError(f"gpu description {gpu!r}: no such file (builtin: {names})")
    return path


def load_description(gpu: str) -> GpuDescription | None:
    path = description_path(gpu)
    if path is None:
        return None

    data = load_yaml_file(path)
    if not isinstance(data, dict):
        raise GpuopsError(f"{path}: a GPU description must be a mapping")
    return parse_description(data, path)


def parse_description(data: Mapping[str, Any], path: Path) -> GpuDescription:
    """Check ``data`` and expand it into the replayer's explicit per-GPU form."""
    where = str(path)
    gpus = _expand_gpus(data, where)
    count = len(gpus)
    numa = _numa_of(data, count, where)
    affinity = _cpu_affinity(data, numa, where)
    nvlink = _nvlink(data, where)
    topology = _matrix(data, "topology", count, where, _TOPO_STATE.match)
    if topology is None:
        topology = _derived_topology(numa, nvlink, count)
    p2p = _matrix(data, "p2p_read", count, where, lambda s: s in _P2P_STATES)
    if p2p is None:
        p2p = _derived_p2p(numa, nvlink, count)
    fail = data.get("fail")
    if fail is not None and fail not in _FAILURES:
        raise GpuopsError(f"{where}: fail must be one of {', '.join(_FAILURES)}, not {fail!r}")
    replay = {
        "driver_version": _required_str(data, "driver_version", where),
        "cuda_driver_version": _required_str(data, "cuda_driver_version", where),
        "gpus": gpus,
        "numa_node": [numa[i] for i in range(count)],
        "cpu_affinity": [affinity.get(numa[i], "N/A") for i in range(count)],
        "topology": topology,
        "p2p_read": p2p,
        "nvlink": ([[nvlink[1]] * nvlink[0] for _ in range(count)] if nvlink else []),
        "fail": fail,
        "captured": _captured(data, path),
    }
    return GpuDescription(
        name=path.stem,
        path=path,
        replay=replay,
        packages=_packages(data, where),
        server=_server(data, where),
        compute_capability=gpus[0]["compute_cap"] if gpus else "",
        gpu_count=count,
    )


def _required_str(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if value is None or isinstance(value, (dict, list, bool)) or str(value).strip() == "":
        raise GpuopsError(f"{where}: {key} is required: a string such as {_EXAMPLES.get(key, 'x')!r} (docs/lab-host-description.md)")
    return str(value)


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GpuopsError(f"{where}: {key} must be a non-negative number such as {_EXAMPLES.get(key, 600)}, not {value!r}")
    return value


def _expand_gpus(data: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    raw = data.get("gpus")
    if isinstance(raw, bool) or not isinstance(raw, (int, list)):
        raise GpuopsError(f"{where}: gpus must be a count such as 8, or a list of per-GPU mappings such as "
                          f"[{{gpu_name: NVIDIA H100 80GB HBM3, compute_capability: \"9.0\"}}]{_DOC}, not {raw!r}")
    overrides: list[Mapping[str, Any]]
    if isinstance(raw, int):
        overrides = [{} for _ in range(raw)]
    else:
        overrides = raw
    if not 1 <= len(overrides) <= _MAX_GPUS:
        raise GpuopsError(f"{where}: gpus must be between 1 and {_MAX_GPUS}")
    bus_ids = _string_list(data, "pci_bus_ids", len(overrides), where)
    uuids = _string_list(data, "uuids", len(overrides), where)
    expanded = []
    for index, override in enumerate(overrides):
        if not isinstance(override, dict):
            raise GpuopsError(f"{where}: gpus[{index}] must be a mapping")
        merged = {**data, **override}
        expanded.append(_one_gpu(merged, index, bus_ids, uuids, f"{where}: gpus[{index}]"))
    return expanded


def _string_list(data: Mapping[str, Any], key: str, count: int, where: str) -> list[str] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count:
        raise GpuopsError(f"{where}: {key} must be a list of {count} strings")
    return [str(v) for v in value]


def _one_gpu(d: Mapping[str, Any], index: int, bus_ids, uuids, where: str) -> dict[str, Any]:
    cc = str(d.get("compute_capability", ""))
    if not _CC.match(cc):
        raise GpuopsError(f"{where}: compute_capability must be \"major.minor\" in quotes, such as \"12.0\" (RTX PRO 6000, "
                          f"sm120) or \"9.0\" (H100/H200, sm90){_DOC}, not {cc!r}")
    memory = int(_number(d.get("memory_mib"), "memory_mib", where))
    gen_max = int(_number(d.get("pcie_gen_max", 5), "pcie_gen_max", where))
    width_max = int(_number(d.get("pcie_width_max", 16), "pcie_width_max", where))
    if bus_ids is not None:
        bus_id = bus_ids[index]
    elif index < len(_DEFAULT_BUS_IDS):
        bus_id = f"00000000:{_DEFAULT_BUS_IDS[index]}:00.0"
    else:
        bus_id = f"00000001:{index:02X}:00.0"
    return {
        "index": index,
        "uuid": uuids[index] if uuids else f"GPU-{index:08x}-0000-0000-0000-000000000000",
        "name": _required_str(d, "gpu_name", where),
        "compute_cap": cc,
        "memory_total_mib": memory,
        "memory_used_mib": int(_number(d.get("memory_used_mib", 0), "memory_used_mib", where)),
        "pci_bus_id": bus_id,
        "pcie_gen_max": gen_max,
        "pcie_width_max": width_max,
        "pcie_gen_current": int(_number(d.get("pcie_gen_current", gen_max), "pcie_gen_current", where)),
        "pcie_width_current": int(
            _number(d.get("pcie_width_current", width_max), "pcie_width_current", where)
        ),
        "power_limit_w": float(_number(d.get("power_limit_w", 700), "power_limit_w", where)),
        "power_draw_w": float(_number(d.get("power_draw_w", 100), "power_draw_w", where)),
        "clocks_max_sm_mhz": int(_number(d.get("clocks_max_sm_mhz", 1980), "clocks_max_sm_mhz", where)),
        "temperature_c": int(_number(d.get("temperature_c", 35), "temperature_c", where)),
    }


def _numa_of(data: Mapping[str, Any], count: int, where: str) -> dict[int, int]:
    raw = data.get("numa_nodes")
    if raw is None:
        return {i: 0 for i in range(count)}
    if not isinstance(raw, dict):
        raise GpuopsError(f"{where}: numa_nodes must map a node to a list of GPU indices, such as {{0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}}{_DOC}")
    numa: dict[int, int] = {}
    for node, members in raw.items():
        if not isinstance(members, list):
            raise GpuopsError(f"{where}: numa_nodes[{node}] must be a list of GPU indices")
        for gpu in members:
            if not isinstance(gpu, int) or not 0 <= gpu < count or gpu in numa:
                raise GpuopsError(f"{where}: numa_nodes: bad or repeated GPU index {gpu!r}")
            numa[gpu] = int(node)
    missing = [i for i in range(count) if i not in numa]
    if missing:
        raise GpuopsError(f"{where}: numa_nodes does not place GPU(s) {missing}")
    return numa


def _cpu_affinity(data: Mapping[str, Any], numa: dict[int, int], where: str) -> dict[int, str]:
    raw = data.get("cpu_affinity")
    if raw is None:
        return {node: f"{node * 16}-{node * 16 + 15}" for node in set(numa.values())}
    if not isinstance(raw, dict):
        raise GpuopsError(f"{where}: cpu_affinity must map a NUMA node to a CPU list, such as {{0: \"0-31,64-95\"}}{_DOC}")
    return {int(k): str(v) for k, v in raw.items()}


def _nvlink(data: Mapping[str, Any], where: str) -> tuple[int, float] | None:
    raw = data.get("nvlink")
    if raw is None:
        return None
    if not isinstance(raw, dict) or "links" not in raw:
        raise GpuopsError(f"{where}: nvlink must be a mapping like {{links: 18, gbps: 26.562}}")
    links = int(_number(raw["links"], "nvlink.links", where))
    return links, float(_number(raw.get("gbps", 26.562), "nvlink.gbps", where))


def _matrix(data, key: str, count: int, where: str, valid) -> list[list[str]] | None:
    raw = data.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != count:
        raise GpuopsError(f"{where}: {key} must have {count} rows")
    rows = []
    for i, row in enumerate(raw):
        cells = row.split() if isinstance(row, str) else [str(c) for c in row]
        if len(cells) != count or not all(valid(c) for c in cells) or cells[i] != "X":
            raise GpuopsError(f"{where}: {key} row {i} must have {count} valid cells, X at {i}")
        rows.append(cells)
    return rows


def _derived_topology(numa, nvlink, count: int) -> list[list[str]]:
    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        if nvlink:
            return f"NV{nvlink[0]}"
        return "NODE" if numa[i] == numa[j] else "SYS"

    return [[cell(i, j) for j in range(count)] for i in range(count)]


def _derived_p2p(numa, nvlink, count: int) -> list[list[str]]:
    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        return "OK" if nvlink or numa[i] == numa[j] else "CNS"

    return [[cell(i, j) for j in range(count)] for i in range(count)]


def _captured(data: Mapping[str, Any], path: Path) -> dict[str, str]:
    raw = data.get("captured") or {}
    if not isinstance(raw, dict):
        raise GpuopsError(f"{path}: captured must map a command to a file")
    texts = {}
    for key, rel in raw.items():
        if key not in _CAPTURE_KEYS:
            raise GpuopsError(f"{path}: captured.{key}: unknown (known: {', '.join(_CAPTURE_KEYS)})")
        file = (path.parent / str(rel)).resolve()
        try:
            # newline="" keeps the bytes as captured (\r, if any, included).
            with open(file, encoding="utf-8", newline="") as handle:
                texts[key] = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise GpuopsError(f"{path}: captured.{key}: cannot read {file}: {exc}") from None
    return texts


def _packages(data: Mapping[str, Any], where: str) -> dict[str, str]:
    raw = data.get("packages") or {}
    if not isinstance(raw, dict):
        raise GpuopsError(f"{where}: packages must map a distribution name to a version, such as {{sglang: 0.5.8, torch: 2.9.1+cu128}}{_DOC}")
    packages = {}
    for name, version in raw.items():
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", str(name)) or not re.match(
            r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$", str(version)
        ):
            raise GpuopsError(f"{where}: packages: bad entry {name!r}: {version!r}")
        packages[str(name)] = str(version)
    return packages


def _server(data: Mapping[str, Any], where: str) -> ServerSpec | None:
    raw = data.get("server")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("cmdline"), str):
        raise GpuopsError(f"{where}: server must be a mapping with a cmdline string, such as {{cmdline: \"python3 -m "
                          f"sglang.launch_server --model-path /models/m --tp 8\"}}{_DOC}")
    try:
        words = shlex.split(raw["cmdline"])
    except ValueError as exc:
        raise GpuopsError(f"{where}: server.cmdline: {exc}") from None
    args = launch_args(words)
    if args is None or parse_flags(args)[1]:
        raise GpuopsError(f"{where}: server.cmdline must run `-m sglang.launch_server` with flags only, such as "
                          f"\"python3 -m sglang.launch_server --model-path /models/m --tp 8\"{_DOC}")
    env = raw.get("env") or {}
    if not isinstance(env, dict) or not all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)) for k in env):
        raise GpuopsError(f"{where}: server.env must map variable names to values")
    port = raw.get("port", flag_value(args, "--port") or 30000)
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise GpuopsError(f"{where}: server.port must be a number such as 30000, not {port!r}") from None
    model_config = raw.get("model_config")
    if model_config is not None and not isinstance(model_config, dict):
        raise GpuopsError(f"{where}: server.model_config must be a mapping (the model's config.json)")
    return ServerSpec(args=tuple(args), env={str(k): str(v) for k, v in env.items()}, port=port,
                      model_config=model_config)


def with_port(args: tuple[str, ...] | list[str], port: int) -> list[str]:
    """``args`` with the value of ``--port`` replaced by ``port`` in place (appended when missing)."""
    return with_flag(args, "--port", port)
