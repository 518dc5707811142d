#!/usr/bin/env bash
# The smol-gpu-xl preset (config.py: _SMOL_GPU_XL; issue 34) on one GPU machine of the device tool, in idempotent
# passes that each fit one 10-minute call: whatever is missing, in order, until the deadline; call it again to go on.
# The machine's setup (wheels, the split GGUF) is benchmarks/device.sh.
#   call 1 (carry .whl .device/gguf.partc): bash benchmarks/device.sh setup
#   call 2 (carry .device/gguf.parta [XL_BASE dir]):  [XL_BASE=.device/src-<sha> XL_BASE_SHA=<sha>] [XL_VARIANTS="chunk cfeat ..."
#             or none] [XL_GENPROF=1 (the generator's decode step by kind of kernel)] benchmarks/gpu_xl.sh setup
#   call 3.. (carry .device/gguf.partb .device/xl_prompts.json.gz, within 30 s of the last call):
#             QDFLASH_GIT_SHA=<commit> [XL_00="--set k=v ..." (stage 00)] [XL_02="--set k=v ..." (stages 02 and 03)] [XL_PROFILE= XL_TAU= (skip those passes)]
#             [XL_UNTIL=00_data (stage 00 alone); =01_qad (with XL_QAD_BACK: stages 00 and 01); =scaling (stage 00 and the XL_SCALING curves); =02_drafter_pretrain
#             (nothing from stage 01 on: stage 02 and the passes on its drafter: XL_TAU, XL_SWA)]
#             [XL_SWA=128 [XL_SWA_CTX=2048-8192] (a drafter trained with the window, walked on long real prompts)]
#             [XL_SCALING="--sizes 12500,0 --steps 780" (the real-only and real + self-prompted data curves at equal
#             steps; drafter_scaling.py's arguments) [XL_SCALING_SOURCES="all" (one curve; default "real all")]]
#             [XL_V02="base lr4e3:lr=4e-3 ep5:epochs=5" (stage-02 variants on the same data, walked together; a bare NAME:
#             the preset and XL_02 unchanged)]
#             [XL_QAD_BACK=1 (stage 01 after stage 00, its QAD target's codes back: benchmarks/qad_back.py)]
#             [XL_SPEED=1 (batch-1 speed on the QAD target after stage 03, the two-stage drafter; =pretrain: after stage 01,
#             the pretrained drafter, no stage 03 needed; the drafter back in bf16)] benchmarks/gpu_xl.sh go [SECONDS]
# Pass order: the regeneration benchmark (batch_generate_bench.py), stage 00 (magpie + fast regeneration), the
# drafter step profile, the data curves (XL_SCALING), the stage-02 variants (XL_V02), stage 02, the pretrain drafter's
# decoded tau on 64 held-out real prompts x 128 tokens by source (drafter_tau_by_source.py), the window pass (XL_SWA),
# stage 01, stage 03, the speed pass (XL_SPEED), stage 04 (XL_UNTIL=00_data: nothing after stage 00; =scaling: nothing
# after the curves; =02_drafter_pretrain: nothing from stage 01 on). Everything it wrote comes back as $OUT/xl.tgz.
set -u
PHASE=$1; BUDGET=${2:-540}; DEV_OUT=${OUT:-/tmp/devout}; mkdir -p "$DEV_OUT"
O=/tmp/o; R=/tmp/runs-xl; mkdir -p $O $R
END=$(( $(date +%s) + BUDGET ))
if [ "$PHASE" = setup ]; then
  bash benchmarks/device.sh setup
  # one drafter training step on a synthetic smol-shaped target, this tree's variants against a baseline tree
  # (XL_BASE=<dir holding src/ of an older commit>, XL_BASE_SHA=<its commit>): benchmarks/drafter_step_profile.py
  P="python3 benchmarks/drafter_step_profile.py --synthetic 4096 --preset smol-gpu-xl --steps 20 --loop-steps 60"
  export QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1
  if [ -n "${XL_BASE:-}" ]; then
    PYTHONPATH=$XL_BASE/src:$XL_BASE QDFLASH_GIT_SHA=${XL_BASE_SHA:-?} $P --out $O/step-base.json --trace $O/trace-base.txt > $O/log-step-base.txt 2>&1
  fi
  export PYTHONPATH=src
  # XL_VARIANTS picks the variants by name (default: chunk nochunk vocab8k cfeat); the case below gives their arguments
  for v in ${XL_VARIANTS:-chunk nochunk vocab8k cfeat}; do case $v in
    chunk) A="--ce-chunk 4096";; nochunk) A="--ce-chunk 0";; vocab8k) A="--ce-chunk 4096 --draft-vocab 8192";;
    cfeat) A="--ce-chunk 4096 --compile-features";; cfeat128) A="--ce-chunk 4096 --compile-features --batch 128 --layers 2";;
    cfeat128L4) A="--ce-chunk 4096 --compile-features --batch 128 --layers 4";;
    cfeat128v8k) A="--ce-chunk 4096 --compile-features --batch 128 --draft-vocab 8192";;
    b128) A="--ce-chunk 4096 --batch 128";; compile) A="--ce-chunk 4096 --compile";; *) echo "unknown variant $v"; continue;;
  esac
  timeout 240 $P $A --out $O/step-$v.json > $O/log-step-$v.txt 2>&1; echo "variant $v rc=$?"; done
  # where the generator's decode step goes (issue 34 item 2; XL_GENPROF=1): a SmolLM2-shaped random model, batch 2048
  [ -n "${XL_GENPROF:-}" ] && timeout 200 python3 benchmarks/batch_generate_bench.py --synthetic --batch 2048 \
    --prompts 2048 --max-new 224 --profile-step 2048:128,2048:320 --out $O/gen-profile.json > $O/log-gen-profile.txt 2>&1
  python3 - <<'PY'
import json, os
for n in ("base", "chunk", "nochunk", "vocab8k", "cfeat", "cfeat128", "cfeat128L4", "cfeat128v8k", "b128", "compile"):
    f = f"/tmp/o/step-{n}.json"
    if os.path.exists(f):
        d = json.load(open(f))
        print(n, d["median_s"], "loop s/step", d.get("loop_s_per_step"), "loop tok/s", d.get("loop_tok_per_s"))
PY
  head -30 $O/trace-base.txt 2>/dev/null | cut -c1-150
  tar czf "$DEV_OUT/xl-setup.tgz" -C /tmp o
  exit 0
fi
# PRESET, DEVICE_SH and SPEED_DEVICE are for a dry run of the go passes on the CPU (PRESET=tiny DEVICE_SH=/dev/null
# SPEED_DEVICE=cpu, python3 = the venv's)
PRESET=${PRESET:-smol-gpu-xl}
case "${XL_UNTIL:-}" in ""|00_data|01_qad|scaling|02_drafter_pretrain) ;;
  *) echo "XL_UNTIL=$XL_UNTIL: expected 00_data, 01_qad, scaling or 02_drafter_pretrain (or unset)"; exit 2;; esac
[ "${XL_UNTIL:-}" = 01_qad ] && [ -z "${XL_QAD_BACK:-}" ] && { echo "XL_UNTIL=01_qad runs stage 01 only with XL_QAD_BACK=1"; exit 2; }
source ${DEVICE_SH:-benchmarks/device.sh}
export QDFLASH_PROMPTS_DUMP=${XL_DUMP:-.device/xl_prompts.json.gz} QDFLASH_CACHE=/tmp/qdcache   # XL_DUMP: a dump for XL_00's size
left() { local l=$(( END - $(date +%s) )); echo $(( l > 1 ? l : 1 )); }
run() {  # NAME CMD...: run until the deadline, log, record wall time and rc
  local name=$1; shift; local t=$(date +%s.%N)
  timeout $(left) "$@" >> "$O/log-$name.txt" 2>&1; local rc=$?
  echo "$name rc=$rc $(python3 -c "print(round($(date +%s.%N)-$t,1))")s sha=${QDFLASH_GIT_SHA:-?}" | tee -a $O/stage_times.txt
  tail -2 "$O/log-$name.txt"
  return $rc
}
stage() {  # STAGE [--set k=v ...]
  local s=$1; shift
  run $s python3 -m qdflash.cli run $s --preset $PRESET --runs $R --no-progress "$@"
  cp $R/$s/metrics.json $O/metrics-$s.json 2>/dev/null; true
}
done_() { [ -f $R/$1/metrics.json ]; }
# the path a stage's metrics name: named_path RUNS STAGE KEY... (e.g. $R 02_drafter_pretrain drafter) -> RUNS/STAGE/<name>
named_path() {
  echo $1/$2/$(python3 -c "import json,sys;d=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d=d[k]
print(d)" $1/$2/metrics.json "${@:3}")
}
# stage 02 once more on the same data: variant_02 NAME [--set k=v ...] trains it in /tmp/runs-xl-NAME (00_data linked
# in, resumable; XL_02's settings first, then the variant's), copies its metrics, config and log to $O as *-v02-NAME.*,
# and succeeds when the variant's drafter is there
variant_02() {
  local n=$1; shift; local rv=/tmp/runs-xl-$n
  mkdir -p $rv; [ -e $rv/00_data ] || ln -s $R/00_data $rv/00_data
  [ -f $rv/02_drafter_pretrain/metrics.json ] || { ok 120 && run v02-$n python3 -m qdflash.cli run 02_drafter_pretrain \
    --preset $PRESET --runs $rv --no-progress ${XL_02:-} "$@"; }
  cp $rv/02_drafter_pretrain/metrics.json $O/metrics-v02-$n.json 2>/dev/null
  cp $rv/02_drafter_pretrain/config.json $O/config-v02-$n.json 2>/dev/null
  cp $rv/02_drafter_pretrain/train_log*.jsonl $O/train_log-v02-$n.jsonl 2>/dev/null
  [ -f $rv/02_drafter_pretrain/metrics.json ]
}
# batch-1 speed on the QAD target (issue 35 item 9). First the drafter in bf16 for vLLM on the CPU machine (seconds;
# 14 MiB parts, in the output of the call that made them; its own marker: an export cut by the deadline is redone by
# the next call). Then the target's dense bf16 twin, CUDA graphs, 32 held-out prompts x 128 tokens, no eager rows:
# unfused and fused (one graph a step) decoders in one run, then plain against the drafter in 5 alternating rounds on
# the fused pair (XL_SPEED_MODES=fused: the fused decoders alone, ~1.5 min less). speed_pass NAME DRAFTER
# send_parts DIR MARKER: /tmp/DIR gzipped into 14 MiB parts under $DEV_OUT (DIR.tgz.part*), MARKER touched only when
# tar and split both succeeded (else the parts are removed and the next call sends them again)
send_parts() {
  tar czf - -C /tmp $1 | split -b 14m - "$DEV_OUT/$1.tgz.part"
  [ "${PIPESTATUS[0]}${PIPESTATUS[1]}" = 00 ] && touch $2 || rm -f "$DEV_OUT"/$1.tgz.part*
}
export_bf16() {  # NAME DRAFTER: the drafter in bf16 parts under $DEV_OUT, once (its marker)
  local name=$1 drafter=$2
  if [ ! -f $O/bf16-$name.done ]; then
    timeout $(left) python3 benchmarks/drafter_bf16.py $drafter /tmp/drafter-bf16/$(basename $drafter) || return 0
    send_parts drafter-bf16 $O/bf16-$name.done
  fi
}
speed_pass() {
  local name=$1 drafter=$2
  export_bf16 $name $drafter
  if [ ! -f $O/speed-$name.done ]; then
    ok 240 || return 0
    run speed-$name python3 benchmarks/gpu_fast_decode.py --device ${SPEED_DEVICE:-cuda} --target $(named_path $R 01_qad names twin) \
      --dtype bfloat16 --data $R/00_data --drafter $name=$drafter --prompts 32 --new-tokens 128 \
      --modes ${XL_SPEED_MODES:-graphs,fused} --eager-prompts 0 --rounds 5 --out $O/speed-qad-$name.json && touch $O/speed-$name.done
  fi
  return 0
}
ok() { [ $(left) -gt ${1:-60} ]; }
# XL_QAD_BACK=1: stage 01 right after stage 00, and its QAD target's INT4 codes and scales back to the CPU machine
# (benchmarks/qad_back.py export; ~52 MB gzipped in 14 MiB parts, only in a call whose output holds nothing else large:
# the device tool returns at most 64 MiB a call; its marker: a call that could not send it sends it next time)
export_qad() {
  [ -f $O/qad-back.done ] && return 0
  [ $(du -sm "$DEV_OUT" | cut -f1) -gt 8 ] && { echo "qad-back: deferred (this call's output is full)"; return 0; }
  rm -rf /tmp/qad-back "$DEV_OUT"/qad-back.tgz.part* && python3 benchmarks/qad_back.py export $R/01_qad /tmp/qad-back || return 0
  send_parts qad-back $O/qad-back.done
}
# the regeneration benchmark only when asked (XL_BENCH="--prompts 16384 --batch 1024,2048,4096"): stage 00 reports its own
[ -n "${XL_BENCH:-}" ] && [ ! -f $O/bench.json ] && run bench python3 benchmarks/batch_generate_bench.py --out $O/bench.json $XL_BENCH
done_ 00_data || stage 00_data ${XL_00:-}    # XL_00="--set n_prompts=100768" (with a prompt dump made for that size)
[ "${XL_UNTIL:-}" = 00_data ] && END=$(date +%s)   # XL_UNTIL=00_data: stage 00 alone (its regeneration figure), nothing after
cp $R/00_data/manifest.json $O/manifest-00_data.json 2>/dev/null
if [ -n "${XL_QAD_BACK:-}" ] && done_ 00_data; then done_ 01_qad || { ok 120 && stage 01_qad; }; done_ 01_qad && export_qad; fi
[ "${XL_UNTIL:-}" = 01_qad ] && END=$(date +%s)   # XL_UNTIL=01_qad (with XL_QAD_BACK): stages 00 and 01, nothing after
if done_ 00_data; then
  [ -z "${XL_PROFILE-1}" ] || [ -f $O/step-profile.json ] || { ok && run profile python3 benchmarks/drafter_step_profile.py --data $R/00_data --out $O/step-profile.json; }
  # the data curve (issue 34 item 4), real-only against real + self-prompted, tau walked on 64 held-out real prompts:
  # XL_SCALING="--sizes 12500,0 --steps 780" (resumable: finished points are kept; at a fixed number of epochs the
  # points' steps grow with their data, run-1207e-h100)
  if [ -n "${XL_SCALING:-}" ]; then
    for src in ${XL_SCALING_SOURCES:-real all}; do [ -f $O/scaling-$src.done ] || { ok 120 && run scaling-$src python3 benchmarks/drafter_scaling.py --runs $R --preset $PRESET \
      --sources $src --walk 64 --new 128 --walk-grid $O/scaling.walk-grid.json --out $O/scaling-$src.json $XL_SCALING && touch $O/scaling-$src.done; }; done
  fi
  [ "${XL_UNTIL:-}" = scaling ] && END=$(date +%s)   # XL_UNTIL=scaling: stage 00 and the curves, nothing after
  # stage-02 levers on the same data (issue 34 item 4: steps, learning rate), before the preset's own stage 02:
  # XL_V02="NAME:k=v,k=v NAME2:k=v BASE ..." trains stage 02 once per variant (variant_02; a bare NAME: no settings of
  # its own), then walks the variants' pretrain drafters on the same 64 held-out real prompts x 128 tokens (the decoder's tau, paired; stage 00 regenerates
  # the same tokens in every run, so a run-1206d-h100 grid pairs too); the walk reruns when the variant list changes
  if [ -n "${XL_V02:-}" ]; then
    W=""; all=1
    for v in $XL_V02; do
      n=${v%%:*}; sets=""; case $v in *:*) sets=$(echo "${v#*:}" | tr ',' '\n' | sed 's/^/--set /');; esac
      if variant_02 $n $sets; then W="$W --drafter $n=$(named_path /tmp/runs-xl-$n 02_drafter_pretrain drafter)"; else all=0; fi
    done
    [ $all = 1 ] && [ "$(cat $O/tau-v02.list 2>/dev/null)" != "$XL_V02" ] && ok 90 && run tau-v02 python3 \
      benchmarks/drafter_tau_by_source.py --data $R/00_data $W --target ${XL_TARGET:-smol} --out $O/tau-v02.json \
      --prompts ${XL_V02_PROMPTS:-64} --new ${XL_V02_NEW:-128} --walk && echo "$XL_V02" > $O/tau-v02.list
  fi
  done_ 02_drafter_pretrain || { ok && stage 02_drafter_pretrain ${XL_02:-}; }   # XL_02="--set epochs=1"
  # XL_SPEED=pretrain: the drafter comes back in bf16 as soon as it exists (before the passes a deadline may cut)
  [ "${XL_SPEED:-}" = pretrain ] && done_ 02_drafter_pretrain && export_bf16 pretrain $(named_path $R 02_drafter_pretrain drafter)
  if [ -n "${XL_TAU-1}" ] && done_ 02_drafter_pretrain && [ ! -f $O/tau-pretrain-fp.json ] && ok 90; then
    run tau python3 benchmarks/drafter_tau_by_source.py --data $R/00_data --drafter pretrain=$(named_path $R 02_drafter_pretrain drafter) \
      --target ${XL_TARGET:-smol} --out $O/tau-pretrain-fp.json --prompts 64 --new 128
  fi
  # the drafter window at long context (issue 35 item 3, the GPU half; XL_SWA=W): stage 02 once more with train_window=W
  # (variant_02 swaW), then benchmarks/swa_long_context.py walks it and the
  # preset's stage-02 drafter, each with and without the window, on 32 real multi-turn prompts of XL_SWA_CTX tokens
  # (default 2048-8192: >= 16 W at W=128, the most the smol-gpu-xl drafter's 416-token training rows leave a window
  # to learn), and times one drafter step with caches up to 8K tokens
  if [ -n "${XL_SWA:-}" ] && done_ 02_drafter_pretrain; then
    ctx=${XL_SWA_CTX:-2048-8192}
    variant_02 swa$XL_SWA --set train_window=$XL_SWA && [ ! -f $O/swa-long-$XL_SWA.json ] && ok 120 && run swa$XL_SWA python3 \
      benchmarks/swa_long_context.py --data $R/00_data --target ${XL_TARGET:-smol} --window $XL_SWA \
      --drafter full=$(named_path $R 02_drafter_pretrain drafter) \
      --drafter swa$XL_SWA=$(named_path /tmp/runs-xl-swa$XL_SWA 02_drafter_pretrain drafter) \
      --prompts ${XL_SWA_PROMPTS:-32} --new 128 --min-tokens ${ctx%-*} --max-tokens ${ctx#*-} \
      --lengths ${XL_SWA_LENGTHS:-256,512,1024,2048,4096,8192} --out $O/swa-long-$XL_SWA.json
  fi
  [ "${XL_UNTIL:-}" = 02_drafter_pretrain ] && END=$(date +%s)   # nothing from stage 01 on
  done_ 01_qad || { ok && stage 01_qad; }
  [ "${XL_SPEED:-}" = pretrain ] && done_ 01_qad && done_ 02_drafter_pretrain && speed_pass pretrain \
    $(named_path $R 02_drafter_pretrain drafter)
  done_ 01_qad && done_ 02_drafter_pretrain && ! done_ 03_drafter_finetune && ok 120 && stage 03_drafter_finetune ${XL_02:-}
  [ "${XL_SPEED:-}" = 1 ] && done_ 03_drafter_finetune && speed_pass two_stage \
    $(named_path $R 03_drafter_finetune drafters two_stage)
  done_ 03_drafter_finetune && ! done_ 04_drafter_quant && ok 120 && stage 04_drafter_quant
fi
for s in 02_drafter_pretrain 03_drafter_finetune; do cp $R/$s/train_log*.jsonl $O/ 2>/dev/null; cp $R/$s/config.json $O/config-$s.json 2>/dev/null; done
cp $R/03_drafter_finetune/decode-*.json $R/04_drafter_quant/decode-04.json $O/ 2>/dev/null   # every decoded prompt
for s in 01_qad 03_drafter_finetune 04_drafter_quant; do cp $R/$s/metrics.json $O/metrics-$s.json 2>/dev/null; done
# each stage's provenance (GPU model, library versions, command, commit: issue 35 item 7)
for s in 00_data 01_qad 02_drafter_pretrain 03_drafter_finetune 04_drafter_quant; do cp $R/$s/run.json $O/run-$s.json 2>/dev/null; done
tar czf "$DEV_OUT/xl.tgz" --exclude=o/work -C /tmp o      # o/work: the scaling sweep's checkpoints (GBs)
ls -la $O
