#!/usr/bin/env bash
# QAD recipe sweep on one H200 (issue: QAD that beats PTQ), on the smol 00_data carried in .device/data.
# Calls 1-2: `bash benchmarks/device.sh setup` (see there); this call carries the last GGUF part (device.sh: the carry order).
# Usage on the device machine: benchmarks/gpu_qad_sweep.sh OUTDIR "COMMON" VARIANT...
set -u
OUT=${1:-/tmp/out}; COMMON=$2; shift 2; mkdir -p "$OUT"
source benchmarks/device.sh     # the device machine's wheels, GGUF and environment (benchmarks/device.sh)
export PYTHONPATH=/tmp/site:src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda QDFLASH_CACHE=/tmp/qcache PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 benchmarks/qad_sweep.py --data .device/data/00_data --out "$OUT/qad_sweep.json" --work /tmp/qad_sweep \
  --common "$COMMON" --variants "$@" 2>&1 | grep -v -i "warn\|Loading weights" | tail -40
