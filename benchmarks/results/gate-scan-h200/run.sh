#!/bin/bash
# Time the host-side gate scanner over SGLang 0.5.23 on a many-core machine (wall time, per jobs value).
set -e
mkdir -p /tmp/site && python3 -m zipfile -e .carry/gs/*.whl /tmp/site >/dev/null
nproc; python3 --version
for rep in 1 2 3; do
 for v in new old; do
  for j in 1 4 8 16; do
   o=$(python3 -c "import json;o=json.load(open('.carry/gs/opts.json'));o['root']='/tmp/site/sglang';o['jobs']=$j;print(json.dumps(o))")
   s=$(date +%s.%N); python3 - "$o" < .carry/gs/gate_scan_$v.py > /tmp/out.json; e=$(date +%s.%N)
   n=$(python3 -c "import json;d=json.load(open('/tmp/out.json'));print(len(d['gates']), d.get('jobs'))")
   echo "rep=$rep scanner=$v jobs=$j wall_s=$(python3 -c "print(round($e-$s,3))") gates,jobs=$n"
  done
 done
done | tee $OUT/gate_scan_timing.txt
