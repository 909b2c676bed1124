"""SGLang's PCIe IPC all-reduce: what the real releases say about it, and where it fits (pure).

SGLang 0.5.21+ can hand its TP group's small all-reduces to FlashInfer's ``pcie_ipc_comm``
kernels (``srt/distributed/device_communicators/pcie_ipc_ar.py``), switched on by
``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``. Every fact below was read from the released wheels
(``tests/unit/test_pcie_ipc_facts.py`` downloads them and holds each constant to its source):

- sglang 0.5.20 has no ``pcie_ipc_ar.py``; 0.5.21, 0.5.22 and 0.5.23 have the same file.
- flashinfer-python 0.6.18 has no ``flashinfer/comm/pcie_ipc_ar.py``; 0.7.0 is the first that
  has it and exports ``PcieIpcAllReduceWorkspace`` from ``flashinfer.comm``. sglang 0.5.21 still
  pins flashinfer 0.6.18 (so the switch alone falls back to NCCL there), 0.5.22 pins 0.7.1,
  0.5.23 pins 0.7.2.
- ``_SUPPORTED_WORLD_SIZES = (2, 4, 8)``; bf16 only ("serves bf16 only; %s reductions stay on
  NCCL"); off with deterministic inference (``_deterministic_collectives_enabled``:
  ``SGLANG_USE_1STAGE_ALLREDUCE`` when set, else ``--enable-deterministic-inference``);
  ``SGLANG_PCIE_IPC_MAX_NUMEL`` overrides the decode-sized workspace; only the ``tp`` group.
- It does not probe for NVLink: SGLang's custom all-reduce is picked before it (parallel_state's
  dispatch order), and on an NVLink host that is the faster backend anyway.

The role ``pcie-allreduce`` plans from ``fit``; ``gpuops advise`` ranks it with the same ``fit``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

ENABLE_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL_ENV = "SGLANG_PCIE_IPC_MAX_NUMEL"
SGLANG_MODULE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
FLASHINFER_MODULE = "flashinfer/comm/pcie_ipc_ar.py"
FIRST_SGLANG = "0.5.21"
FIRST_FLASHINFER = "0.7.0"
# The release a host should move to: the newest checked, whose own pin has the kernels.
RECOMMENDED_SGLANG = "0.5.23"
RECOMMENDED_FLASHINFER = "0.7.2"   # what sglang 0.5.23 pins
WORLD_SIZES = (2, 4, 8)

# The lines pcie_ipc_ar.py logs (its exact text; tests hold them to the real file).
ENABLED_LINE = "FlashInfer PCIe-IPC all-reduce enabled (world="
FALLBACK_LINE = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
                 "falling back to NCCL all-reduce.")
WORKSPACE_FAILED = re.compile(r"FlashInfer PCIe-IPC workspace \(max_numel=\d+\) failed: .*; reductions stay on NCCL")

# The figures pcie_ipc_ar.py's docstring publishes (one 8x SM120 host, GPUs 0-3 and 4-7 on
# separate NUMA nodes, hidden 6144 bf16; the TPOT table at 8 ranks, TP 8, 8k context).
PUBLISHED_SOURCE = "sglang 0.5.21-0.5.23 srt/distributed/device_communicators/pcie_ipc_ar.py (docstring)"
PUBLISHED_PER_CALL_US = {"12 KiB": (5.3, 205.1), "96 KiB": (15.3, 584.9), "384 KiB": (34.6, 1169.3)}
PUBLISHED_TPOT_MS = (21.14, 13.62)   # NCCL only -> decode-sized workspace


class Misfit(enum.Enum):
    """Why the PCIe IPC all-reduce does not fit a host (each with its one-line reason)."""

    NVLINK = "nvlink"
    SGLANG_TOO_OLD = "sglang_too_old"
    FLASHINFER_LACKS = "flashinfer_lacks"
    TP_SIZE = "tp_size"
    DTYPE = "dtype"
    DETERMINISTIC = "deterministic"
    NO_GPU = "no_gpu"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class HostStack:
    """What ``fit`` reads about one host (from apply's or inspect's facts)."""

    sglang: str | None
    flashinfer: str | None
    nvlink: bool | None
    gpu_count: int | None
    launch_args: Sequence[str] = ()
    launch_env: Mapping[str, str] = field(default_factory=dict)
    model_dtype: str | None = None           # config.json's torch_dtype, when known
    p2p_failed_pairs: Sequence[Sequence[str]] = ()
    # What the host's own FlashInfer files say (gates/kernels.py read comm/__init__.py): True it
    # exports PcieIpcAllReduceWorkspace, False it does not (with ``flashinfer_reason``), None not read
    # (then the version decides).
    flashinfer_has_kernels: bool | None = None
    flashinfer_reason: str = ""


@dataclass(frozen=True)
class Fit:
    applies: bool
    reason: str                      # one line: why it applies or why not
    misfit: Misfit | None = None
    tp: int | None = None
    warnings: tuple[str, ...] = ()
    # An upgrade that would make it fit: (sglang release, flashinfer version), else None.
    upgrade: tuple[str, str] | None = None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``0.5.21`` -> (0, 5, 21); ``0.7.2.post1`` -> (0, 7, 2); None when not a release number."""
    if not text:
        return None
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def at_least(version: str | None, first: str) -> bool | None:
    have, want = version_tuple(version), version_tuple(first)
    if have is None or want is None:
        return None
    return have >= want


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def launch_flags(args: Sequence[str]) -> dict[str, Any]:
    from gpuops.remote.sglang_argv import parse_flags

    return parse_flags([str(a) for a in args])[0]


def tp_size(args: Sequence[str], gpu_count: int | None) -> int | None:
    from gpuops.remote.sglang_argv import first_of

    text = first_of(launch_flags(args), "tp_size")
    if isinstance(text, str) and text.isdigit():
        return int(text)
    return 1 if text is None and args else None


def deterministic(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """SGLang's ``_deterministic_collectives_enabled``: ``SGLANG_USE_1STAGE_ALLREDUCE`` when set,
    else the launch flag (which sets ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE`` itself)."""
    if "SGLANG_USE_1STAGE_ALLREDUCE" in env:
        return _truthy(env["SGLANG_USE_1STAGE_ALLREDUCE"])
    flag = launch_flags(args).get("enable_deterministic_inference")
    return flag is True or (isinstance(flag, str) and _truthy(flag))


_BF16 = ("bfloat16", "bf16")


def activation_dtype(args: Sequence[str], model_dtype: str | None) -> str | None:
    """The dtype the server's activations (and so its all-reduces) run in; None when unknown."""
    given = launch_flags(args).get("dtype")
    if isinstance(given, str) and given != "auto":
        return {"half": "float16", "float": "float32"}.get(given, given)
    return model_dtype


def fit(stack: HostStack) -> Fit:
    """Whether SGLang's PCIe IPC all-reduce fits this host, and why (checked in this order: an
    NVLink host never wants it; then the release, FlashInfer, the TP size, dtype, determinism)."""
    if stack.nvlink:
        return Fit(False, "for PCIe-only hosts; NVLink all-reduce is already fast (this host has NVLink)",
                   Misfit.NVLINK)
    if not stack.gpu_count:
        return Fit(False, "no GPUs found on this host", Misfit.NO_GPU)
    release = at_least(stack.sglang, FIRST_SGLANG)
    if release is None:
        return Fit(False, f"the SGLang release is unknown ({stack.sglang or 'not found'}); "
                          f"the PCIe IPC all-reduce needs sglang >= {FIRST_SGLANG}", Misfit.UNKNOWN)
    if not release:
        return Fit(False, f"sglang {stack.sglang} has no PCIe IPC all-reduce: {FIRST_SGLANG} is the first release "
                          f"with it ({SGLANG_MODULE}); upgrade to {RECOMMENDED_SGLANG} (it pins flashinfer "
                          f"{RECOMMENDED_FLASHINFER})", Misfit.SGLANG_TOO_OLD,
                   upgrade=(RECOMMENDED_SGLANG, RECOMMENDED_FLASHINFER))
    kernels = at_least(stack.flashinfer, FIRST_FLASHINFER)
    if stack.flashinfer_has_kernels is False and stack.flashinfer_reason:
        return Fit(False, f"{stack.flashinfer_reason} (flashinfer.comm.PcieIpcAllReduceWorkspace; sglang "
                          f"{RECOMMENDED_SGLANG} pins {RECOMMENDED_FLASHINFER}); SGLang would log \"falling back to "
                          "NCCL all-reduce\"", Misfit.FLASHINFER_LACKS, upgrade=(RECOMMENDED_SGLANG, RECOMMENDED_FLASHINFER))
    if stack.flashinfer_has_kernels is True:
        kernels = True
    if not kernels:
        have = f"flashinfer {stack.flashinfer}" if stack.flashinfer else "no flashinfer-python is installed and it"
        return Fit(False, f"{have} has no pcie_ipc_comm (flashinfer.comm.PcieIpcAllReduceWorkspace): "
                          f"{FIRST_FLASHINFER} is the first FlashInfer with it (sglang {RECOMMENDED_SGLANG} pins "
                          f"{RECOMMENDED_FLASHINFER}); SGLang would log \"falling back to NCCL all-reduce\"",
                   Misfit.FLASHINFER_LACKS, upgrade=(RECOMMENDED_SGLANG, RECOMMENDED_FLASHINFER))
    tp = tp_size(stack.launch_args, stack.gpu_count)
    if tp is None:
        return Fit(False, "the server's launch (sglang_args) is unknown: cannot tell its TP size", Misfit.UNKNOWN)
    if tp not in WORLD_SIZES:
        return Fit(False, f"TP {tp}: the PCIe IPC kernels serve TP groups of 2, 4 or 8 GPUs only "
                          "(pcie_ipc_ar.py _SUPPORTED_WORLD_SIZES)", Misfit.TP_SIZE, tp)
    dtype = activation_dtype(stack.launch_args, stack.model_dtype)
    if dtype is not None and dtype not in _BF16:
        return Fit(False, f"the model runs in {dtype}: the PCIe IPC all-reduce serves bf16 only "
                          "(other dtypes stay on NCCL)", Misfit.DTYPE, tp)
    if deterministic(stack.launch_args, stack.launch_env):
        return Fit(False, "deterministic inference is on (--enable-deterministic-inference or "
                          "SGLANG_USE_1STAGE_ALLREDUCE=1): SGLang leaves the PCIe IPC all-reduce off", Misfit.DETERMINISTIC,
                   tp)
    warnings = []
    gaps = _p2p_gaps(stack.p2p_failed_pairs, tp)
    if gaps:
        warnings.append(f"peer-to-peer reads are not reported between {len(gaps)} GPU pair(s) of the TP group "
                        f"({', '.join(gaps[:3])}{', ...' if len(gaps) > 3 else ''}); the kernels push over the root "
                        "complex (SGLang measured them on such a two-socket host), and the server's log after the "
                        "restart says whether the workspace was built")
    return Fit(True, f"sglang {stack.sglang} with flashinfer {stack.flashinfer}, TP {tp}, "
                     f"{dtype or 'bf16 (assumed: dtype not given)'}, PCIe only", None, tp, tuple(warnings))


def _p2p_gaps(failed_pairs: Sequence[Sequence[str]], tp: int) -> list[str]:
    members = {f"GPU{i}" for i in range(tp)}
    return [f"{p[0]}-{p[1]}" for p in failed_pairs if len(p) >= 2 and p[0] in members and p[1] in members]


def log_verdict(log: str) -> tuple[bool | None, str]:
    """What the server's log (since its last start) says: (True, line) enabled, (False, line)
    fell back to NCCL, (None, why) neither line is there."""
    for line in log.splitlines():
        if FALLBACK_LINE in line:
            return False, FALLBACK_LINE
        found = WORKSPACE_FAILED.search(line)
        if found:
            return False, found.group(0)
    for line in log.splitlines():
        if ENABLED_LINE in line:
            return True, line[line.index(ENABLED_LINE):].strip()
    return None, "the server's log has neither pcie_ipc_ar.py's \"enabled\" nor its \"falling back\" line"
