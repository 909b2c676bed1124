#!/bin/bash
# Second device call behind benchmarks/results/h200-x2/repeat/: the same measurements with --repeat 3,
# so every figure carries a 95% bootstrap interval, and one configuration measured twice (A, B) so
# `results compare` can be checked on real GPUs. Same setup as h200_x2.sh (.carry/src, .carry/whl).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
START=$(date +%s)
W=/tmp/w; mkdir -p $W/docs; R=$W/results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/whl/*.whl \
  && export PYTHONPATH=/tmp/site || echo "wheel install failed" >&2
left() { echo $(( $1 - ($(date +%s) - START) )); }
g() { local name=$1; shift; local t0=$(date +%s); echo "=== $name: gpuops bench $*"
  PYTHONPATH=.carry/src:${PYTHONPATH:-} python3 -m gpuops.cli bench --results-dir $R --json "$@" > $W/docs/$name.json
  echo "=== $name: exit $? in $(( $(date +%s) - t0 )) s"; }
AR="--suite allreduce --tokens 1,4,8,16,64,256 --hidden-size 7168 --world-size 2 --cuda-graph --repeat 3"
VARS="--env NCCL_ALGO=Ring,Tree --env NCCL_PROTO=LL --env NCCL_NVLS_ENABLE=0"
{
g ar-graph-A $AR $VARS --variant-timeout 90
g ar-graph-B $AR $VARS --variant-timeout 90
g fusion-repeat --suite fusion --world-size 2 --hidden-size 7168 --tokens 1,2,4,8,16,32,64,128,256 --trials 7 \
  --repeat 3 --env NCCL_NVLS_ENABLE=0 --variant-timeout $(( $(left 560) > 120 ? $(left 560) : 120 ))
cd $W && A=$(python3 -c 'import json;print(json.load(open("docs/ar-graph-A.json"))["hosts"]["localhost"]["result_id"])') \
  && B=$(python3 -c 'import json;print(json.load(open("docs/ar-graph-B.json"))["hosts"]["localhost"]["result_id"])') && cd - >/dev/null \
  && PYTHONPATH=.carry/src python3 -m gpuops.cli results compare --results-dir $R $A $B --json > $W/docs/compare-A-B.json \
  && PYTHONPATH=.carry/src python3 -m gpuops.cli results compare --results-dir $R $A $B
} > $OUT/log.txt 2>&1
tar -C $W -czf $OUT/results.tgz docs results
echo "done in $(( $(date +%s) - START )) s"; tail -c 5000 $OUT/log.txt
