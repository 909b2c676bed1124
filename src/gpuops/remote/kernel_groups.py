"""What a GPU kernel is, from its name in a trace: a group (all-reduce, other collectives, GEMM,
attention, MoE, norm and activation, sampling, memory copies, other) and, for a collective, which
implementation ran it.

The collectives' names were read from the real libraries, never guessed:

- NCCL (``src/device/generate.py``): ``ncclDevKernel_<Coll>[_<RedOp>_<type>]_<ALGO>_<PROTO>``
  (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``), ``ncclDevKernel_SendRecv``,
  ``ncclDevKernel_Generic``; NCCL 2.18 and older: ``ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>``.
  Algorithms TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT; protocols LL, LL128,
  SIMPLE. NCCL specialises few kernels (a collective, Sum, its type, RING or TREE, LL) and runs the
  algorithm and protocol it chose inside one of them: the name says which kernel ran.
- SGLang's custom all-reduce (sgl-kernel 0.3.21 / sglang-kernel 0.4.10 ``common_ops``):
  ``sglang::cross_device_reduce_1stage<T, N>`` and ``..._2stage<T, N>``.
- FlashInfer's PCIe IPC all-reduce (0.7.1 ``include/flashinfer/comm/pcie_ipc_all_reduce.cuh``):
  kernels in ``flashinfer::comm::pcie_ipc`` (``push_oneshot_param_kernel``,
  ``ipc_rsag_push_param_kernel``, ``ipc_topo_rsag8_*``, ``ipc_tp2_remote_push_kernel``, ...).
- FlashInfer's fused all-reduce + RMSNorm (0.7.1 ``trtllm_allreduce_fusion.cuh``):
  ``flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport`` and
  ``..._twoshot_sync``.

Host code: stdlib only, Python 3.8+.
"""

import re

ALLREDUCE = "allreduce"
GROUPS = (ALLREDUCE, "collective", "gemm", "attention", "moe", "norm_activation", "sampling", "memcpy", "other")

NCCL_ALGOS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "NVLS", "TREE", "RING", "PAT")
NCCL_PROTOS = ("LL128", "LL", "SIMPLE")
_NCCL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z0-9_]+)")

CUSTOM_ALLREDUCE = "SGLang custom all-reduce"
PCIE_IPC_ALLREDUCE = "PCIe IPC all-reduce (FlashInfer)"
FUSED_ALLREDUCE = "fused all-reduce+RMSNorm (FlashInfer)"

# (group, words in the lower-cased name), the first that matches wins: MoE before GEMM (a grouped
# MoE GEMM is MoE), attention before sampling (softmax inside attention kernels).
_WORDS = (
    ("moe", ("moe", "expert", "topk_softmax", "moe_align", "fused_experts", "_fwd_kernel_ep_")),
    # SGLang's triton attention (kernels/ops/attention/: decode_attention's _fwd_kernel_stage1/2,
    # extend_attention's and prefill_attention's _fwd_kernel), as the real 0.5.16 traces name them
    ("attention", ("attention", "attn", "fmha", "flash_fwd", "flashmla", "mla_", "batchdecode", "batchprefill",
                   "pagedkv", "paged_kv", "mha_", "_mha", "merge_state", "cascade", "decode_kernel", "_fwd_kernel",
                   "_fwd_grouped_kernel")),
    ("gemm", ("gemm", "gemv", "cutlass", "cublas", "nvjet", "xmma", "matmul", "splitkreduce", "sm90_", "sm80_",
              "ampere_", "hopper_", "bmm", "dot_kernel")),
    ("norm_activation", ("rmsnorm", "rms_norm", "layernorm", "layer_norm", "norm_kernel", "silu", "gelu",
                         "act_and_mul", "activation", "swiglu", "relu")),
    ("sampling", ("sampling", "sample", "top_k", "topk", "top_p", "topp", "argmax", "multinomial", "logits",
                  "softmax")),
)


def nccl_parts(name):
    """(collective, algorithm, protocol) of an NCCL kernel's name (algorithm and protocol None
    where the name has none), or None for a name that is not NCCL's."""
    found = _NCCL.search(name)
    if not found:
        return None
    tail = found.group(1)
    coll = tail.split("_", 1)[0]
    algo = next((a for a in NCCL_ALGOS if re.search(r"(?:^|_)%s(?:_|$)" % a, tail)), None)
    proto = next((p for p in NCCL_PROTOS if re.search(r"(?:^|_)%s(?:_|$)" % p, tail)), None)
    return coll, algo, proto


def classify(name, category="kernel"):
    """(group, implementation) of one GPU event; implementation names a collective's (``NCCL
    RING_LL``, ``SGLang custom all-reduce``, ...), else None."""
    if category in ("gpu_memcpy", "gpu_memset") or name.startswith(("Memcpy", "Memset")):
        return "memcpy", None
    nccl = nccl_parts(name)
    if nccl is not None:
        coll, algo, proto = nccl
        how = "NCCL" + (" %s_%s" % (algo, proto) if algo and proto else "")
        if coll == "AllReduce":
            return ALLREDUCE, how
        return "collective", "%s %s" % (how, coll)
    if name.startswith("gloo:"):  # a CPU trace's collective (torch's ProcessGroupGloo)
        return (ALLREDUCE, "gloo (CPU)") if name == "gloo:all_reduce" else ("collective", "gloo (CPU) " + name[5:])
    if "cross_device_reduce" in name:
        return ALLREDUCE, CUSTOM_ALLREDUCE
    if "allreduce_fusion" in name:
        return ALLREDUCE, FUSED_ALLREDUCE
    if "pcie_ipc" in name and "gather" not in name and "scatter" not in name:
        return ALLREDUCE, PCIE_IPC_ALLREDUCE
    lowered = name.lower()
    for group, words in _WORDS:
        if any(w in lowered for w in words):
            return group, None
    return "other", None
