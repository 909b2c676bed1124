#!/bin/bash
# A no-op `gpuops apply fusion-sm120` on a real GPU host over a local connection (no SSH): SGLang
# 0.5.8's real source unpacked (no server running), the machine's own nvidia-smi and python.
# Runs 1-2 gather every GPU fact, from run 3 on the kept facts are offered (apply/kept_facts.py).
REPO="$(cd "$(dirname "$0")/.." && pwd)"
W=${W:-/tmp/gpuops-noop}
rm -rf "$W"; mkdir -p "$W/state"
python3 -m zipfile -e "$REPO/.carry/sglang-0.5.8-py3-none-any.whl" "$W/site" || exit 1
PY=$(command -v python3)
cat > "$W/inv.yml" <<INV
all:
  hosts:
    gpu1:
      ansible_connection: local
      gpuops_state_dir: $W/state
      sglang_manager: process
      sglang_python: $PY
      sglang_port: 30000
      sglang_args: [--model-path, /models/none, --tp-size, "1", --port, "30000"]
INV
export PYTHONPATH="$REPO/.carry/kf_src:$W/site" GPUOPS_CACHE="$W/cache"
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
for i in 1 2 3 4 5 6 7 8; do
  s=$(date +%s%N)
  python3 -m gpuops.cli apply fusion-sm120 -i "$W/inv.yml" -v --timings > "$OUT/apply-$i.txt" 2>&1; rc=$?
  e=$(date +%s%N)
  echo "run $i rc=$rc wall=$(( (e-s)/1000000 )) ms  $(grep -c 'GPU facts: fingerprint unchanged' "$OUT/apply-$i.txt") kept  exec $(grep -E '^  exec ' "$OUT/apply-$i.txt" | awk '{print $2}') s"
done
python3 -m gpuops.cli apply fusion-sm120 -i "$W/inv.yml" --flush-cache -v > "$OUT/apply-flush.txt" 2>&1; echo "flush rc=$? kept=$(grep -c 'fingerprint unchanged' "$OUT/apply-flush.txt")"
grep -v "^gpu1: exec" "$OUT/apply-8.txt" | head -30
