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

Where it fits is one set of rules, the catalog's ``pcie_ipc_allreduce`` (``kernels:`` and
``fits:``, judged by gates/kernels.py and gates/fits.py): ``inspect host`` folds them into the
feature's verdict, and ``fit`` here names the first that fails (with the upgrade that would cure
it) for the role ``pcie-allreduce`` and for ``gpuops advise``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import field
from typing import Any, Mapping, Sequence
from gpuops.gates import fits, kernels
from gpuops.remote.sglang_argv import first_of, parse_flags
from gpuops.frozen import frozen

ENABLE_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
MAX_NUMEL_ENV = "SGLANG_PCIE_IPC_MAX_NUMEL"
SGLANG_MODULE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
FLASHINFER_MODULE = "flashinfer/comm/pcie_ipc_ar.py"
FIRST_SGLANG = "0.5.21"
FIRST_FLASHINFER = "0.7.0"
# The release a host should move to: the newest checked, whose own pin has the kernels.
RECOMMENDED_SGLANG = "0.5.23"
RECOMMENDED_FLASHINFER = "0.7.2"   # what sglang 0.5.23 pins

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
    NO_P2P = "no_p2p"
    NO_GPU = "no_gpu"
    UNKNOWN = "unknown"


@frozen
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
    # What the host's own SGLang and FlashInfer files say (the software probe's ``kernels`` reads,
    # judged by gates/kernels.py); None where they were not read: then the versions decide.
    kernel_reads: Mapping[str, Any] | None = None
    allow_without_p2p: bool = False          # the operator's override of the P2P refusal


@frozen
class PcieIpcVerdict:
    """Whether SGLang's PCIe IPC all-reduce fits one host (``fit``): the first misfit with its reason, the TP
    size of the launch, the warnings it fits with, and the upgrade that would make it fit."""

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


def launch_flags(args: Sequence[str]) -> dict[str, Any]:
    return parse_flags([str(a) for a in args])[0]


def tp_size(args: Sequence[str], gpu_count: int | None) -> int | None:
    text = first_of(launch_flags(args), "tp_size")
    if isinstance(text, str) and text.isdigit():
        return int(text)
    return 1 if text is None and args else None


def activation_dtype(args: Sequence[str], model_dtype: str | None) -> str | None:
    """The dtype the server's activations (and so its all-reduces) run in; None when unknown."""
    given = launch_flags(args).get("dtype")
    if isinstance(given, str) and given != "auto":
        return {"half": "float16", "float": "float32"}.get(given, given)
    return model_dtype


_UPGRADE = (RECOMMENDED_SGLANG, RECOMMENDED_FLASHINFER)


def fit(stack: HostStack) -> PcieIpcVerdict:
    """Whether SGLang's PCIe IPC all-reduce fits this host, and why. The rules are the catalog's
    (``pcie_ipc_allreduce``: its ``kernels:`` judged by gates/kernels.py, its ``fits:`` by
    gates/fits.py, as ``inspect host`` judges them); this names the first that fails, in this
    order: an NVLink host never wants it; then the release, FlashInfer, the TP size, dtype,
    determinism, peer-to-peer, and what would make it fit."""
    from gpuops.gates.catalog import load_catalog

    feature = load_catalog().feature("pcie_ipc_allreduce")
    # A stack's versions are what a probe found: None is "not installed" (judged against the reads
    # when there are some, else against nothing read at all).
    reads = stack.kernel_reads if stack.kernel_reads is not None else {}
    tp = tp_size(stack.launch_args, stack.gpu_count)
    group = fits.tp_group(stack.launch_env.get("CUDA_VISIBLE_DEVICES"), stack.gpu_count, tp)
    shape = fits.HostShape(
        tp_size=tp, dtype=activation_dtype(stack.launch_args, stack.model_dtype),
        deterministic=fits.deterministic_collectives(launch_flags(stack.launch_args), stack.launch_env),
        nvlink=stack.nvlink, p2p_gaps=fits.p2p_gaps(stack.p2p_failed_pairs, group))
    judged = {v.fit.kind: v for v in fits.judge_fits(feature, shape, reads)}
    needs = {n.need.provider: n for n in kernels.judge_feature(feature, reads, {"sglang": stack.sglang,
                                                                                "flashinfer": stack.flashinfer}, None)}

    def failing(kind: str) -> fits.FitVerdict | None:
        verdict = judged.get(kind)
        return verdict if verdict is not None and verdict.holds is False else None

    if failing("interconnect"):
        return PcieIpcVerdict(False, judged["interconnect"].reason, Misfit.NVLINK)
    if not stack.gpu_count:
        return PcieIpcVerdict(False, "no GPUs found on this host", Misfit.NO_GPU)
    release = needs["sglang"]
    if stack.sglang is None or release.status is kernels.KernelStatus.UNKNOWN:
        return PcieIpcVerdict(False, f"the SGLang release is unknown ({stack.sglang or 'not found'}); the PCIe IPC all-reduce "
                          f"needs sglang >= {FIRST_SGLANG} ({release.reason})", Misfit.UNKNOWN)
    if release.status is kernels.KernelStatus.BLOCKED:
        return PcieIpcVerdict(False, f"{release.reason}; upgrade to {RECOMMENDED_SGLANG} (it pins flashinfer "
                          f"{RECOMMENDED_FLASHINFER})", Misfit.SGLANG_TOO_OLD, upgrade=_UPGRADE)
    library = needs["flashinfer"]
    if library.status is not kernels.KernelStatus.OPEN:
        first = "" if FIRST_FLASHINFER in library.reason else f"; FlashInfer {FIRST_FLASHINFER} is the first with it"
        return PcieIpcVerdict(False, f"{library.reason}{first} (sglang {RECOMMENDED_SGLANG} pins {RECOMMENDED_FLASHINFER}); "
                          "SGLang would log \"falling back to NCCL all-reduce\"", Misfit.FLASHINFER_LACKS,
                   upgrade=_UPGRADE)
    if tp is None:
        return PcieIpcVerdict(False, "the server's launch (sglang_args) is unknown: cannot tell its TP size", Misfit.UNKNOWN)
    for kind, misfit in (("tp_size", Misfit.TP_SIZE), ("dtype", Misfit.DTYPE), ("deterministic", Misfit.DETERMINISTIC)):
        verdict = failing(kind)
        if verdict is not None:
            return PcieIpcVerdict(False, verdict.reason, misfit, tp)
    warnings = []
    if failing("p2p"):
        # The kernels write straight into the peers' slabs through CUDA IPC pointers
        # (flashinfer/data/csrc/pcie_ipc_all_reduce.cu: "entry i must address rank i's slab").
        gaps = shape.p2p_gaps or ()
        why = (f"peer-to-peer is not possible between {len(gaps)} GPU pair(s) of the TP group "
               f"({', '.join(gaps[:3])}{', ...' if len(gaps) > 3 else ''}): the PCIe IPC kernels write into the "
               "peers' memory through CUDA IPC")
        if not stack.allow_without_p2p:
            return PcieIpcVerdict(False, why + "; keep TP within a P2P group, or pass -e pcie_allow_without_p2p=true (the "
                                    "server's log after the restart then says whether the workspace was built)",
                       Misfit.NO_P2P, tp)
        warnings.append(why + " (going ahead: pcie_allow_without_p2p is true; the server's log after the restart "
                              "says whether the workspace was built)")
    return PcieIpcVerdict(True, f"sglang {stack.sglang} with flashinfer {stack.flashinfer}, TP {tp}, "
                     f"{shape.dtype or 'bf16 (assumed: dtype not given)'}, PCIe only", None, tp, tuple(warnings))


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
