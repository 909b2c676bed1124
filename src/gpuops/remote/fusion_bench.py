"""Fused all-reduce + residual-add + RMSNorm vs the unfused path, one rank per GPU under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node N fusion_bench.py CONFIG.json

What SGLang runs with ``--enable-flashinfer-allreduce-fusion`` after each attention and MoE block
is FlashInfer's ``trtllm_allreduce_fusion`` (pattern kARResidualRMSNorm) on an IPC workspace from
``trtllm_create_ipc_workspace_for_all_reduce_fusion``; the call below uses the arguments SGLang's
``flashinfer_comm_fusion.py`` passes (PDL on, one-shot chosen by FlashInfer's heuristic, no fp32
accumulation, no completion trigger, max_token_num 2048). The fair unfused baseline is what runs
without fusion: an all-reduce, then ONE fused add+RMSNorm kernel (FlashInfer's
``fused_add_rmsnorm``). Two all-reduces are timed for it: NCCL's (``torch.distributed``), and the
same FlashInfer IPC kernel doing the all-reduce alone (a stand-in for SGLang's custom all-reduce,
which is what SGLang uses for small messages on NVLink).

Each size is timed eagerly and replayed from a CUDA graph (as SGLang's decode does). Correctness:
fused and unfused outputs (normed and residual) are compared to a float32 reference computed from
the same inputs; a bf16 result passes when ||out - ref|| / ||ref|| <= ``tolerance`` (1e-2).
Outputs are poisoned with NaN before the checked call so an unwritten element fails.

Rank 0 prints one frame per size and mode (``GPUOPS-BENCH <run_id> fusion <json>``), or one frame
with ``"ok": false`` and the reason when the kernel cannot run here (no CUDA, world size 1, no P2P
between two GPUs of the group, FlashInfer missing, a capability the kernel lacks).
"""

import gc
import json
import os
import statistics
import sys

FRAME = "GPUOPS-BENCH"
TOLERANCE = 1e-2  # bf16 operands: relative L2 error against a float32 reference
SGLANG_MAX_TOKEN_NUM = 2048
EPS = 1e-6


def emit(run_id, record):
    sys.stdout.write("%s %s fusion %s\n" % (FRAME, run_id, json.dumps(record, separators=(",", ":"))))
    sys.stdout.flush()


def first_line(exc):
    return "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:300])


def cannot_run(torch, world, local_rank):
    """Why the fused kernel cannot run in this process group, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch: the fused kernel needs NVIDIA GPUs"
    if world < 2:
        return "world size %d: there is nothing to all-reduce (the fused kernel needs 2 or more GPUs)" % world
    major, minor = torch.cuda.get_device_capability(local_rank)
    if major < 9:
        return ("compute capability %d.%d: FlashInfer's trtllm all-reduce fusion needs sm90 or newer"
                % (major, minor))
    count = torch.cuda.device_count()
    for a in range(min(world, count)):
        for b in range(min(world, count)):
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return ("no P2P access from GPU %d to GPU %d: the fused kernel reads its peers' memory "
                        "through CUDA IPC, so every GPU pair of the TP group needs P2P" % (a, b))
    return None


def main():
    with open(sys.argv[1]) as handle:
        config = json.load(handle)
    run_id = config.get("run_id", "local")
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    base = {"variant": config.get("variant") or {}, "hidden_size": int(config.get("hidden_size", 7168)),
            "world_size": world_env, "dtype": config.get("dtype", "bfloat16"),
            "allreduces_per_step": int(config.get("allreduces_per_step", 122)), "tolerance": TOLERANCE}
    reason = cannot_run(torch, world_env, local_rank)
    if reason is None:
        try:
            import flashinfer
            import flashinfer.comm as comm
            from flashinfer.norm import fused_add_rmsnorm
            base["flashinfer_version"] = getattr(flashinfer, "__version__", None)
        except Exception as exc:
            reason = "FlashInfer is not importable by %s (%s)" % (sys.executable, first_line(exc))
    if reason is not None:
        if local_rank == 0:
            emit(run_id, dict(base, ok=False, error=reason))
        return
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group(backend="nccl", device_id=device)
    try:
        run(config, run_id, base, torch, dist, comm, fused_add_rmsnorm, device)
    finally:
        gc.collect()
        torch.cuda.synchronize()
        dist.destroy_process_group()


def run(config, run_id, base, torch, dist, comm, fused_add_rmsnorm, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = base["hidden_size"]
    dtype = getattr(torch, base["dtype"])
    tokens_list = [int(t) for t in config.get("tokens", [1, 2, 4, 8, 16, 32, 64, 128, 256])]
    iters = int(config.get("iters", 50))
    trials = int(config.get("trials", 5))
    warmup = int(config.get("warmup", 10))
    max_tokens = max(SGLANG_MAX_TOKEN_NUM, max(tokens_list))
    major, minor = torch.cuda.get_device_capability(device)
    base.update({"backend": "nccl", "compute_capability": "%d.%d" % (major, minor),
                 "gpu": torch.cuda.get_device_name(device), "iters": iters, "trials": trials,
                 "nccl_version": ".".join(str(x) for x in torch.cuda.nccl.version()),
                 "torch_version": torch.__version__})
    try:
        ipc_handles, workspace = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            tp_rank=rank, tp_size=world, max_token_num=max_tokens, hidden_dim=hidden,
            group=dist.group.WORLD, use_fp32_lamport=False)
    except Exception as exc:
        if rank == 0:
            emit(run_id, dict(base, ok=False, error="cannot create the fusion workspace: " + first_line(exc)))
        return
    gen = torch.Generator(device=device)
    try:
        for tokens in tokens_list:
            gen.manual_seed(1000 * tokens + rank)
            try:
                case = Case(torch, dist, comm, fused_add_rmsnorm, workspace, tokens, hidden, dtype, device, gen,
                            rank, world)
                check = case.check()
            except Exception as exc:  # one size failing (e.g. out of the workspace) is reported, not fatal
                if rank == 0:
                    emit(run_id, dict(base, tokens=tokens, ok=False, error=first_line(exc)))
                continue
            for use_graph in (False, True):
                record = dict(base, tokens=tokens, cuda_graph=use_graph, bytes=tokens * hidden * dtype.itemsize)
                record.update(check)
                try:
                    record.update(case.timings(use_graph, iters, warmup, trials))
                    per_step = base["allreduces_per_step"]
                    for name in ("fused", "unfused_nccl", "unfused_ipc", "nccl_allreduce"):
                        if name + "_us" in record:
                            record[name + "_step_ms"] = record[name + "_us"] * per_step / 1000.0
                    if "saving_us" in record:
                        record["saving_step_ms"] = record["saving_us"] * per_step / 1000.0
                    record["ok"] = bool(check["correct"])
                    if not check["correct"]:
                        record["error"] = "fused output differs from the float32 reference beyond %g" % TOLERANCE
                except Exception as exc:
                    record.update({"ok": False, "error": first_line(exc)})
                finally:
                    case.release()
                if rank == 0:
                    emit(run_id, record)
    finally:
        gc.collect()
        torch.cuda.synchronize()
        dist.barrier()
        comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(ipc_handles, group=dist.group.WORLD)


class Case(object):
    """One token count: inputs, the three paths, their check and their timings."""

    def __init__(self, torch, dist, comm, fused_add_rmsnorm, workspace, tokens, hidden, dtype, device, gen,
                 rank, world):
        self.torch, self.dist, self.comm, self.norm = torch, dist, comm, fused_add_rmsnorm
        self.workspace, self.tokens, self.hidden, self.rank, self.world = workspace, tokens, hidden, rank, world
        shape = (tokens, hidden)
        self.x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
        self.residual = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
        # gamma must be the same on every rank (it is a model weight): one seed for all
        g = torch.Generator(device=device)
        g.manual_seed(7)
        self.gamma = (1.0 + 0.1 * torch.randn(hidden, generator=g, device=device)).to(dtype)
        self.norm_out = torch.empty_like(self.x)
        self.residual_out = torch.empty_like(self.x)
        self.ar_out = torch.empty_like(self.x)
        # unfused buffers: the all-reduce and the norm work in place, as in a decoder layer
        self.work = self.x.clone()
        self.work_res = self.residual.clone()
        self.graphs = []

    # -- the three paths ---------------------------------------------------------------------
    def fused(self):
        self.comm.trtllm_allreduce_fusion(
            allreduce_in=self.x, world_size=self.world, world_rank=self.rank, token_num=self.tokens,
            hidden_dim=self.hidden, workspace_ptrs=self.workspace, launch_with_pdl=True, use_oneshot=None,
            trigger_completion_at_end=False, fp32_acc=False,
            pattern_code=self.comm.AllReduceFusionPattern.kARResidualRMSNorm, allreduce_out=None,
            residual_in=self.residual, residual_out=self.residual_out, norm_out=self.norm_out, quant_out=None,
            scale_out=None, rms_gamma=self.gamma, rms_eps=EPS, scale_factor=None, layout_code=None)

    def unfused_nccl(self):
        # work <- allreduce(work); work_res += work; work <- rmsnorm(work_res) * gamma (chained like layers)
        self.dist.all_reduce(self.work)
        self.norm(self.work, self.work_res, self.gamma, EPS)

    def unfused_ipc(self):
        self.comm.trtllm_allreduce_fusion(
            allreduce_in=self.work, world_size=self.world, world_rank=self.rank, token_num=self.tokens,
            hidden_dim=self.hidden, workspace_ptrs=self.workspace, launch_with_pdl=True, use_oneshot=None,
            trigger_completion_at_end=False, fp32_acc=False,
            pattern_code=self.comm.AllReduceFusionPattern.kAllReduce, allreduce_out=self.ar_out,
            residual_in=None, residual_out=None, norm_out=None, quant_out=None, scale_out=None, rms_gamma=None,
            rms_eps=None, scale_factor=None, layout_code=None)
        self.norm(self.ar_out, self.work_res, self.gamma, EPS)

    def nccl_only(self):
        self.dist.all_reduce(self.work)

    # -- correctness -------------------------------------------------------------------------
    def reference(self):
        torch = self.torch
        summed = self.x.float().clone()
        self.dist.all_reduce(summed)
        res = summed + self.residual.float()
        norm = res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + EPS) * self.gamma.float()
        return norm, res

    def rel(self, out, ref):
        torch = self.torch
        if not bool(torch.isfinite(out).all()):
            return float("inf")
        return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))

    def check(self):
        torch = self.torch
        ref_norm, ref_res = self.reference()
        self.norm_out.fill_(float("nan"))
        self.residual_out.fill_(float("nan"))
        self.fused()
        torch.cuda.synchronize()
        fused_norm, fused_res = self.rel(self.norm_out, ref_norm), self.rel(self.residual_out, ref_res)
        work, work_res = self.x.clone(), self.residual.clone()
        self.dist.all_reduce(work)
        self.norm(work, work_res, self.gamma, EPS)
        torch.cuda.synchronize()
        unfused_norm, unfused_res = self.rel(work, ref_norm), self.rel(work_res, ref_res)
        worst = max(fused_norm, fused_res, unfused_norm, unfused_res)
        # every rank must agree, or one rank's bad output hides behind rank 0's good one
        flag = torch.tensor([worst], dtype=torch.float64, device=self.x.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        worst = float(flag.item())
        return {"rel_err_fused_norm": fused_norm, "rel_err_fused_residual": fused_res,
                "rel_err_unfused_norm": unfused_norm, "rel_err_unfused_residual": unfused_res,
                "rel_err_worst_rank": worst, "correct": worst <= TOLERANCE}

    # -- timing ------------------------------------------------------------------------------
    def runner(self, fn, use_graph, iters):
        torch = self.torch
        if not use_graph:
            def run(n):
                for _ in range(n):
                    fn()
            return run
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
        torch.cuda.synchronize()
        self.graphs.append(graph)
        index = len(self.graphs) - 1
        graphs = self.graphs

        def replay(n):
            for _ in range(max(1, n // iters)):
                graphs[index].replay()
        return replay

    def time_one(self, fn, use_graph, iters, warmup, trials):
        torch = self.torch
        run = self.runner(fn, use_graph, iters)
        run(iters if use_graph else warmup)
        torch.cuda.synchronize()
        samples = []
        for _ in range(trials):
            self.dist.barrier()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            run(iters)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000.0 / iters
            value = torch.tensor([seconds], dtype=torch.float64, device=self.x.device)
            self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX)  # a collective ends with its slowest rank
            samples.append(float(value.item()) * 1e6)
        return statistics.median(samples), samples

    def timings(self, use_graph, iters, warmup, trials):
        out = {}
        for name, fn in (("fused", self.fused), ("unfused_nccl", self.unfused_nccl),
                         ("unfused_ipc", self.unfused_ipc), ("nccl_allreduce", self.nccl_only)):
            try:
                median, samples = self.time_one(fn, use_graph, iters, warmup, trials)
                out[name + "_us"] = median
                out[name + "_us_trials"] = samples
            except Exception as exc:
                if name == "fused":
                    raise
                out[name + "_error"] = first_line(exc)
        if "unfused_nccl_us" in out:
            out["saving_us"] = out["unfused_nccl_us"] - out["fused_us"]
            out["speedup"] = out["unfused_nccl_us"] / out["fused_us"] if out["fused_us"] > 0 else None
        if "unfused_ipc_us" in out:
            out["saving_vs_ipc_us"] = out["unfused_ipc_us"] - out["fused_us"]
        return out

    def release(self):
        self.graphs[:] = []
        gc.collect()
        self.torch.cuda.synchronize()


if __name__ == "__main__":
    main()
