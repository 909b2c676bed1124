#!/usr/bin/env python3
"""A replaying ``nvidia-smi`` for simulated lab hosts (stdlib only, Python 3.8+).

It answers from a GPU description expanded to JSON by ``gpuops.lab.gpu_description`` (path in
``$GPUOPS_LAB_GPU``), printing what the real tool prints for the subcommands gpuops and operators
use: ``--query-gpu=... --format=csv[,noheader][,nounits]``, ``-L``, plain ``nvidia-smi``, ``-q``
(``-x``), ``topo -m``, ``topo -p2p r|w|n|a|p``, ``nvlink -s``. Output captured from a real machine
(the description's ``captured`` texts) is replayed byte for byte; the rest is generated in the
same format. The lab copies this file onto each host's PATH; it never touches a real GPU.
"""

import json
import os
import sys
import time

DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
EXIT_DRIVER = 9
EXIT_USAGE = 2
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"

TOPO_LEGEND = (
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
P2P_LEGEND = (
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n"
    "  TNS  = Topology not supported\n"
    "  NS   = Not supported\n"
    "  U    = Unknown\n"
)
UNDERLINE = "\x1b[4m"
RESET = "\x1b[0m"


def _mib(v):
    return "%d MiB" % v, "%d" % v


def _watts(v):
    return "%.2f W" % v, "%.2f" % v


def _mhz(v):
    return "%d MHz" % v, "%d" % v


def _plain(v):
    return str(v), str(v)


def _percent(v):
    return "%d %%" % v, "%d" % v


def _gpu(key):
    """The getter of a field that is one key of the GPU's own description."""
    return lambda g, d: g[key]


# canonical field -> (unit for the header or None, value getter(gpu, description), formatter)
FIELDS = {
    "index": (None, _gpu("index"), _plain),
    "uuid": (None, _gpu("uuid"), _plain),
    "name": (None, _gpu("name"), _plain),
    "compute_cap": (None, _gpu("compute_cap"), _plain),
    "memory.total": ("MiB", _gpu("memory_total_mib"), _mib),
    "memory.used": ("MiB", _gpu("memory_used_mib"), _mib),
    "memory.free": ("MiB", lambda g, d: g["memory_total_mib"] - g["memory_used_mib"], _mib),
    "driver_version": (None, lambda g, d: d["driver_version"], _plain),
    "pci.bus_id": (None, _gpu("pci_bus_id"), _plain),
    "pcie.link.gen.max": (None, _gpu("pcie_gen_max"), _plain),
    "pcie.link.width.max": (None, _gpu("pcie_width_max"), _plain),
    "pcie.link.gen.current": (None, _gpu("pcie_gen_current"), _plain),
    "pcie.link.width.current": (None, _gpu("pcie_width_current"), _plain),
    "power.limit": ("W", _gpu("power_limit_w"), _watts),
    "power.draw": ("W", _gpu("power_draw_w"), _watts),
    "clocks.max.sm": ("MHz", _gpu("clocks_max_sm_mhz"), _mhz),
    "temperature.gpu": (None, _gpu("temperature_c"), _plain),
    "utilization.gpu": ("%", lambda g, d: 0, _percent),
    "count": (None, lambda g, d: len(d["gpus"]), _plain),
    "persistence_mode": (None, lambda g, d: "Enabled", _plain),
    "compute_mode": (None, lambda g, d: "Default", _plain),
    "pstate": (None, lambda g, d: "P0", _plain),
}
ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "pcie.link.gen.gpumax": "pcie.link.gen.max",
    "clocks.max.sm": "clocks.max.sm",
    "clocks.max.streaming_multiprocessor": "clocks.max.sm",
    "enforced.power.limit": "power.limit",
    "power.limit": "power.limit",
}


def query_gpu(desc, fields_arg, format_arg, ids):
    """``--query-gpu``: returns (exit status, stdout)."""
    if format_arg is None:
        return EXIT_USAGE, "Please specify output format using --format.\n\n"
    options = [o.strip() for o in format_arg.split(",") if o.strip()]
    if not options or options[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in options):
        return EXIT_USAGE, 'Invalid format "%s".\n\n' % format_arg
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    if not names:
        return EXIT_USAGE, BAD_ARGS
    canonical = []
    for name in names:
        key = ALIASES.get(name.lower(), name.lower())
        if key not in FIELDS:
            return EXIT_USAGE, 'Field "%s" is not a valid field to query.\n\n' % name
        canonical.append(key)
    units = "nounits" in options
    lines = []
    if "noheader" not in options:
        header = []
        for key in canonical:
            unit = FIELDS[key][0]
            header.append("%s [%s]" % (key, unit) if unit else key)
        lines.append(", ".join(header))
    for gpu in _selected(desc, ids):
        values = []
        for key in canonical:
            _, get, fmt = FIELDS[key]
            with_unit, bare = fmt(get(gpu, desc))
            values.append(bare if units else with_unit)
        lines.append(", ".join(values))
    return 0, "".join(line + "\n" for line in lines)


def _selected(desc, ids):
    gpus = desc["gpus"]
    if ids is None:
        return gpus
    wanted = []
    for token in ids.split(","):
        token = token.strip()
        for gpu in gpus:
            if token in (str(gpu["index"]), gpu["uuid"], gpu["pci_bus_id"]):
                wanted.append(gpu)
    return wanted


def list_gpus(desc):
    return "".join("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]) for g in desc["gpus"])


def topo_matrix(desc):
    count = len(desc["gpus"])
    head = "".join("GPU%d\t" % i for i in range(count))
    out = ["\t" + UNDERLINE + head + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID" + RESET + "\n"]
    for i in range(count):
        cells = "".join((" X " if c == "X" else c) + "\t" for c in desc["topology"][i])
        out.append(
            "GPU%d\t%s%s\t%s\t\tN/A\n" % (i, cells, desc["cpu_affinity"][i], desc["numa_node"][i])
        )
    return "".join(out) + TOPO_LEGEND


def topo_p2p(desc, kind):
    count = len(desc["gpus"])
    matrix = desc["p2p_read"]
    if kind == "n":  # the NVLink capability matrix
        has_nvlink = bool(desc["nvlink"])
        matrix = [["X" if i == j else ("OK" if has_nvlink else "NS") for j in range(count)] for i in range(count)]
    head = "".join("GPU%d\t" % i for i in range(count))
    out = [" \t" + UNDERLINE + head + RESET + "\n"]
    for i in range(count):
        out.append(" GPU%d\t%s\n" % (i, "".join(c + "\t" for c in matrix[i])))
    return "".join(out) + P2P_LEGEND


def nvlink_status(desc):
    out = []
    for gpu, links in zip(desc["gpus"], desc["nvlink"]):
        if not links:
            continue
        out.append("GPU %d: %s (UUID: %s)\n" % (gpu["index"], gpu["name"], gpu["uuid"]))
        out.extend("\t Link %d: %s GB/s\n" % (n, _gbps(speed)) for n, speed in enumerate(links))
    return "".join(out)


def _gbps(value):
    return ("%.3f" % value).rstrip("0").rstrip(".") if value != int(value) else "%d" % value


def summary_table(desc, now=None):
    """Plain ``nvidia-smi``: the header with driver and CUDA version, one block per GPU."""
    stamp = time.ctime(now)
    rule = "+-----------------------------------------+------------------------+----------------------+\n"
    full = "+-----------------------------------------------------------------------------------------+\n"
    lines = [stamp + "       \n", full]
    lines.append(
        "| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|\n"
        % (desc["driver_version"], desc["driver_version"], desc["cuda_driver_version"])
    )
    lines.append(rule)
    lines.append("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
    lines.append("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
    lines.append("|                                         |                        |               MIG M. |\n")
    lines.append("|=========================================+========================+======================|\n")
    for gpu in desc["gpus"]:
        name = gpu["name"] if len(gpu["name"]) <= 30 else gpu["name"][:27] + "..."
        lines.append(
            "| %3d  %-30s%3s  | %18s %3s | %20s |\n"
            % (gpu["index"], name, "On", gpu["pci_bus_id"], "Off", "0")
        )
        power = "%dW / %4dW" % (gpu["power_draw_w"], gpu["power_limit_w"])
        memory = "%10s / %9s" % ("%dMiB" % gpu["memory_used_mib"], "%dMiB" % gpu["memory_total_mib"])
        lines.append(
            "|%4s%6s%6s%24s | %22s | %7s %12s |\n"
            % ("N/A", "%dC" % gpu["temperature_c"], "P0", power, memory, "0%", "Default")
        )
        lines.append("|                                         |                        |             Disabled |\n")
        lines.append(rule)
    lines.append("\n")
    lines.append(full)
    lines.append("| Processes:                                                                              |\n")
    lines.append("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n")
    lines.append("|        ID   ID                                                               Usage      |\n")
    lines.append("|=========================================================================================|\n")
    lines.append("|  No running processes found                                                             |\n")
    lines.append(full)
    return "".join(lines)


def query_all(desc, now=None):
    """``-q`` for a generated description: the fields gpuops and operators read most."""
    stamp = time.ctime(now)

    def pad(key, indent=4):
        return " " * indent + key.ljust(55 - indent) + ": "

    out = ["\n==============NVSMI LOG==============\n\n"]
    out.append(pad("Timestamp", 0) + stamp + "\n")
    out.append(pad("Driver Version", 0) + desc["driver_version"] + "\n")
    out.append(pad("CUDA Version", 0) + desc["cuda_driver_version"] + "\n\n")
    out.append(pad("Attached GPUs", 0) + "%d\n" % len(desc["gpus"]))
    for gpu in desc["gpus"]:
        out.append("GPU %s\n" % gpu["pci_bus_id"])
        out.append(pad("Product Name") + gpu["name"] + "\n")
        out.append(pad("Persistence Mode") + "Enabled\n")
        out.append(pad("GPU UUID") + gpu["uuid"] + "\n")
        out.append(pad("Minor Number") + "%d\n" % gpu["index"])
        out.append("    PCI\n")
        out.append(pad("Bus Id", 8) + gpu["pci_bus_id"] + "\n")
        out.append("    FB Memory Usage\n")
        out.append(pad("Total", 8) + "%d MiB\n" % gpu["memory_total_mib"])
        out.append(pad("Used", 8) + "%d MiB\n" % gpu["memory_used_mib"])
        out.append(pad("Free", 8) + "%d MiB\n" % (gpu["memory_total_mib"] - gpu["memory_used_mib"]))
        out.append(pad("Compute Mode") + "Default\n")
        out.append("    Max Clocks\n")
        out.append(pad("SM", 8) + "%d MHz\n" % gpu["clocks_max_sm_mhz"])
        out.append("\n")
    return "".join(out)


def run(argv, desc, now=None):
    """Answer one invocation: returns (exit status, stdout text). Pure apart from the clock."""
    if desc.get("fail") == "driver":
        return EXIT_DRIVER, DRIVER_FAILURE
    captured = desc.get("captured") or {}
    if not argv:
        return 0, captured.get("smi") or summary_table(desc, now)
    if argv[0] == "topo":
        rest = argv[1:]
        if rest in (["-m"], ["--matrix"]):
            return 0, captured.get("topo") or topo_matrix(desc)
        if len(rest) == 2 and rest[0] in ("-p2p", "--p2p") and rest[1] in ("r", "w", "n", "a", "p"):
            if rest[1] == "r" and "p2p" in captured:
                return 0, captured["p2p"]
            return 0, topo_p2p(desc, rest[1])
        return EXIT_USAGE, BAD_ARGS
    if argv[0] == "nvlink":
        if argv[1:] in (["-s"], ["--status"]):
            return 0, captured["nvlink"] if "nvlink" in captured else nvlink_status(desc)
        return EXIT_USAGE, BAD_ARGS
    if argv in (["--version"],):
        nvml = ".".join(desc["driver_version"].split(".")[:2])
        return 0, (
            "NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
            "CUDA Version        : %s\n" % (desc["driver_version"], nvml, desc["driver_version"], desc["cuda_driver_version"])
        )
    if argv in (["-L"], ["--list-gpus"]):
        return 0, list_gpus(desc)
    if argv in (["-q"], ["--query"]):
        return 0, captured.get("smi_q") or query_all(desc, now)
    if sorted(argv) in (["-q", "-x"], ["--query", "--xml-format"]):
        if "smi_q_xml" in captured:
            return 0, captured["smi_q_xml"]
        return EXIT_USAGE, "XML output is not simulated for this GPU description.\n\n"
    return _query_invocation(argv, desc)


def _query_invocation(argv, desc):
    fields = fmt = ids = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        for flag in ("--query-gpu", "--format", "--id", "-i"):
            if arg == flag and i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
                break
            if arg.startswith(flag + "=") and flag.startswith("--"):
                value = arg.split("=", 1)[1]
                break
        else:
            return EXIT_USAGE, BAD_ARGS
        if flag == "--query-gpu":
            fields = value
        elif flag == "--format":
            fmt = value
        else:
            ids = value
        i += 1
    if fields is None:
        return EXIT_USAGE, BAD_ARGS
    return query_gpu(desc, fields, fmt, ids)


def main():
    path = os.environ.get("GPUOPS_LAB_GPU")
    if not path:
        sys.stderr.write("nvidia-smi (gpuops lab): GPUOPS_LAB_GPU is not set\n")
        return EXIT_DRIVER
    with open(path, encoding="utf-8") as handle:
        desc = json.load(handle)
    status, text = run(sys.argv[1:], desc)
    sys.stdout.write(text)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
