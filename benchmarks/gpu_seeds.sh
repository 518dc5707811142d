#!/usr/bin/env bash
# Training seeds of the paper's two comparisons on one GPU machine of the device tool (issue 35 item 1): QAD against
# GPTQ (stage 01, one run per seed) and the two-stage drafter against the direct one on the QAD target (stages 02-03
# with the direct ablation, one run per seed, every seed on the same data and the same seed-0 QAD target), at a
# smaller data size than smol-gpu-xl (N conversations; the full size does not fit 30 minutes of one GPU three times).
# Idempotent passes, each call at most 10 minutes; call again to go on. The machine's setup is gpu_xl.sh's.
#   calls 1-2 (carry .whl .device/gguf.partc, then .device/gguf.parta):  bash benchmarks/device.sh setup
#   calls 3.. (carry .device/gguf.partb .device/xl_prompts.json.gz; within 30 s of the last):
#       QDFLASH_GIT_SHA=<commit> [SEEDS="0 1 2"] [QAD_SEEDS="1 2"] [N=12884] [DRAFTER_SETS="--set k=v ..."]
#       [NEED_02=120] [NEED_03=120] bash benchmarks/gpu_seeds.sh [SECONDS]
# NEED_02/NEED_03: the seconds a call must have left to start stage 02/03 (a stage cut at a call's end resumes from its
# last checkpoint but repeats its loading and compiling: a stage that will not fit is left to the next call).
# QAD_SEEDS: the stage-01 seeds besides 0 ("" for none: run-1206e-h100 has three at N=6000).
# DRAFTER_SETS (split on spaces: no space or glob character inside a value): the drafter recipe for stages 02-03 where the preset's does not train at N (run-1206e-h100: batch 128
# gave 129 steps at N=6000, an untrained drafter); e.g. smol-gpu's "--set batch_size=32 --set lr=1e-3 --set epochs=4".
# Stage 03 decodes its grid on the QAD target only (grid_targets), the comparison's target.
# Order: stage 00, the seed-0 QAD target, the drafter seeds, the other QAD seeds (the drafter comparison is the weaker
# claim, so it goes first when the GPU time runs short).
# Runs: /tmp/runs-seeds/s<seed>/ (seed 0's 01_qad linked in, and for seeds > 0 its 00_data too); stage 01 of every seed in
# /tmp/runs-seeds/q<seed>/. Everything comes back as $OUT/seeds.tgz.
set -u
BUDGET=${1:-540}; DEV_OUT=${OUT:-/tmp/devout}; mkdir -p "$DEV_OUT"
O=/tmp/o-seeds; R=/tmp/runs-seeds; mkdir -p $O $R
END=$(( $(date +%s) + BUDGET ))
SEEDS=${SEEDS:-0 1 2}; QAD_SEEDS=${QAD_SEEDS-1 2}; N=${N:-12884}; DRAFTER_SETS=${DRAFTER_SETS:-}
NEED_02=${NEED_02:-120}; NEED_03=${NEED_03:-120}
# PRESET and DEVICE_SH are for a dry run of this flow on the CPU: PRESET=tiny DEVICE_SH=/dev/null (python3 = the venv's)
PRESET=${PRESET:-smol-gpu-xl}
source ${DEVICE_SH:-benchmarks/device.sh}
export QDFLASH_PROMPTS_DUMP=.device/xl_prompts.json.gz QDFLASH_CACHE=/tmp/qdcache
left() { local l=$(( END - $(date +%s) )); echo $(( l > 1 ? l : 1 )); }
ok() { [ $(left) -gt ${1:-60} ]; }
stage() {  # ROOT STAGE [--set k=v ...]: run until the deadline, log, record wall time and rc
  local root=$1 s=$2; shift 2; local t=$(date +%s.%N) name=$(basename $root)-$s
  timeout $(left) python3 -m qdflash.cli run $s --preset $PRESET --runs $root --no-progress "$@" >> $O/log-$name.txt 2>&1
  echo "$name rc=$? $(python3 -c "print(round($(date +%s.%N)-$t,1))")s sha=${QDFLASH_GIT_SHA:-?}" | tee -a $O/stage_times.txt
  cp $root/$s/metrics.json $O/metrics-$name.json 2>/dev/null; cp $root/$s/config.json $O/config-$name.json 2>/dev/null
  cp $root/$s/run.json $O/run-$name.json 2>/dev/null      # provenance: GPU model, library versions, command, commit
  cp $root/$s/decode-*.json $O/ 2>/dev/null && for f in $root/$s/decode-*.json; do mv $O/$(basename $f) $O/$name-$(basename $f); done
  true
}
done_() { [ -f $1/$2/metrics.json ]; }
S0=$R/s0
done_ $S0 00_data || stage $S0 00_data --set n_prompts=$N
qad() {  # SEED: QAD against GPTQ, one run per seed (GPTQ is deterministic: its KL repeats)
  local Q=$R/q$1; mkdir -p $Q; ln -sfn $S0/00_data $Q/00_data
  done_ $Q 01_qad || { ok 150 && stage $Q 01_qad --set seed=$1; }
}
qad 0                                     # the seed-0 QAD target every drafter seed is finetuned against
for s in $SEEDS; do                       # two-stage against direct on the seed-0 QAD target, one run per seed
  D=$R/s$s; mkdir -p $D; [ $s = 0 ] || ln -sfn $S0/00_data $D/00_data; ln -sfn $R/q0/01_qad $D/01_qad
  done_ $R/q0 01_qad || continue
  done_ $D 02_drafter_pretrain || { ok $NEED_02 && stage $D 02_drafter_pretrain --set seed=$s $DRAFTER_SETS; }
  # every seed finetunes on the same QAD-regenerated data: seed 0's, resumed (regenerate_rows checks the weights);
  # so no other seed runs stage 03 before seed 0's has finished
  [ $s = 0 ] || done_ $S0 03_drafter_finetune || continue
  [ $s = 0 ] || [ -d $D/03_drafter_finetune/finetune_data ] || \
    { mkdir -p $D/03_drafter_finetune && cp -r $S0/03_drafter_finetune/finetune_data $D/03_drafter_finetune/; }
  done_ $D 02_drafter_pretrain && ! done_ $D 03_drafter_finetune && ok $NEED_03 && \
    stage $D 03_drafter_finetune --set seed=$s --set direct_ablation=true --set 'grid_targets=["qad"]' $DRAFTER_SETS
done
# the seed-0 two-stage drafter in bf16, once, in 14 MiB parts (for vLLM on the CPU machine: issue 35 item 9);
# rejoin with: cat drafter-bf16.tgz.part* | tar xz
if done_ $S0 03_drafter_finetune && [ ! -f /tmp/drafter-sent ]; then
  for d in $S0/03_drafter_finetune/drafter-twostage-*/; do python3 benchmarks/drafter_bf16.py $d /tmp/drafter-bf16/$(basename $d); done && \
    touch /tmp/drafter-sent
  tar czf - -C /tmp drafter-bf16 | split -b 14m - "$DEV_OUT/drafter-bf16.tgz.part"
fi
for s in $QAD_SEEDS; do [ $s = 0 ] || qad $s; done
tar czf "$DEV_OUT/seeds.tgz" -C /tmp o-seeds
ls $O | head -50
