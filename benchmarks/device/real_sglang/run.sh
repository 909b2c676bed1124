#!/usr/bin/env bash
# One device call: a real SGLang 0.5.16 server on the lent H200, recorded, then driven by gpuops.
# From the repo root on the GPU machine (the carry .dev/real-sglang made by build.sh):
#   benchmarks/device/real_sglang/run.sh        (PHASES="stage model record read" by default;
#   a second call: PHASES="stage model read change tune"; what did not fit: PHASES="stage model tune";
#   speculative decoding through gpuops tune: PHASES="stage model spec")
# Every step runs under `timeout`; the script stops starting steps DEADLINE s (default 540) after it
# began. Results: $OUT/real-sglang.tgz (README.md says where they are kept).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
HERE=$PWD/benchmarks/device/real_sglang; C=$PWD/.dev/real-sglang; R=/tmp/real-sglang-run
PHASES=${PHASES:-"stage model record read"}; DEADLINE=${DEADLINE:-540}
PY=$(command -v python3); mkdir -p $R/g
SRC=${GPUOPS_SRC:-$PWD/src}  # which gpuops runs: this checkout's, or a carried copy of a commit
log() { echo "[$(date +%T) t+${SECONDS}s] $*"; }
left() { echo $((DEADLINE - SECONDS)); }
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
pack() { cp /tmp/gpuops-state/sglang.log $R/managed-server.log 2>/dev/null; tar czf ${OUT:-/tmp}/real-sglang.tgz -C /tmp real-sglang-run; }
trap pack EXIT
G() {  # G NAME LIMIT gpuops-args... : gpuops from this checkout, under timeout LIMIT (or what is left)
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -lt 30 ]; then echo "[gpuops $name] SKIPPED: $(left)s left" | tee -a $R/g/INDEX.txt; return 0; fi
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  local t0=$(date +%s%3N)
  PYTHONPATH=$SRC XDG_STATE_HOME=$R/xdg-state XDG_CACHE_HOME=/tmp/gcache timeout $limit $PY -m gpuops.cli "$@" > $R/g/$name.txt 2>&1
  local rc=$?
  echo "[gpuops $name] rc=$rc wall=$(( $(date +%s%3N) - t0 ))ms: gpuops $*" | tee -a $R/g/INDEX.txt
  tail -n 12 $R/g/$name.txt
}
if has stage; then
  mkdir -p /tmp/site && tar xJf $C/site1.tar.xz -C /tmp/site && tar xJf $C/site2.tar.xz -C /tmp/site
  log "staged: $(du -sh /tmp/site | cut -f1)"
  { nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv; $PY -V; uname -r; nproc
    PYTHONPATH=/tmp/site $PY -c 'import torch,transformers;print("torch",torch.__version__,torch.version.cuda,"transformers",transformers.__version__)'
  } > $R/env.txt 2>&1; cat $R/env.txt
  PYTHONPATH=/tmp/site timeout 60 $PY -m pip list --format json > $R/pip-server-env.json 2>/dev/null
  timeout 60 $PY -m pip list --format json > $R/pip-plain.json 2>/dev/null
fi
if has model; then
  PYTHONPATH=/tmp/site timeout 180 $PY $HERE/make_model.py $C/model_src /tmp/model > $R/model.txt 2>&1; tail -2 $R/model.txt
fi
SERVER_ARGS=$($PY -c 'import sys, yaml; print(" ".join(yaml.safe_load(open(sys.argv[1]))["all"]["hosts"]["gpu0"]["sglang_args"]))' $HERE/inventory.yml)
if has record; then  # a server started by hand: what it answers, its processes, its start and its drain
  log "record: $SERVER_ARGS"
  PYTHONPATH=/tmp/site timeout 480 $PY $HERE/record.py $R/real -- $PY -m sglang.launch_server $SERVER_ARGS --port 30000
  log "record rc=$?"
fi
if has profrec; then  # SGLang's profiler and speculative decoding, servers started by hand (record_profile.py)
  log "profrec: $SERVER_ARGS"
  PYTHONPATH=/tmp/site:$HERE timeout $(( $(left) - 10 )) $PY $HERE/record_profile.py $R/profrec $(( $(left) - 25 )) -- \
    ${PROFREC_VARIANTS:-base ngram:--speculative-algorithm,NGRAM,--speculative-num-draft-tokens,8 nograph:--disable-cuda-graph standalone:--speculative-algorithm,STANDALONE,--speculative-draft-model-path,/tmp/model,--speculative-num-steps,3,--speculative-eagle-topk,1,--speculative-num-draft-tokens,4} \
    -- $PY -m sglang.launch_server $SERVER_ARGS --port 30000
  log "profrec rc=$?"
fi
sed "s#@PYTHON@#$PY#" $HERE/inventory.yml > $R/inventory.yml; I="-i $R/inventory.yml"
# gpuops drives the server it manages, every command as a user would type it. Two halves, so that
# each fits one call (a real restart is ~65 s): the first reads and measures, the second changes.
if has read; then
  G inspect-none 120 inspect host $I
  G advise-none 120 advise $I
  G apply-service 420 apply sglang-service $I -v
  G apply-noop 120 apply sglang-service $I
  G inspect 120 inspect host $I
  G inspect-json 120 inspect host $I --json
  G advise 120 advise $I
  G bench-decode 150 bench --remote --suite decode $I --results-dir $R/results --input-len 128 --output-len 128 --num-requests 5
  G bench-serving 150 bench --remote --suite serving $I --results-dir $R/results --input-len 128 --output-len 64 --concurrency 1,8
  G bench-tool 180 bench --remote --suite decode --tool sglang $I --results-dir $R/results --input-len 128 --output-len 64
fi
if has change; then
  G apply-service-2 420 apply sglang-service $I
  G apply-nccl 300 apply nccl-env $I -e '{"nccl_env": {"NCCL_DEBUG": "WARN"}}' -v
  G apply-refused 400 apply sglang-service $I -e '{"sglang_extra_args": ["--context-length", "999999"]}' -v
  G history 120 history $I
  G rollback 300 rollback $I -v
  G history-end 120 history $I
fi
if has tune; then  # one NCCL variant, measured against the current setting; hosts end as they began
  G apply-service-3 420 apply sglang-service $I
  G tune 300 tune $I --sweep NCCL_DEBUG=INFO --results-dir $R/results --input-len 64 --output-len 64 --num-requests 3 --warmup 1
  G history-tune 120 history $I
fi
if has spec; then  # issue 38: NGRAM speculative decoding (no draft model; 0.5.16's flags) against none, through
  # gpuops tune: flags checked against the release on the host, speculation off measured as the
  # baseline in the same run, batch 1 and c=8, the host put back as it was (~230 s: three restarts)
  G apply-service-5 240 apply sglang-service $I
  G tune-spec 330 tune $I --sweep speculative_algorithm=NGRAM --sweep speculative_num_draft_tokens=8 \
    --concurrency 1,8 --results-dir $R/results --input-len 64 --output-len 128 --num-requests 4 --warmup 1
  G history-spec 60 history $I
fi
if has tool; then  # SGLang's own benchmark modules, through gpuops, in the server's environment
  G apply-service-4 420 apply sglang-service $I
  G bench-tool-decode 180 bench --remote --suite decode --tool sglang $I --results-dir $R/results --input-len 128 --output-len 64
  G bench-tool-serving 180 bench --remote --suite serving --tool sglang $I --results-dir $R/results --input-len 128 --output-len 64 --concurrency 1,8
fi
if has profile; then  # gpuops profile (issue 37): SGLang's own profiler on the server gpuops manages, read on the host
  G apply-service-5 420 apply sglang-service $I
  G profile 180 profile --remote $I --steps 5 --json --results-dir $R/results
  G profile-text 180 profile --remote $I --steps 5 --stage all --fetch-traces --results-dir $R/results
  G advise-profile 120 advise $I --results-dir $R/results
fi
G results 60 results list --results-dir $R/results
log "done, $(left)s left"
