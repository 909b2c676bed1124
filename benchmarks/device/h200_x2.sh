#!/bin/bash
# The device run behind benchmarks/results/h200-x2/ (two H200s, kind nvidia-h200-x2), as sent.
# It runs from the main checkout's root with this branch's src/ copied to .carry/src (and the
# pre-fix worker to .carry/allreduce_bench_prefix.py, for the hang demonstration), FlashInfer's wheels in .carry/whl.
# Everything lands under $OUT: facts.txt, log.txt, results.tgz (result files + --json documents).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
START=$(date +%s)
W=/tmp/w; mkdir -p $W/docs; R=$W/results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/whl/*.whl \
  && export PYTHONPATH=/tmp/site || echo "wheel install failed" >&2
{
  date -u; nvidia-smi; nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,pci.bus_id,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch,sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.device_count(), [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())], "p2p 0->1", torch.cuda.can_device_access_peer(0,1))'
  python3 -c 'import flashinfer; print("flashinfer", flashinfer.__version__)'
  nproc; free -g | head -2
} > $OUT/facts.txt 2>&1
g() { # one gpuops bench call; $1: name of its --json document, rest: arguments
  local name=$1; shift; local t0=$(date +%s)
  echo "=== $name: gpuops bench $*"
  PYTHONPATH=.carry/src:${PYTHONPATH:-} python3 -m gpuops.cli bench --results-dir $R --json "$@" > $W/docs/$name.json
  echo "=== $name: exit $? in $(( $(date +%s) - t0 )) s"
  PYTHONPATH=.carry/src python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(h, json.dumps({k: v for k, v in l.items() if k not in ("variants",)})) for h, l in d["hosts"].items()]' $W/docs/$name.json
}
left() { echo $(( $1 - ($(date +%s) - START) )); }
AR="--suite allreduce --tokens 1,4,8,16,64,256 --hidden-size 7168 --dtype bfloat16"
VARS="--env NCCL_ALGO=Ring,Tree --env NCCL_PROTO=LL,LL128,Simple --env NCCL_NVLS_ENABLE=0"
{
g ar-w2-graph $AR --world-size 2 --cuda-graph $VARS --variant-timeout 90
g ar-w2-eager $AR --world-size 2 $VARS --variant-timeout 90
g fusion-w2 --suite fusion --world-size 2 --hidden-size 7168 --tokens 1,2,4,8,16,32,64,128,256 --trials 7 \
  --env NCCL_NVLS_ENABLE=0 --variant-timeout $(( $(left 520) > 120 ? $(left 520) : 120 ))
g ar-w1-graph $AR --world-size 1 --cuda-graph --env NCCL_NVLS_ENABLE=0 --variant-timeout 60
g ar-w1-eager $AR --world-size 1 --env NCCL_NVLS_ENABLE=0 --variant-timeout 60
g fusion-w1 --suite fusion --world-size 1 --tokens 1 --env NCCL_NVLS_ENABLE=0 --variant-timeout 60
# the pre-fix worker (CUDA graph alive at destroy_process_group): the watchdog must catch the hang
if [ "$(left 540)" -gt 75 ] && [ -f .carry/allreduce_bench_prefix.py ]; then
  cp -r .carry/src $W/src-demo && cp .carry/allreduce_bench_prefix.py $W/src-demo/gpuops/remote/allreduce_bench.py
  echo "=== hang-demo: pre-fix worker, CUDA graph, watchdog 30 s"
  PYTHONPATH=$W/src-demo:${PYTHONPATH:-} python3 -m gpuops.cli bench --results-dir $R --json $AR --tokens 1,4 \
    --world-size 2 --cuda-graph --env NCCL_ALGO=Ring,Tree --env NCCL_NVLS_ENABLE=0 --variant-timeout 30 > $W/docs/hang-demo.json
  echo "=== hang-demo: exit $?"; cat $W/docs/hang-demo.json | head -c 3000; echo
fi
ls -la ~/.cache/gpuops/bench/ 2>&1
} > $OUT/log.txt 2>&1
cp -r ~/.cache/gpuops/bench $W/host-frames 2>/dev/null
tar -C $W -czf $OUT/results.tgz docs results host-frames 2>/dev/null
echo "done in $(( $(date +%s) - START )) s"; tail -c 6000 $OUT/log.txt
