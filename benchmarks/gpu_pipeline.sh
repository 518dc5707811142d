#!/usr/bin/env bash
# The smol pipeline (stages 01-04) on one GPU, from carried stage-00 data; per-stage wall time.
# Usage on the device machine (after `bash benchmarks/device.sh setup`): benchmarks/gpu_pipeline.sh OUTDIR
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
source benchmarks/device.sh     # the device machine's wheels, GGUF and environment (benchmarks/device.sh)
for s in 01_qad 02_drafter_pretrain 03_drafter_finetune 04_drafter_quant; do
  t=$(date +%s.%N)
  python3 -m qdflash.cli run $s --preset smol --runs runs/smol-gpu --no-progress > "$OUT/log-$s.txt" 2>&1 || { echo "FAIL $s"; tail -20 "$OUT/log-$s.txt"; }
  echo "$s $(python3 -c "print(round($(date +%s.%N)-$t,1))")s" | tee -a "$OUT/stage_times.txt"
  cp runs/smol-gpu/$s/metrics.json "$OUT/metrics-$s.json" 2>/dev/null || true
done
