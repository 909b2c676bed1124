#!/bin/bash
cd "$(dirname "$0")/.."
nvidia-smi -L | sed 's/UUID: [^)]*/UUID: -/'
PYTHONPATH=.carry/kf_src python3 .carry/kept_facts_device.py > $OUT/kept_facts_device.jsonl 2> $OUT/kept_facts_device.err; echo rc=$?
cut -c1-600 $OUT/kept_facts_device.jsonl; tail -5 $OUT/kept_facts_device.err
