"""The DFlash block-diffusion drafter, built from transformers' Qwen3 building blocks.

* ``fc`` projects the concatenation of the target hidden states of ``target_layer_ids`` (the output of 0-based
  layer ``l`` is HF ``hidden_states[l + 1]``) to the drafter width; ``hidden_norm`` normalises it. That context is
  injected as extra K/V into every layer (each layer's own ``k_proj``/``k_norm``/``v_proj``); queries come only
  from the block.
* A block is ``[anchor, MASK x (B-1)]`` embedded with the *target's* embedding; attention inside the block is
  bidirectional; position k predicts the token at position k through the target's ``lm_head`` (same-position).
* The checkpoint has no embeddings or lm_head and a config that vLLM's ``dflash`` method accepts
  (``architectures: [DFlashDraftModel]``, ``model_type: qwen3``, ``block_size``, ``dflash_config``).

Inference keeps a per-layer cache of *context* K/V only (block K/V are recomputed each step and never cached,
which is the reference's ``crop(start)``). ``window`` W enables the drafter sliding window with vLLM's semantics (a
per-query window of W - 1 positions back over [context | block], the block bidirectional): block position k sees the
last W - 1 - k context tokens and its whole block. ``window_mask`` is that rule; the decoders, the training mask
(``drafter_train.block_mask``) and vLLM's DFlash attention (FlashAttention / CPU sliding window, non-causal) agree on
it, which tests/test_high_accept.py checks against vLLM itself. W must be at least the block size.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (Qwen3Attention, Qwen3DecoderLayer, Qwen3PreTrainedModel,
                                                      Qwen3RMSNorm, Qwen3RotaryEmbedding, repeat_kv, rotate_half)

from .config import DRAFTER_INITS


def build_drafter_config(target_config, num_layers: int, block_size: int, target_layer_ids, mask_token_id: int,
                         intermediate_size: int | None = None, sliding_window: int | None = None) -> Qwen3Config:
    tc = target_config
    n_tgt = tc.num_hidden_layers
    bad = [i for i in target_layer_ids if not 0 <= i < n_tgt]
    if bad:
        raise ValueError(f"target_layer_ids {bad} out of range for a {n_tgt}-layer target")
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rope_theta = getattr(tc, "rope_theta", None) or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 1e6)
    cfg = Qwen3Config(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size,
        intermediate_size=intermediate_size or tc.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads, head_dim=head_dim,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6), max_position_embeddings=tc.max_position_embeddings,
        rope_theta=rope_theta, tie_word_embeddings=False, attention_bias=False,
        layer_types=["full_attention"] * num_layers)
    cfg.architectures = ["DFlashDraftModel"]
    cfg.block_size = int(block_size)
    cfg.num_target_layers = int(n_tgt)
    cfg.target_hidden_size = int(tc.hidden_size)
    cfg.dflash_config = {"mask_token_id": int(mask_token_id), "target_layer_ids": [int(i) for i in target_layer_ids]}
    if sliding_window:
        cfg.dflash_config.update({"use_swa": True, "swa_window_size": int(sliding_window)})
    return cfg


def check_window(window: int | None, block_size: int) -> None:
    if window is not None and int(window) < block_size:
        raise ValueError(f"drafter window {window} is shorter than the block ({block_size}): the last block positions "
                         "would see no context and part of their own block")


def in_window(key_pos, start, k, window: int):
    """vLLM's drafter window rule, the one place it is written: a context key at position ``key_pos`` is visible to
    block position ``k`` of a block starting at ``start`` iff key_pos >= start - (W - 1 - k) (tensors broadcast).
    ``window_mask`` (decoders), ``drafter_train.block_mask`` (training) and ``FastDecoder`` (static buffers) use it."""
    return key_pos >= start - (window - 1 - k)


def window_mask(n_ctx: int, block_size: int, window: int, device=None) -> torch.Tensor:
    """bool [B, n_ctx + B] over keys [the last n_ctx context tokens | block]: block position k sees context index j
    iff j >= n_ctx - (W - 1 - k), and the whole block (vLLM's per-query window of W - 1 positions back)."""
    check_window(window, block_size)
    j = torch.arange(n_ctx, device=device)
    k = torch.arange(block_size, device=device)
    ctx = in_window(j[None, :], n_ctx, k[:, None], window)
    return torch.cat([ctx, torch.ones(block_size, block_size, dtype=torch.bool, device=device)], 1)


def resolve_window(drafter, window: int | None) -> int | None:
    """The window a decoder uses: ``window`` when given (0: none), else the checkpoint's (``dflash_config.use_swa`` /
    ``swa_window_size``, as vLLM reads it), else none."""
    if window is None:
        dc = getattr(getattr(drafter, "config", None), "dflash_config", None) or {}
        window = int(dc["swa_window_size"]) if dc.get("use_swa") and dc.get("swa_window_size") else None
    window = int(window) if window else None
    if drafter is not None:
        check_window(window, drafter.block_size)
    return window


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


@dataclass
class DraftCache:
    """Context K/V per layer (already normed and rotated): lists of [b, n_kv, T, d]; with a window W only the last
    W - 1 context positions are kept (``len`` is then what is held, not the context length)."""
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    def __len__(self) -> int:
        return 0 if not self.keys else self.keys[0].shape[2]


class DFlashAttention(Qwen3Attention):
    """Qwen3 attention whose keys/values are [context (cached + new) | block] and whose queries are the block."""

    def forward(self, x, ctx, pe_q, pe_c, cache: DraftCache | None = None, attn_mask=None, window=None):
        b, q_len, _ = x.shape
        d = self.head_dim
        q = self.q_norm(self.q_proj(x).view(b, q_len, -1, d)).transpose(1, 2)
        kx = self.k_norm(self.k_proj(x).view(b, q_len, -1, d)).transpose(1, 2)
        vx = self.v_proj(x).view(b, q_len, -1, d).transpose(1, 2)
        q, kx = apply_rope(q, *pe_q), apply_rope(kx, *pe_q)
        ks, vs = [], []
        if ctx is not None and ctx.shape[1] > 0:
            c = ctx.shape[1]
            kc = apply_rope(self.k_norm(self.k_proj(ctx).view(b, c, -1, d)).transpose(1, 2), *pe_c)
            vc = self.v_proj(ctx).view(b, c, -1, d).transpose(1, 2)
            if cache is not None:
                i = self.layer_idx
                if len(cache.keys) <= i:
                    cache.keys.append(kc)
                    cache.values.append(vc)
                else:
                    cache.keys[i] = torch.cat([cache.keys[i], kc], 2)
                    cache.values[i] = torch.cat([cache.values[i], vc], 2)
            else:
                ks, vs = [kc], [vc]
        if cache is not None and len(cache.keys) > self.layer_idx:
            i = self.layer_idx
            if window is not None and cache.keys[i].shape[2] > window - 1:
                # no later query sees a context key older than the last W - 1 (positions only grow): the cache keeps
                # those alone, so a windowed drafter's memory and per-step work stay flat as the context grows
                cache.keys[i], cache.values[i] = cache.keys[i][:, :, 1 - window:], cache.values[i][:, :, 1 - window:]
            ks, vs = [cache.keys[i]], [cache.values[i]]
        if window is not None:
            ks, vs, attn_mask = self._windowed(ks, vs, q_len, window, attn_mask, kx.device)
        k = torch.cat(ks + [kx], 2)
        v = torch.cat(vs + [vx], 2)
        k, v = repeat_kv(k, self.num_key_value_groups), repeat_kv(v, self.num_key_value_groups)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


    @staticmethod
    def _windowed(ks, vs, q_len, window, attn_mask, device):
        """Inference with a window: keep the last W - 1 context keys and mask them per query (``window_mask``)."""
        if attn_mask is not None:
            raise ValueError("window= is for inference; training passes its window inside attn_mask (block_mask)")
        keep = window - 1
        if ks and ks[0].shape[2] > keep:
            ks, vs = [ks[0][:, :, -keep:]], [vs[0][:, :, -keep:]]
        n_ctx = ks[0].shape[2] if ks else 0
        return ks, vs, window_mask(n_ctx, q_len, window, device=device)[None, None]


class DFlashDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = DFlashAttention(config, layer_idx)

    def forward(self, h, ctx, pe_q, pe_c, cache=None, attn_mask=None, window=None):
        h = h + self.self_attn(self.input_layernorm(h), ctx, pe_q, pe_c, cache, attn_mask, window)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(Qwen3PreTrainedModel):
    config_class = Qwen3Config
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        n_t = len(config.dflash_config["target_layer_ids"])
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(n_t * getattr(config, "target_hidden_size", config.hidden_size), config.hidden_size,
                            bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        n_draft = int(config.dflash_config.get("draft_vocab_size") or 0)
        if n_draft:      # reduced draft vocabulary: draft index i is target token d2t[i] (saved with the weights)
            self.register_buffer("d2t", torch.arange(n_draft, dtype=torch.long))
        self.post_init()

    @property
    def block_size(self) -> int:
        return int(self.config.block_size)

    @property
    def mask_token_id(self) -> int:
        return int(self.config.dflash_config["mask_token_id"])

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.config.dflash_config["target_layer_ids"])

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """The target token ids the drafter can propose (sorted), or None: the target's whole vocabulary."""
        return getattr(self, "d2t", None)

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, noise_embedding: torch.Tensor, target_hidden: torch.Tensor | None, q_pos: torch.Tensor,
                ctx_pos: torch.Tensor | None, cache: DraftCache | None = None, attn_mask: torch.Tensor | None = None,
                window: int | None = None) -> torch.Tensor:
        """noise_embedding [b,Q,H]; target_hidden [b,C,n_t*H_t] (raw concat, new context only); positions [b,Q]
        and [b,C]; attn_mask: bool [b,1,Q,K] over keys [context | block] (training) or None (inference)."""
        h = noise_embedding
        ctx = self.project_context(target_hidden) if target_hidden is not None and target_hidden.shape[1] else None
        pe_q = self.rotary_emb(h, q_pos)
        pe_c = self.rotary_emb(h, ctx_pos) if ctx is not None else None
        for layer in self.layers:
            h = layer(h, ctx, pe_q, pe_c, cache, attn_mask, window)
        return self.norm(h)


def target_features(hidden_states, layer_ids) -> torch.Tensor:
    """Concatenate HF ``hidden_states[l + 1]`` (output of 0-based decoder layer l) over ``layer_ids``."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def set_draft_vocab(drafter: DFlashDraftModel, token_ids) -> DFlashDraftModel:
    """Restrict ``drafter``'s proposals to ``token_ids`` (EAGLE-3's draft-to-target map, FR-Spec's reduced vocabulary):
    its logits are computed over those rows of the target's lm_head only; a drafted index i means token
    ``token_ids[i]``. The verifier is unchanged, so decoding stays lossless; a token outside the set is never drafted."""
    ids = torch.as_tensor(sorted({int(t) for t in token_ids}), dtype=torch.long)
    V = int(drafter.config.vocab_size)
    if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= V:
        raise ValueError(f"draft vocabulary must be non-empty ids in [0, {V}); got {len(ids)} ids")
    drafter.config.dflash_config = {**drafter.config.dflash_config, "draft_vocab_size": len(ids)}
    dev = next(drafter.parameters()).device
    if hasattr(drafter, "d2t"):
        del drafter.d2t
    drafter.register_buffer("d2t", ids.to(dev))
    return drafter


def _draft_vocab(drafter) -> torch.Tensor | None:
    return getattr(drafter, "draft_vocab", None)      # drafter-like test doubles have none


def target_to_draft(drafter: DFlashDraftModel, vocab_size: int) -> torch.Tensor | None:
    """[vocab_size] long: the draft index of each target token, -1 where the drafter cannot propose it (None: the
    full vocabulary)."""
    d2t = _draft_vocab(drafter)
    if d2t is None:
        return None
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[d2t.cpu()] = torch.arange(len(d2t))
    return t2d


def draft_head_weight(drafter: DFlashDraftModel, lm_head) -> torch.Tensor:
    """The lm_head rows the drafter scores: all of them, or those of its draft vocabulary."""
    d2t = _draft_vocab(drafter)
    return lm_head.weight if d2t is None else lm_head.weight.index_select(0, d2t)


def head_logits(weight: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``F.linear(h, weight)`` ([..., H] x [V, H] -> [..., V]). On the CPU, for the few rows of one draft block, as
    ``(weight @ h.T).T``: the same products summed in another order, and MKL's GEMM with the vocabulary-sized operand
    on the left is 2-5x faster there (`benchmarks/cpu_head_gemm.py`: the smol head, 7 rows, AMD EPYC)."""
    rows = h.numel() // max(1, h.shape[-1])
    if h.device.type != "cpu" or rows > HEAD_GEMM_MAX_ROWS or h.dtype != weight.dtype or h.dim() < 2:
        return F.linear(h, weight)
    return (weight @ h.reshape(rows, h.shape[-1]).t()).t().reshape(*h.shape[:-1], weight.shape[0])


HEAD_GEMM_MAX_ROWS = 8          # above it the two orders are within noise of each other on the machines measured


def draft_tokens(drafter: DFlashDraftModel, lm_head, h: torch.Tensor) -> torch.Tensor:
    """The drafter's greedy proposals (target token ids) from its final states ``h`` [..., H]."""
    d2t = _draft_vocab(drafter)
    plain_head = isinstance(lm_head, torch.nn.Linear) and lm_head.bias is None
    if d2t is None:
        return (head_logits(lm_head.weight, h) if plain_head else lm_head(h)).argmax(-1)
    return d2t[head_logits(draft_head_weight(drafter, lm_head), h).argmax(-1)]


def most_frequent_tokens(rows: list[dict], size: int, max_len: int | None = None) -> tuple[list[int], float]:
    """The ``size`` most frequent supervised (``loss_mask``) tokens of ``rows`` (ties: lower id first), and the share
    of supervised tokens they cover."""
    counts: dict[int, int] = {}
    for r in rows:
        for t, m in zip(r["input_ids"][:max_len], r["loss_mask"][:max_len]):
            if m:
                counts[t] = counts.get(t, 0) + 1
    top = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    total = sum(counts.values())
    return sorted(top), (sum(counts[t] for t in top) / total if total else 0.0)


@torch.no_grad()
def init_from_target(drafter: DFlashDraftModel, target, mode: str) -> list[str]:
    """Warm-start a drafter from its target; returns the names of the tensors copied.

    ``random``: nothing (DFlash's default). ``target_norm``: the drafter's final ``norm`` takes the target's final
    norm weight. ``target_layers``: additionally, drafter layer i takes every tensor of target layer
    ``n_target - L + i`` whose name and shape match (projections, MLP, layer norms); the Qwen3-only
    ``q_norm``/``k_norm`` keep their unit init. Measured on smol (README): initial cross-entropy 59 (random),
    77 (target_norm), 20 (target_layers); after training, the three end within noise of each other."""
    if mode not in DRAFTER_INITS:
        raise ValueError(f"unknown drafter init {mode!r}; choose one of {DRAFTER_INITS}")
    copied: list[str] = []
    if mode == "random":
        return copied
    base = getattr(target, "model", target)
    src_norm = getattr(base, "norm", None)
    if src_norm is not None and src_norm.weight.shape == drafter.norm.weight.shape:
        drafter.norm.weight.copy_(effective_norm_weight(src_norm).to(drafter.norm.weight.dtype))
        copied.append("norm.weight")
    if mode == "target_layers":
        t_layers = base.layers
        L = len(drafter.layers)
        for i, layer in enumerate(drafter.layers):
            t_layer = t_layers[len(t_layers) - L + i]
            src = dict(t_layer.named_parameters())
            for name, p in layer.named_parameters():
                if name in src and src[name].shape == p.shape:
                    mod = name.rsplit(".", 1)[0]
                    w = effective_norm_weight(t_layer.get_submodule(mod)) if name.endswith("norm.weight") else src[name]
                    p.copy_(w.to(p.dtype))
                    copied.append(f"layers.{i}.{name}")
    return copied


@torch.no_grad()
def effective_norm_weight(norm: torch.nn.Module) -> torch.Tensor:
    """The per-channel scale an RMS norm applies to a unit-RMS input: ``weight`` for Llama/Qwen3 norms, ``1 + weight``
    for Qwen3.5's zero-centred norm (whose weights start at 0). The drafter's norms are the standard kind, so a
    warm start copies this scale, not the raw parameter."""
    w = norm.weight
    eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 0.0)))
    y = norm(torch.ones(1, w.shape[0], dtype=w.dtype, device=w.device))
    return y.float()[0] * math.sqrt(1.0 + eps)


def new_drafter(target, num_layers: int, block_size: int, target_layer_ids, mask_token_id: int,
                intermediate_size: int | None = None, seed: int = 0, init: str = "random",
                sliding_window: int | None = None) -> DFlashDraftModel:
    torch.manual_seed(seed)
    check_window(sliding_window, block_size)
    cfg = build_drafter_config(target.config, num_layers, block_size, target_layer_ids, mask_token_id,
                               intermediate_size, sliding_window)
    d = DFlashDraftModel(cfg).to(target.dtype)
    init_from_target(d, target, init)
    return d


def save_drafter(drafter: DFlashDraftModel, out_dir: str | Path, extra: dict | None = None) -> Path:
    import shutil
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    drafter.save_pretrained(tmp)
    if extra:
        (tmp / "drafter_meta.json").write_text(json.dumps(extra, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def export_draft_vocab_for_vllm(src: str | Path, target_lm_head: torch.Tensor, dst: str | Path,
                                dtype: torch.dtype | None = None) -> Path:
    """A saved drafter with a reduced draft vocabulary (``set_draft_vocab``), rewritten as vLLM's DFlash model reads
    one (vllm 0.32 ``qwen3_dflash``, EAGLE-3's convention): the top-level ``draft_vocab_size``, the draft vocabulary's
    rows of the target's lm_head as the drafter's own ``lm_head.weight``, and ``d2t`` as offsets (draft index i is
    target token i + d2t[i]; this package keeps the token ids themselves). Every other file and tensor (packed INT4
    weights included) is copied unchanged. The result is for vLLM only: ``load_drafter`` refuses it.

    ``target_lm_head`` must be the lm_head of the target vLLM will serve: the export freezes its rows, where this
    package's decoders read the serving target's head at every step. ``dtype``: of the exported head (default: that of
    the drafter's norm weights, i.e. the dtype it was saved in)."""
    import shutil

    from safetensors.torch import load_file, save_file
    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text())
    n = int((cfg.get("dflash_config") or {}).get("draft_vocab_size") or 0)
    if not n:
        raise ValueError(f"{src} has the target's whole vocabulary: vLLM serves it as it is, no export needed")
    if target_lm_head.dim() != 2 or target_lm_head.shape[1] != int(cfg["hidden_size"]):
        raise ValueError(f"target lm_head {tuple(target_lm_head.shape)} does not match the drafter's hidden size "
                         f"{cfg['hidden_size']}")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    files = sorted(tmp.glob("*.safetensors"))
    found = False
    for f in files:
        state = load_file(f)
        if "d2t" in state:
            ids = state["d2t"].long()
            if ids.numel() != n or int(ids.max()) >= target_lm_head.shape[0]:
                raise ValueError(f"{src}: d2t has {ids.numel()} ids (config: {n}) or an id beyond the target's "
                                 f"{target_lm_head.shape[0]} rows")
            dtype = dtype or next((v.dtype for k, v in state.items()
                                   if v.is_floating_point() and k.endswith("norm.weight")), target_lm_head.dtype)
            state["d2t"] = ids - torch.arange(n)
            state["lm_head.weight"] = target_lm_head.detach().index_select(0, ids.to(target_lm_head.device)) \
                .to("cpu", dtype).contiguous()
            save_file(state, f, metadata={"format": "pt"})
            found = True
    if not found:
        raise ValueError(f"{src}: no d2t tensor in {[f.name for f in files]}")
    cfg["draft_vocab_size"] = n
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDraftModel:
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a drafter checkpoint (no config.json)")
    cfg = json.loads((path / "config.json").read_text())
    if "DFlashDraftModel" not in (cfg.get("architectures") or []) or "dflash_config" not in cfg:
        raise ValueError(f"{path} is not a DFlash drafter (architectures={cfg.get('architectures')})")
    if cfg.get("draft_vocab_size"):
        raise ValueError(f"{path} is a vLLM export (export_draft_vocab_for_vllm: d2t as offsets); load its source")
    if cfg.get("quantization_config"):
        return load_quantized_drafter(path, dtype)
    return DFlashDraftModel.from_pretrained(path, dtype=dtype).eval()


def load_quantized_drafter(path: str | Path, dtype=torch.float32) -> DFlashDraftModel:
    """Load a pack-quantized drafter and de-quantize it to dense weights (the reference decoder's view)."""
    from .quant import dequantize, read_grid
    cfg = json.loads((Path(path) / "config.json").read_text())
    cfg.pop("quantization_config")
    from transformers import Qwen3Config
    conf = Qwen3Config.from_dict(cfg)
    for k in ("block_size", "dflash_config", "num_target_layers", "target_hidden_size"):
        if k in cfg:
            setattr(conf, k, cfg[k])
    model = DFlashDraftModel(conf)
    from .quant import load_state
    state = load_state(path)
    ints, scales, group, _ = read_grid(path)
    dense = {k: v for k, v in state.items() if not k.rsplit(".", 1)[-1].startswith("weight_")}
    for name, q in ints.items():
        dense[name + ".weight"] = dequantize(q.float(), scales[name], group)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise ValueError(f"drafter checkpoint {path} does not match its config: missing={missing} "
                         f"unexpected={unexpected}")
    return model.to(dtype).eval()
