"""Correctness of FlashInfer's PCIe IPC all-reduce against NCCL's, on every rank (issue 32).

    torchrun --standalone --nproc-per-node N benchmarks/device/pcie_ipc_check.py [TOKENS] [HIDDEN]

Builds the workspace as gpuops' worker does (gpuops.remote.allreduce_bench.PcieIpc, i.e. as SGLang's
pcie_ipc_ar.py), then for each token count: a bf16 input different on each rank, the PCIe IPC result
beside ``dist.all_reduce``'s of the same input, eager and replayed from a CUDA graph. Each rank
prints one line per size ``PCIE-CHECK rank=R world=W tokens=T mode=M max_abs=... ref_max=... ok=...``;
the exit status is 1 where any rank's result is off by more than bf16 summation noise allows.
"""

import sys

import torch
import torch.distributed as dist

from gpuops.remote.allreduce_bench import PcieIpc


def main():
    tokens = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,4,8,16,64,256").split(",")]
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 7168
    dist.init_process_group(backend="nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    pcie = PcieIpc(hidden * max(tokens), hidden, tokens)
    bad = 0
    for t in tokens:
        gen = torch.Generator(device="cuda").manual_seed(1000 * t + rank)
        x = torch.randn(t, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        ref = x.clone()
        dist.all_reduce(ref)
        results = {"eager": pcie.all_reduce(x)}
        torch.cuda.synchronize()
        try:
            inp = x.clone()
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                pcie.all_reduce(inp)   # warm up on the capture stream (rebinds it)
                torch.cuda.synchronize()
                with torch.cuda.graph(graph, stream=stream):
                    out = pcie.all_reduce(inp)
            graph.replay()
            torch.cuda.synchronize()
            results["graph"] = out.clone()
            del graph
        except Exception as exc:  # reported, not fatal: the eager figure still stands
            print("PCIE-CHECK rank=%d world=%d tokens=%d mode=graph error=%s: %s"
                  % (rank, world, t, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else ""), flush=True)
        for mode, got in results.items():
            diff = (got.float() - ref.float()).abs().max().item()
            scale = ref.float().abs().max().item()
            ok = diff <= 0.02 * max(scale, 1.0)   # bf16 sums in another order: a few ulps of the largest value
            bad += not ok
            print("PCIE-CHECK rank=%d world=%d tokens=%d mode=%s max_abs=%.4g ref_max=%.4g ok=%s"
                  % (rank, world, t, mode, diff, scale, ok), flush=True)
    torch.cuda.synchronize()
    pcie.destroy()
    flag = torch.tensor([bad], device="cuda")
    dist.all_reduce(flag)
    dist.destroy_process_group()
    sys.exit(1 if flag.item() else 0)


if __name__ == "__main__":
    main()
