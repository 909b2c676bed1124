"""All-reduce microbenchmark, one rank per process under torchrun (host's torch; Python 3.8+).

    python -m torch.distributed.run --standalone --nproc-per-node N allreduce_bench.py CONFIG.json

It times ``all_reduce`` at the message sizes a decode or verify step really sends: hidden size x
tokens in flight x dtype (7168 x {1, 4, 8, 16, 64} x bf16 for a Kimi/DeepSeek-like model). The
NCCL variant (NCCL_ALGO, NCCL_PROTO, ...) is the process environment, set by the caller, because
NCCL reads it once at communicator creation.

With ``cuda_graph`` the all-reduces are captured into a CUDA graph and replayed, as SGLang does for
decode; that is also where some NCCL settings fail (the field report's NCCL_ALGO=Tree), and such a
failure is reported as a measurement error, not a crash of the whole run.

Rank 0 prints one framed line per size (``GPUOPS-BENCH <run_id> allreduce <json>``); the latency
of a trial is the slowest rank's, since a collective is only done when every rank is.

With ``kernel: pcie_ipc`` the all-reduce is FlashInfer's PCIe IPC kernel, called as SGLang
0.5.21+'s ``srt/distributed/device_communicators/pcie_ipc_ar.py`` calls it: one
``flashinfer.comm.PcieIpcAllReduceWorkspace(group=..., max_numel=..., dtype=torch.bfloat16,
tune_batches=..., tune_cache=...)`` built on the NCCL group and sized for the largest message,
``tune([hidden], dtype=torch.bfloat16, tune_group=<gloo group>)`` once, then per call
``rebind_stream()`` when the stream changed (graph capture, then replay) and ``all_reduce(inp)``
(out of place); ``destroy()`` at the end. Where it cannot run (no CUDA, a world size other than
2, 4 or 8, not bf16, a FlashInfer without ``pcie_ipc_comm``) every size is recorded as skipped
with that one-line reason, and nothing is timed.

With ``kernel: custom`` it is SGLang's own custom all-reduce (``srt/distributed/device_communicators/
custom_all_reduce.py::CustomAllreduce`` on a gloo group of the same ranks, as SGLang builds it):
``custom_all_reduce(inp)`` per call, the CUDA graph captured inside its ``capture()`` (which
registers the graph's buffers at the end, as SGLang's graph runner does). Where SGLang turns it off
(``disabled``: more than two PCIe-only GPUs, no P2P, a world size outside 2, 4, 6, 8, no sgl-kernel
ops) or cannot be imported, every size is skipped with that reason.

``kernels`` lists several of them: each is measured in turn in the same launch (the same process
group and GPUs), its records marked with its name, so NCCL, the PCIe IPC kernel and SGLang's custom
all-reduce come out side by side; one that cannot run is skipped and the next is measured.

Teardown order matters: a CUDA graph that captured NCCL calls must be gone (deleted, collected,
device synchronized) before ``destroy_process_group``; with a graph still alive both ranks hung in
the destroy on two H200s (torch 2.11, NCCL 2.28), after every size had been measured.
"""

import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

FRAME = "GPUOPS-BENCH"


def emit(run_id, record):
    sys.stdout.write("%s %s allreduce %s\n" % (FRAME, run_id, json.dumps(record, separators=(",", ":"))))
    sys.stdout.flush()


def pick_dtype(name, backend, device):
    dtype = getattr(torch, name)
    if backend == "gloo":
        probe = torch.zeros(4, dtype=dtype, device=device)
        try:
            dist.all_reduce(probe)
        except RuntimeError:
            # Older gloo builds lack bf16 sums; keep the byte count with another 2-byte type.
            return torch.float16 if dtype.itemsize == 2 else torch.float32, True
    return dtype, False


class Timer(object):
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, iters):
        """Seconds per call of ``fn`` over ``iters`` calls."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(iters)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1000.0 / iters
        t0 = time.perf_counter()
        fn(iters)
        return (time.perf_counter() - t0) / iters


def eager_runner(tensor, reduce=None):
    reduce = reduce or dist.all_reduce

    def run(iters):
        for _ in range(iters):
            reduce(tensor)
    return run


def graph_runner(tensor, iters, reduce=None, capture=None):
    """Capture ``iters`` all-reduces in one CUDA graph; each replay runs them all. ``capture``: a
    context manager the warm-up and capture run inside (SGLang's custom all-reduce registers the
    graph's buffers when its ``capture()`` ends).

    The graph lives only in ``run.holder`` (never in a closure cell), so ``release`` can drop it.
    """
    import contextlib

    reduce = reduce or dist.all_reduce
    holder = {"graph": torch.cuda.CUDAGraph()}
    context = capture() if capture is not None else contextlib.nullcontext()
    with context:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                reduce(tensor)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(holder["graph"]):
            for _ in range(iters):
                reduce(tensor)
    torch.cuda.synchronize()

    def run(replays):
        for _ in range(max(1, replays // iters)):
            holder["graph"].replay()
    run.holder = holder
    return run


def release(runner):
    """Drop a runner's CUDA graph (if any): deleted, collected, device synchronized."""
    holder = getattr(runner, "holder", None)
    if holder and holder.get("graph") is not None:
        graph = holder.pop("graph")
        try:
            graph.reset()
        except Exception:
            pass  # an older torch without reset(): dropping the last reference is what counts
        del graph
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


PCIE_IPC_WORLD_SIZES = (2, 4, 8)   # pcie_ipc_ar.py _SUPPORTED_WORLD_SIZES


def pcie_ipc_unavailable(device, world, dtype):
    """Why FlashInfer's PCIe IPC all-reduce cannot run here (one line), or None."""
    if device.type != "cuda":
        return "the PCIe IPC kernels run on CUDA GPUs only (this run is on %s)" % device.type
    if world not in PCIE_IPC_WORLD_SIZES:
        return "world size %d: the PCIe IPC kernels serve 2, 4 or 8 ranks" % world
    if dtype != torch.bfloat16:
        return "%s: SGLang hands only bf16 all-reduces to the PCIe IPC kernels" % str(dtype).replace("torch.", "")
    try:
        from flashinfer.comm import PcieIpcAllReduceWorkspace  # noqa: F401
    except ImportError as exc:
        try:
            from importlib import metadata
            version = metadata.version("flashinfer-python")
        except Exception:
            version = None
        return ("FlashInfer %s has no pcie_ipc_comm (flashinfer.comm.PcieIpcAllReduceWorkspace; 0.7.0 is the first "
                "with it): %s" % (version or "(not installed)", str(exc).splitlines()[0][:120] if str(exc) else "ImportError"))
    return None


class PcieIpc(object):
    """FlashInfer's PCIe IPC all-reduce, built and called as SGLang's PcieIpcCommunicator does."""

    def __init__(self, max_numel, hidden, tokens):
        from flashinfer.comm import PcieIpcAllReduceWorkspace

        self.cpu_group = dist.new_group(backend="gloo")   # autotuning rendezvouses on the host
        tune_cache = None
        try:
            from flashinfer.comm.pcie_ipc_tuning import default_cache_path
            tune_cache = str(default_cache_path(dist.get_world_size()))
        except (AttributeError, ImportError):
            pass
        self.workspace = PcieIpcAllReduceWorkspace(group=dist.group.WORLD, max_numel=max_numel, dtype=torch.bfloat16,
                                                   tune_batches=tuple(int(t) for t in tokens), tune_cache=tune_cache)
        self.bound = None
        try:
            self.workspace.tune([hidden], dtype=torch.bfloat16, tune_group=self.cpu_group)
        except Exception:
            pass  # SGLang keeps the seed policy then, and so does this measurement

    def all_reduce(self, tensor):
        stream = torch.cuda.current_stream()
        if self.bound is None or stream != self.bound:
            self.workspace.rebind_stream()
            self.bound = stream
        return self.workspace.all_reduce(tensor)

    def destroy(self):
        self.workspace.destroy()


def custom_unavailable(device):
    """Why SGLang's custom all-reduce cannot even be tried here (one line), or None."""
    if device.type != "cuda":
        return "SGLang's custom all-reduce runs on CUDA GPUs only (this run is on %s)" % device.type
    try:
        from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce  # noqa: F401
    except Exception as exc:  # ImportError, or the release's own import-time checks
        return "SGLang's custom all-reduce cannot be imported: %s: %s" % (
            type(exc).__name__, (str(exc).splitlines() or [""])[0][:160])
    return None


class CustomAr(object):
    """SGLang's custom all-reduce, built as its parallel state builds it (a gloo group of the same
    ranks, this rank's device), called through ``custom_all_reduce`` as its communicator does."""

    def __init__(self, device):
        from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        self.cpu_group = dist.new_group(backend="gloo")
        self.comm = CustomAllreduce(group=self.cpu_group, device=device)
        if self.comm.disabled:
            raise Unavailable("SGLang's CustomAllreduce turned itself off on this host (it does on more than two "
                              "PCIe-only GPUs, without P2P between the ranks, or outside world sizes 2, 4, 6, 8; "
                              "its warning is in the worker's log)")
        self.capture = self.comm.capture

    def all_reduce(self, tensor):
        out = self.comm.custom_all_reduce(tensor)
        if out is None:  # larger than its buffer, or not 16-byte aligned: SGLang uses NCCL then
            raise Unavailable("SGLang's custom all-reduce does not take a %d-byte message (max_size %d)"
                              % (tensor.numel() * tensor.element_size(), self.comm.max_size))
        return out

    def destroy(self):
        self.comm.close()


class Unavailable(Exception):
    """The kernel cannot run here; the message is the one-line reason (sizes are skipped with it)."""


def open_kernel(kernel, device, world, dtype, hidden, sizes):
    """(the communicator, or None for NCCL's own; the reason it is skipped, or None)."""
    if kernel == "nccl":
        return None, None
    if kernel == "pcie_ipc":
        skipped = pcie_ipc_unavailable(device, world, dtype)
        if skipped is not None:
            return None, skipped
        try:
            return PcieIpc(hidden * max(sizes), hidden, sizes), None
        except Exception as exc:  # SGLang logs it and keeps NCCL: "reductions stay on NCCL"
            return None, "the PCIe IPC workspace failed: %s: %s" % (type(exc).__name__,
                                                                    (str(exc).splitlines() or [""])[0][:200])
    if kernel == "custom":
        skipped = custom_unavailable(device)
        if skipped is not None:
            return None, skipped
        try:
            return CustomAr(device), None
        except Unavailable as exc:
            return None, str(exc)
        except Exception as exc:
            return None, "SGLang's custom all-reduce failed to start: %s: %s" % (
                type(exc).__name__, (str(exc).splitlines() or [""])[0][:200])
    return None, "unknown kernel %r (nccl, pcie_ipc or custom)" % kernel


def slowest_rank(seconds, device):
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def main():
    with open(sys.argv[1]) as handle:
        config = json.load(handle)
    run_id = config.get("run_id", "local")
    backend = config.get("backend") or ("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype, substituted = pick_dtype(config.get("dtype", "bfloat16"), backend, device)
    use_graph = bool(config.get("cuda_graph")) and device.type == "cuda"
    hidden = int(config.get("hidden_size", 7168))
    iters = int(config.get("iters", 50))
    warmup = int(config.get("warmup", 10))
    trials = int(config.get("trials", 5))
    per_step = int(config.get("allreduces_per_step", 122))
    timer = Timer(device)
    kernels = [str(k) for k in (config.get("kernels") or [config.get("kernel") or "nccl"])]
    sizes = [int(t) for t in config.get("tokens", [1, 4, 8, 16, 64])]
    for kernel in kernels:
        comm, skipped = open_kernel(kernel, device, world, dtype, hidden, sizes)
        reduce = comm.all_reduce if comm is not None else dist.all_reduce
        capture = getattr(comm, "capture", None)
        failed = False
        for tokens in sizes:
            numel = hidden * tokens
            record = {
                "variant": config.get("variant") or {}, "tokens": tokens, "hidden_size": hidden,
                "dtype": str(dtype).replace("torch.", ""), "bytes": numel * dtype.itemsize,
                "world_size": world, "backend": backend, "cuda_graph": use_graph, "iters": iters,
                "allreduces_per_step": per_step, "kernel": kernel,
            }
            if skipped is not None:
                record.update({"ok": False, "skipped": True, "error": "skipped: " + skipped})
                if rank == 0:
                    emit(run_id, record)
                continue
            if substituted:
                record["note"] = "this gloo build cannot sum %s; timed %s of the same size" % (
                    config.get("dtype"), record["dtype"])
            runner = None
            try:
                tensor = torch.zeros(numel, dtype=dtype, device=device)  # zeros: sums never overflow
                runner = graph_runner(tensor, iters, reduce, capture) if use_graph else eager_runner(tensor, reduce)
                eager_runner(tensor, reduce)(warmup) if not use_graph else runner(iters)
                timer.sync()
                samples = []
                for _ in range(trials):
                    dist.barrier()
                    samples.append(slowest_rank(timer.time(runner, iters), device))
                seconds = statistics.median(samples)
                record.update({
                    "ok": True,
                    "latency_us": seconds * 1e6,
                    "latency_us_min": min(samples) * 1e6,
                    "latency_us_trials": [s * 1e6 for s in samples],
                    "algbw_gbps": record["bytes"] / seconds / 1e9,
                    "busbw_gbps": 2.0 * (world - 1) / world * record["bytes"] / seconds / 1e9,
                    "step_cost_ms": seconds * per_step * 1e3,
                })
            except Unavailable as exc:  # this size only (e.g. past the custom all-reduce's buffer)
                record.update({"ok": False, "skipped": True, "error": "skipped: %s" % exc})
            except Exception as exc:  # e.g. NCCL refusing a setting inside graph capture
                record.update({"ok": False, "error": "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])})
                failed = True
            finally:
                if runner is not None:
                    release(runner)
                runner = None
            if rank == 0:
                emit(run_id, record)
            if failed:
                break  # a failed collective leaves the communicator unusable for further sizes
        if comm is not None:
            comm.destroy()
        if failed and kernel == "nccl":
            break  # NCCL's own communicator is the process group's: nothing after it can be trusted
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
