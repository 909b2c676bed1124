#!/bin/bash
# Kept GPU facts on 2x H200 (NVLink): the gather of apply's GPU probes, full then kept; the summary.
cd "$(dirname "$0")/.."
nvidia-smi -L | sed 's/UUID: [^)]*/UUID: -/'
nvidia-smi topo -m | head -5
PYTHONPATH=.carry/kf_src python3 .carry/kept_facts_device.py > $OUT/kept_facts_x2.jsonl 2> $OUT/kept_facts_x2.err; echo rc=$?
python3 - <<'PY'
import json, os
for line in open(os.environ["OUT"] + "/kept_facts_x2.jsonl"):
    d = json.loads(line)
    if "head" in d:
        d["head"] = [l for l in d["head"] if "UUID" not in l][:12]
    print(json.dumps(d)[:700])
PY
tail -3 $OUT/kept_facts_x2.err
