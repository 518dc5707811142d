#!/usr/bin/env bash
# Issue 19 on the H200: batch-1 decode speed, eager vs fast path (static caches) vs CUDA graphs, plain and speculative.
# Usage: benchmarks/gpu_fast_decode.sh OUT.json --drafter fp32=DIR [--drafter w8a16=DIR ...] [--target QAD_DIR]  (see gpu_fast_decode.py)
PYTHONPATH=src:${PYTHONPATH:-} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false exec python3 benchmarks/gpu_fast_decode.py --device cuda --target smol --dtype bfloat16 --out "${1:?usage: $0 OUT.json [args]}" "${@:2}"
