"""The stand-in's profiler (stdlib only, Python 3.8+): ``/start_profile`` and ``/stop_profile`` as
SGLang answers them, and a Chrome trace synthesized from the stand-in's speed model, every figure
SIMULATED (the trace says so at its top: ``gpuops_simulated``), no GPU having run.

As SGLang 0.5.8 and 0.5.16 do (``http_server.py``, ``scheduler_profiler_mixin.py`` /
``scheduler_components/profiler_manager.py``; answers recorded on the real 0.5.16 in
tests/fixtures/real/h200-x1/sglang-0.5.16/profile.json): a start answers 200 "Start profiling.";
a start while one runs, and a stop when none runs (it stopped by itself after ``num_steps``),
answer 500 "Internal Server Error" (the scheduler's refusal raised as a RuntimeError) where the
scheduler checks (a ``profile_by_stage`` start; a plain second start re-starts the profiler: the real
0.5.16 answered it 200, tests/fixtures/real/h200-x1/sglang-0.5.16/profile/README.md). Steps pass
only while generations run, at the speed model's pace; after ``num_steps`` of them every TP rank
writes ``<profile_id>-TP-<rank>[-<STAGE>].trace.json.gz`` into ``output_dir`` (with
``profile_by_stage``: an ``-EXTEND`` file, then a ``-DECODE`` one).

The synthesized trace has SGLang 0.5.16's shape: a ``step[<MODE> bs=1]`` span per forward pass,
its ``cudaGraphLaunch`` and the pass's kernels under the launch's correlation: per all-reduce of
the model's step one all-reduce kernel (NCCL's ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``,
FlashInfer's PCIe IPC or fused all-reduce+RMSNorm kernel, as the server's settings choose) of the
model's time, the compute time split over GEMM, attention, norm and sampling kernels (a split
that is an assumption, as is everything but the all-reduce figures the model is calibrated on).

``GPUOPS_STANDIN_PROFILE_WRITES=0``: the profiler starts but never writes a trace (a lab fault).
"""

import gzip
import json
import os
import tempfile
import threading
import time

START_ROUTE = "/start_profile"
STOP_ROUTE = "/stop_profile"
STARTED = "Start profiling.\n"
STOPPED = "Stop profiling. This will take some time.\n"
REFUSED = "Internal Server Error"

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
PCIE_IPC_KERNEL = ("void flashinfer::comm::pcie_ipc::push_oneshot_param_kernel<__nv_bfloat16>"
                   "(flashinfer::comm::pcie_ipc::PushOneshotParamData<__nv_bfloat16>)")
FUSED_KERNEL = ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>"
                "(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)")
# The compute part of a pass, split (an assumption): (kernel name, share of compute, per all-reduce)
COMPUTE_KERNELS = (
    ("nvjet_tst_128x64_64x8_1x1_v_bz_TNN", 0.60, True),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<false, 128u>(flashinfer::BatchDecodeParams)", 0.25, False),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", 0.10, True),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>(float*)", 0.05, False),
)
GAP_US = 1.0  # between two kernels of a graph


class StandinProfiler(object):
    """One server's profiler: started by a request, stepped by the generations that run."""

    def __init__(self, speed, server_args, environ, running):
        self.speed = speed
        self.tp = max(1, int(server_args.get("tp_size") or 1))
        self.writes = environ.get("GPUOPS_STANDIN_PROFILE_WRITES", "1") != "0"
        self.running = running  # () -> generations running now
        self.lock = threading.Lock()
        self.active = None  # the started profile's settings

    def start(self, body):
        """(status, text) of ``/start_profile``."""
        with self.lock:
            if self.active is not None and body.get("profile_by_stage"):
                return 500, REFUSED  # the scheduler's "already in progress", raised by the route
            if self.active is not None:
                self.active["stop"] = "replaced"  # a plain start re-starts it (0.5.16 answered 200)
            output_dir = body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
            steps = body.get("num_steps")
            self.active = {"output_dir": os.path.expanduser(str(output_dir)),
                           "steps": steps if isinstance(steps, int) and steps > 0 else None,
                           "by_stage": bool(body.get("profile_by_stage")),
                           "profile_id": str(body.get("profile_id") or time.time()),
                           "prefix": str(body.get("profile_prefix") or "")}
            profile = self.active
        worker = threading.Thread(target=self._run, args=(profile,), name="standin-profiler")
        worker.daemon = True
        worker.start()
        return 200, STARTED

    def stop(self):
        """(status, text) of ``/stop_profile``: what ran so far is written."""
        with self.lock:
            profile, self.active = self.active, None
        if profile is None:
            return 500, REFUSED
        profile["stop"] = True
        return 200, STOPPED

    def _run(self, profile):
        """Count the steps that run (one per pass of the model's cycle while a generation runs),
        then write the traces; a stop writes what ran so far."""
        cycle_s = self.speed.prediction.cycle_ms / 1000.0
        passes, extend_written, ran = 0, False, 0.0
        last = time.monotonic()
        while True:
            time.sleep(0.02)
            now = time.monotonic()
            if self.running() > 0:
                ran += now - last
            last = now
            if profile["by_stage"] and not extend_written and ran > 0:
                self._write(profile, "EXTEND", 1)
                extend_written = True
            passes = int(ran / cycle_s)
            done = profile["steps"] is not None and passes > profile["steps"]
            if done or profile.get("stop"):
                break
        with self.lock:
            if self.active is profile:
                self.active = None
        if profile.get("stop") == "replaced":
            return  # its torch profiler was dropped for the new one: nothing written
        self._write(profile, "DECODE" if profile["by_stage"] else None, max(1, min(passes, profile["steps"] or passes)))

    def _write(self, profile, stage, passes):
        if not self.writes:
            return
        try:
            os.makedirs(profile["output_dir"], exist_ok=True)
            for rank in range(self.tp):
                name = ((profile["prefix"] + "-") if profile["prefix"] else "") + "%s-TP-%d%s.trace.json.gz" % (
                    profile["profile_id"], rank, "-" + stage if stage else "")
                document = self.trace(stage or "DECODE", passes)
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=profile["output_dir"])
                with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as handle:
                    handle.write(json.dumps(document).encode())
                os.replace(tmp, os.path.join(profile["output_dir"], name))
        except OSError:
            pass  # as a real server whose trace cannot be written: nothing appears

    def allreduce_kernel(self):
        if self.speed.pcie_ipc:
            return PCIE_IPC_KERNEL
        if self.speed.fusion:
            return FUSED_KERNEL
        return NCCL_KERNEL

    def trace(self, stage, passes):
        """The trace document of ``passes`` passes of the model's cycle (one rank's)."""
        events = []
        clock = [time.time() * 1e6]
        correlation = [0]

        def span(mode):
            return {"ph": "X", "cat": "user_annotation", "name": "step[%s bs=1]" % mode, "pid": 1, "tid": 1,
                    "ts": clock[0], "dur": 40.0}

        def kernel(name, dur_us):
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": clock[0],
                           "dur": round(dur_us, 3), "args": {"correlation": correlation[0], "device": 0,
                                                             "stream": 7}})
            clock[0] += dur_us + GAP_US

        steps = self.speed.prediction.steps
        for _ in range(passes):
            for step in ([s for s in steps if s.kind != "draft"] if stage == "EXTEND" else steps):
                mode = {"decode": "DECODE", "verify": "TARGET_VERIFY", "draft": "DRAFT_EXTEND_V2"}[step.kind]
                mode = "EXTEND" if stage == "EXTEND" else mode
                correlation[0] += 1
                events.append(span(mode))
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
                               "ts": clock[0] + 5.0, "dur": 10.0, "args": {"correlation": correlation[0]}})
                clock[0] += 20.0
                self._pass_kernels(step, kernel)
                clock[0] += 50.0
        return {"schemaVersion": 1, "gpuops_simulated": True,
                "gpuops_note": "SIMULATED by gpuops' lab stand-in from its speed model %s; no GPU ran"
                % self.speed.record().get("label"),
                "deviceProperties": [], "traceEvents": events}

    def _pass_kernels(self, step, kernel):
        compute_us = step.compute_ms * 1000.0
        layers = max(1, step.allreduces)
        for index in range(layers):
            for name, share, each in COMPUTE_KERNELS[:3]:
                if each or index % 2 == 0:
                    kernel(name, compute_us * share / (layers if each else (layers + 1) // 2))
            if step.allreduces:
                kernel(self.allreduce_kernel(), step.allreduce_us)
        name, share, _ = COMPUTE_KERNELS[3]
        kernel(name, compute_us * share)
