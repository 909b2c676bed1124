#!/bin/bash
# Issue 32, one device call: FlashInfer 0.7.2's PCIe IPC all-reduce (PcieIpcAllReduceWorkspace, as
# SGLang's pcie_ipc_ar.py calls it) beside NCCL, at hidden 7168 bf16, 1-256 tokens, eager and in CUDA
# graphs, through gpuops' own bench over a local connection (no inventory: `gpuops bench` on this
# host, torchrun under it), plus `gpuops bench fusion`; world sizes 2, 4, 8 as far as the GPUs allow.
#
# THESE GPUs ARE JOINED BY NVLINK, NOT PCIe: the figures show that the variant runs, that it is
# correct (pcie_ipc_check.py compares its output with NCCL's on every rank) and what it costs against
# NCCL there. They support no conclusion about PCIe-only hosts.
#
# Before the call, here: benchmarks/device/pcie_ipc_carry (writes .carry/: site/ = the pruned
# flashinfer package, whl/ = its missing deps, py-rest.tgz = the rest of its .py files as a fallback).
# The call (kind nvidia-h200-x2 or larger): run(command="bash benchmarks/device/pcie_ipc_multi.sh",
# carry=[".carry"], timeout_s=600). gpuops comes from the tree's src/ (GPUOPS_SRC to override).
# Under $OUT: facts.txt, log.txt (everything, PCIE-CHECK lines included), results.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
START=$(date +%s); BUDGET=${BUDGET:-560}    # seconds of the 600 s call this script may use
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
ROOT=$PWD; W=/tmp/w; mkdir -p $W/docs; R=$W/results; OUT=${OUT:-$W/out}; mkdir -p $OUT
SRC=$ROOT/${GPUOPS_SRC:-src}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/whl/*.whl \
  || echo "wheel install failed" >&2
export PYTHONPATH=$ROOT/.carry/site:/tmp/site:$SRC
NG=$(nvidia-smi -L 2>/dev/null | grep -c ^GPU); SIZES=""
for n in 2 4 8; do [ "$n" -le "$NG" ] && SIZES="$SIZES $n"; done
imp() { python3 -c 'import flashinfer, flashinfer.comm; from flashinfer.comm import PcieIpcAllReduceWorkspace; print("flashinfer", flashinfer.__version__, flashinfer.__file__, PcieIpcAllReduceWorkspace)'; }
{
  date -u; nvidia-smi; nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,pci.bus_id,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch,sys; n=torch.cuda.device_count(); print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), n, "p2p 0->1", n > 1 and torch.cuda.can_device_access_peer(0,1))'
  nvcc --version | tail -2; echo "GPUs: $NG, world sizes:$SIZES"
  if ! imp; then   # the pruned package missed a module: unpack the rest of its .py files and retry
    echo "pruned import failed; unpacking .carry/py-rest.tgz"; tar -C $ROOT/.carry/site -xzf $ROOT/.carry/py-rest.tgz && imp
  fi
  # JIT-build pcie_ipc_comm from the carried sources once (cached for the check and the bench); on a
  # one-GPU kind this is all the recipe can show: the carried tree imports and its kernel compiles.
  python3 -c 'import time; t=time.time(); from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module as g; m=g(); print("pcie_ipc_comm built in", round(time.time()-t, 1), "s:", m)' \
    || echo "pcie_ipc_comm JIT build failed"
  nproc; free -g | head -2
} > $OUT/facts.txt 2>&1
g() { # one gpuops bench call; $1: name of its --json document, rest: arguments
  local name=$1; shift; local t0=$(date +%s)
  echo "=== $name ($(left) s left): gpuops bench $*"
  python3 -m gpuops.cli bench --results-dir $R --json "$@" > $W/docs/$name.json
  echo "=== $name: exit $? in $(( $(date +%s) - t0 )) s"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(h, json.dumps({k: v for k, v in l.items() if k not in ("variants",)})) for h, l in d["hosts"].items()]' $W/docs/$name.json
}
AR="--suite allreduce --tokens 1,4,8,16,64,256 --hidden-size 7168 --dtype bfloat16 --env NCCL_NVLS_ENABLE=0"
{
cat $OUT/facts.txt | tail -4
for n in $SIZES; do   # correctness first (it also JIT-builds pcie_ipc_comm once, cached for the bench)
  [ "$(left)" -gt 120 ] || { echo "=== skip check w$n: $(left) s left"; continue; }
  echo "=== check w$n ($(left) s left)"
  timeout $(( $(left) / 2 )) python3 -m torch.distributed.run --standalone --nproc-per-node $n \
    benchmarks/device/pcie_ipc_check.py 1,4,8,16,64,256 7168 2>&1 | grep -E "PCIE-CHECK|Error|error" | head -120
  echo "=== check w$n: exit ${PIPESTATUS[0]}"
done
for n in $SIZES; do
  for k in pcie_ipc nccl; do
    [ "$(left)" -gt 60 ] && g ar-w$n-$k-graph $AR --kernel $k --world-size $n --cuda-graph --variant-timeout 120
    [ "$(left)" -gt 60 ] && g ar-w$n-$k-eager $AR --kernel $k --world-size $n --variant-timeout 90
  done
done
for n in $SIZES; do   # fusion compiles FlashInfer's fused kernels on first use: last, on what time is left
  T=$(( $(left) - 20 )); [ "$T" -gt 90 ] || { echo "=== skip fusion w$n: $(left) s left"; continue; }
  g fusion-w$n --suite fusion --world-size $n --hidden-size 7168 --tokens 1,2,4,8,16,32,64,128,256 --trials 5 \
    --env NCCL_NVLS_ENABLE=0 --variant-timeout $T
done
ls -la ~/.cache/gpuops/bench/ 2>&1
} > $OUT/log.txt 2>&1
cp -r ~/.cache/gpuops/bench $W/host-frames 2>/dev/null
tar -C $W -czf $OUT/results.tgz docs results host-frames 2>/dev/null
echo "done in $(( $(date +%s) - START )) s"; tail -c 8000 $OUT/log.txt
