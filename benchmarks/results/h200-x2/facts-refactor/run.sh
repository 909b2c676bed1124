#!/bin/bash
# Compare inspect host (local connection) of the code before this session (old_src) and main (src)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
nvidia-smi topo -m > $OUT/topo.txt 2>&1
nvidia-smi topo -p2p r >> $OUT/topo.txt 2>&1
for v in old new; do
  if [ $v = old ]; then P=.carry/old_src; else P=src; fi
  for i in 1 2 3; do
    s=$(date +%s.%N); PYTHONPATH=$P python3 -m gpuops.cli inspect host --json > $OUT/inspect-$v.json 2> $OUT/inspect-$v.err; rc=$?
    e=$(date +%s.%N); echo "$v run $i rc=$rc wall=$(python3 -c "print(round($e-$s,3))")"
  done
  PYTHONPATH=$P python3 -m gpuops.cli inspect host > $OUT/inspect-$v.txt 2>&1
  PYTHONPATH=$P python3 -m gpuops.cli inspect host --timings > $OUT/timings-$v.txt 2>&1
done
python3 - <<'PY'
import json,os
o=os.environ["OUT"]
a=json.load(open(o+"/inspect-old.json")); b=json.load(open(o+"/inspect-new.json"))
def walk(x,y,p=""):
    if isinstance(x,dict) and isinstance(y,dict):
        for k in sorted(set(x)|set(y)):
            walk(x.get(k,"<absent>"),y.get(k,"<absent>"),p+"."+k)
    elif isinstance(x,list) and isinstance(y,list) and len(x)==len(y):
        for i,(u,v) in enumerate(zip(x,y)): walk(u,v,p+"[%d]"%i)
    elif x!=y: print("DIFF",p,":",json.dumps(x)[:200],"->",json.dumps(y)[:200])
walk(a,b)
PY
diff $OUT/inspect-old.txt $OUT/inspect-new.txt && echo "human report identical"
cat $OUT/inspect-new.txt | head -60
