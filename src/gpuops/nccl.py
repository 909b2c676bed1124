"""What gpuops knows about NCCL's environment variables: names, allowed values, known-bad mixes.

NCCL silently ignores a variable it does not know (``NCCL_ALGOS=Ring`` does nothing) and falls
back quietly on many bad values, so a typo costs a whole benchmark run before anyone notices.
Checking names and values before anything changes on a host is cheap; this module is pure.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable, Mapping

from gpuops.errors import GpuopsError
from gpuops.frozen import frozen

ALGORITHMS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
DEBUG_SUBSYSTEMS = (
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
    "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL",
)
LAUNCH_MODES = ("PARALLEL", "GROUP")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv")


class NcclSettingError(GpuopsError):
    """An NCCL variable with an unknown name or a value NCCL would not accept."""


@frozen
class Rule:
    """How one variable's value is checked: ``check`` returns None when fine, else the problem."""

    check: Callable[[str], str | None]
    choices: str   # shown to the user next to the problem


def _one_of(choices: tuple[str, ...]) -> Rule:
    def check(value: str) -> str | None:
        if value.upper() in (c.upper() for c in choices):
            return None
        return f"{value!r} is not one of them"

    return Rule(check, ", ".join(choices))


def _name_list(choices: tuple[str, ...], per_collective: bool = False) -> Rule:
    """A comma list of names, optionally starting with ``^`` (exclude), as NCCL_ALGO/PROTO take.

    Newer NCCL also accepts per-collective lists (``allreduce:tree,ring;allgather:ring``).
    """
    upper = {c.upper() for c in choices}

    def check_list(text: str) -> str | None:
        body = text[1:] if text.startswith("^") else text
        names = [n.strip() for n in body.split(",")]
        if not body or any(not n for n in names):
            return f"{text!r} has an empty entry"
        bad = [n for n in names if n.upper() not in upper]
        if bad:
            hint = difflib.get_close_matches(bad[0], choices, n=1, cutoff=0.5)
            return f"{bad[0]!r} is not one of them" + (f" (did you mean {hint[0]}?)" if hint else "")
        return None

    def check(value: str) -> str | None:
        if per_collective and ":" in value:
            for part in value.split(";"):
                coll, sep, names = part.partition(":")
                if not sep or coll.strip().lower() not in COLLECTIVES:
                    return f"{part!r} is not COLLECTIVE:LIST (collectives: {', '.join(COLLECTIVES)})"
                problem = check_list(names.strip())
                if problem:
                    return problem
            return None
        return check_list(value)

    return Rule(check, ", ".join(choices) + " (comma list, ^ to exclude)")


def _int_range(low: int, high: int | None = None, multiple: int = 1) -> Rule:
    def check(value: str) -> str | None:
        try:
            number = int(value, 0)
        except ValueError:
            return f"{value!r} is not an integer"
        if number < low or (high is not None and number > high) or number % multiple:
            return f"{number} is out of range"
        return None

    span = f"{low}..{high}" if high is not None else f">= {low}"
    return Rule(check, f"an integer {span}" + (f", a multiple of {multiple}" if multiple > 1 else ""))


def _p2p_level() -> Rule:
    def check(value: str) -> str | None:
        if value.upper() in P2P_LEVELS or value in {str(i) for i in range(6)}:
            return None
        return f"{value!r} is not one of them"

    return Rule(check, ", ".join(P2P_LEVELS) + " or 0-5")


def _any_text() -> Rule:
    def check(value: str) -> str | None:
        return None if value else "it is empty"

    return Rule(check, "any non-empty text")


_BOOL = _one_of(("0", "1"))

KNOWN: Mapping[str, Rule] = {
    "NCCL_ALGO": _name_list(ALGORITHMS, per_collective=True),
    "NCCL_PROTO": _name_list(PROTOCOLS, per_collective=True),
    "NCCL_P2P_LEVEL": _p2p_level(),
    "NCCL_NET_GDR_LEVEL": _p2p_level(),
    "NCCL_SHM_USE_CUDA_MEMCPY": _BOOL,
    "NCCL_P2P_DISABLE": _BOOL,
    "NCCL_P2P_READ_ENABLE": _BOOL,
    "NCCL_P2P_USE_CUDA_MEMCPY": _BOOL,
    "NCCL_SHM_DISABLE": _BOOL,
    "NCCL_IB_DISABLE": _BOOL,
    "NCCL_NVLS_ENABLE": _BOOL,
    "NCCL_CUMEM_ENABLE": _BOOL,
    "NCCL_COLLNET_ENABLE": _BOOL,
    "NCCL_NET_GDR_READ": _BOOL,
    "NCCL_IGNORE_CPU_AFFINITY": _BOOL,
    "NCCL_RUNTIME_CONNECT": _BOOL,
    "NCCL_COMM_BLOCKING": _BOOL,
    "NCCL_GRAPH_MIXING_SUPPORT": _BOOL,
    "NCCL_LOCAL_REGISTER": _BOOL,
    "NCCL_GRAPH_REGISTER": _BOOL,
    "NCCL_MNNVL_ENABLE": _one_of(("0", "1", "2")),
    "NCCL_CROSS_NIC": _one_of(("0", "1", "2")),
    "NCCL_MIN_NCHANNELS": _int_range(1, 64),
    "NCCL_MAX_NCHANNELS": _int_range(1, 64),
    "NCCL_MIN_CTAS": _int_range(1, 64),
    "NCCL_MAX_CTAS": _int_range(1, 64),
    "NCCL_CGA_CLUSTER_SIZE": _int_range(0, 8),
    "NCCL_BUFFSIZE": _int_range(1),
    "NCCL_NTHREADS": _int_range(64, 512, multiple=64),
    "NCCL_P2P_NET_CHUNKSIZE": _int_range(1),
    "NCCL_P2P_NVL_CHUNKSIZE": _int_range(1),
    "NCCL_P2P_PCI_CHUNKSIZE": _int_range(1),
    "NCCL_NVLS_CHUNKSIZE": _int_range(1),
    "NCCL_SOCKET_NTHREADS": _int_range(1, 16),
    "NCCL_NSOCKS_PERTHREAD": _int_range(1),
    "NCCL_IB_TIMEOUT": _int_range(1, 31),
    "NCCL_IB_RETRY_CNT": _int_range(0, 7),
    "NCCL_IB_GID_INDEX": _int_range(0),
    "NCCL_IB_QPS_PER_CONNECTION": _int_range(1),
    "NCCL_WORK_FIFO_DEPTH": _int_range(1),
    "NCCL_DEBUG": _one_of(DEBUG_LEVELS),
    "NCCL_DEBUG_SUBSYS": _name_list(DEBUG_SUBSYSTEMS),
    "NCCL_LAUNCH_MODE": _one_of(LAUNCH_MODES),
    "NCCL_DEBUG_FILE": _any_text(),
    "NCCL_SOCKET_IFNAME": _any_text(),
    "NCCL_SOCKET_FAMILY": _one_of(("AF_INET", "AF_INET6")),
    "NCCL_IB_HCA": _any_text(),
    "NCCL_NET": _any_text(),
    "NCCL_NET_PLUGIN": _any_text(),
    "NCCL_TUNER_PLUGIN": _any_text(),
    "NCCL_TOPO_FILE": _any_text(),
    "NCCL_TOPO_DUMP_FILE": _any_text(),
    "NCCL_GRAPH_FILE": _any_text(),
    "NCCL_GRAPH_DUMP_FILE": _any_text(),
    "NCCL_HOSTID": _any_text(),
    "NCCL_SET_THREAD_NAME": _BOOL,
    "NCCL_SET_STACK_SIZE": _BOOL,
    "NCCL_PXN_DISABLE": _BOOL,
    "NCCL_NVB_DISABLE": _BOOL,
    "NCCL_NVB_PRECONNECT": _BOOL,
    "NCCL_NET_SHARED_BUFFERS": _BOOL,
    "NCCL_NET_SHARED_COMMS": _BOOL,
    "NCCL_IB_PCI_RELAXED_ORDERING": _one_of(("0", "1", "2")),
    "NCCL_IB_ADAPTIVE_ROUTING": _BOOL,
    "NCCL_IB_SPLIT_DATA_ON_QPS": _BOOL,
    "NCCL_IB_ECE_ENABLE": _BOOL,
    "NCCL_IB_MERGE_NICS": _BOOL,
    "NCCL_RAS_ENABLE": _BOOL,
    "NCCL_CHECK_POINTERS": _BOOL,
    "NCCL_WARN_ENABLE_DEBUG_INFO": _BOOL,
    "NCCL_IB_SL": _int_range(0, 15),
    "NCCL_IB_TC": _int_range(0, 255),
    "NCCL_IB_FIFO_TC": _int_range(0, 255),
    "NCCL_IB_AR_THRESHOLD": _int_range(0),
    "NCCL_IB_ROCE_VERSION_NUM": _one_of(("1", "2")),
    "NCCL_IB_ADDR_FAMILY": _one_of(("AF_INET", "AF_INET6")),
    "NCCL_IB_ADDR_RANGE": _any_text(),
    "NCCL_IB_GID_INDEX_SELECT": _any_text(),
    "NCCL_MIN_P2P_NCHANNELS": _int_range(1, 64),
    "NCCL_MAX_P2P_NCHANNELS": _int_range(1, 64),
    "NCCL_NCHANNELS_PER_NET_PEER": _int_range(1, 64),
    "NCCL_NVLS_NCHANNELS": _int_range(1, 64),
    "NCCL_LL128_BUFFSIZE": _int_range(1),
    "NCCL_LL_BUFFSIZE": _int_range(1),
    "NCCL_SINGLE_RING_THRESHOLD": _int_range(0),
    "NCCL_LL_THRESHOLD": _int_range(0),
    "NCCL_COLLNET_NODE_THRESHOLD": _int_range(0),
    "NCCL_CONF_FILE": _any_text(),
    "NCCL_PROFILER_PLUGIN": _any_text(),
    "NCCL_DEBUG_TIMESTAMP_FORMAT": _any_text(),
    "NCCL_MNNVL_UUID": _any_text(),
    "NCCL_MNNVL_CLIQUE_ID": _any_text(),
}


def check_nccl_variable(name: str, value: object, where: str, allow_unknown: frozenset[str] = frozenset()) -> None:
    """Refuse an unknown NCCL_* name or a value NCCL would not take; ``where`` names the source.

    ``allow_unknown``: names the operator vouches for (a newer NCCL than this list knows).
    """
    rule = KNOWN.get(name)
    if rule is None and name in allow_unknown:
        return
    if rule is None:
        close = difflib.get_close_matches(name, list(KNOWN), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "not one of the NCCL variables gpuops knows"
        raise NcclSettingError(
            f"{where}: unknown NCCL variable {name} ({hint}; if it is right, list it in nccl_allow_unknown)")
    text = _as_env_text(value)
    problem = rule.check(text)
    if problem:
        raise NcclSettingError(f"{where}: {name}={text}: {problem}; valid: {rule.choices}")


def check_nccl_env(env: Mapping[str, object], where: str, allow_unknown: frozenset[str] = frozenset()) -> None:
    """Check every NCCL_* variable in ``env`` and the cross-variable rules NCCL itself enforces."""
    for name, value in env.items():
        if name.startswith("NCCL_"):
            check_nccl_variable(name, value, where, allow_unknown)
    low, high = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if low is not None and high is not None and int(str(low), 0) > int(str(high), 0):
        raise NcclSettingError(
            f"{where}: NCCL_MIN_NCHANNELS={low} is above NCCL_MAX_NCHANNELS={high}"
        )


def _algo_uses(value: str, algorithm: str) -> bool:
    """Whether an NCCL_ALGO value lets NCCL pick ``algorithm`` (explicitly named, not excluded)."""
    lists = [part.partition(":")[2] if ":" in part else part for part in value.split(";")]
    for entry in lists:
        entry = entry.strip()
        names = {n.strip().upper() for n in entry.lstrip("^").split(",")}
        if not entry.startswith("^") and algorithm.upper() in names:
            return True
    return False


def nccl_warnings(env: Mapping[str, object], launch_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Settings that are valid but known to hurt, from the field; shown, never refused."""
    warnings: list[str] = []
    algo = env.get("NCCL_ALGO")
    cuda_graph_off = "--disable-cuda-graph" in launch_args
    if algo is not None and _algo_uses(_as_env_text(algo), "Tree") and not cuda_graph_off:
        warnings.append(
            f"NCCL_ALGO={algo}: Tree failed during CUDA graph capture on an 8-GPU PCIe-only "
            "RTX PRO 6000 host (field report); leave NCCL_ALGO unset or test with --disable-cuda-graph"
        )
    proto = env.get("NCCL_PROTO")
    if proto is not None and re.search(r"(?<![\^\w])LL128\b", _as_env_text(proto), re.I):
        warnings.append(
            f"NCCL_PROTO={proto}: NCCL enables LL128 only where it is known safe (NVLink); "
            "forcing it on PCIe-only hosts has produced wrong results"
        )
    if _as_env_text(env.get("NCCL_DEBUG", "")).upper() == "TRACE":
        warnings.append("NCCL_DEBUG=TRACE logs every call and slows collectives: not for benchmarks")
    if _as_env_text(env.get("NCCL_P2P_DISABLE", "0")) == "1":
        warnings.append(
            "NCCL_P2P_DISABLE=1 sends all GPU-to-GPU traffic through host memory: "
            "all-reduce latency on PCIe grows several-fold"
        )
    return warnings


def _as_env_text(value: object) -> str:
    # YAML turns `NCCL_IB_DISABLE: 1` into an int and `yes` into a bool; NCCL reads text.
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
