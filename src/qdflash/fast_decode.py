"""Fast path of the reference speculative decoder for GPUs (issue 19): fixed shapes, static buffers, CUDA graphs.

Same algorithm and the same acceptance code as ``speculative.generate`` (``accept_drafts``/``emit_tokens``/``_sample``),
so it is lossless in the same sense; what changes is how state is kept, so that every decode step is a fixed-shape
graph that ``torch.compile(mode="reduce-overhead")`` can capture once and replay:

* **Target KV**: a transformers ``Cache`` of ``StaticLayer`` subclasses (``PositionedCache``) whose writes go to
  ``[position, position + n)`` of one shared position tensor that the decoder sets, and that ``update`` never
  advances. Rolling back rejected drafts is setting the next write position (``seek``): their K/V stay in the
  buffer, where the causal mask (keys after the query position are masked) hides them until the next block
  overwrites them. No crop, no copy.
* **Drafter context K/V**: per drafter layer one buffer ``[1, n_kv, C + B, d]``: context slots ``[0, C)`` written by
  position (append = write the last verify block's B positions at its start; trim = the valid length is the new
  start, later slots are masked and overwritten), then B slots for the block's own K/V. The sliding window is a
  mask by index (block position k sees context keys in ``[start - (window - 1 - k), start)``, ``drafter.window_mask``).
* **Target features**: forward hooks on the ``target_layer_ids`` decoder layers (on the final norm for the last
  layer, which is what HF ``hidden_states[-1]`` holds) keep only those layers' outputs.
* **Graphs**: plain step (1 token), verify step (B tokens) and draft step read and write only static buffers, so
  no tensor crosses from one graph to another; the host sets the anchor token and the positions (fills) and reads
  the drafts and the target's tokens back once per step. The prefill (variable length) runs eagerly.

Plain-attention targets only (Llama, Qwen3): a hybrid Qwen3.5 target's Gated DeltaNet states cannot be rolled back by
position; use ``speculative.generate`` for it. Batch 1.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, StaticLayer
from transformers.models.qwen3.modeling_qwen3 import repeat_kv

from .drafter import DFlashDraftModel, apply_rope, draft_tokens, in_window, resolve_window
from .decode_stats import GenResult
from .decode_steps import accept_drafts, emit_tokens, sample_tokens, sync


def check_plain_attention(target) -> None:
    """Raise a one-line ValueError unless every layer of ``target`` is full (causal) attention."""
    types = list(getattr(target.config, "layer_types", None) or [])
    other = sorted(set(types) - {"full_attention"})
    if other or "qwen3_5" in str(getattr(target.config, "model_type", "")):
        raise ValueError(f"fast_decode supports plain-attention targets (Llama/Qwen3) only; {type(target).__name__} "
                         f"has {other or 'hybrid'} layers: use the eager path qdflash.speculative.generate")


class PositionedLayer(StaticLayer):
    """A ``StaticLayer`` that writes new K/V at ``[position, position + n)`` of a position tensor shared by all layers
    and set by the decoder; unlike ``StaticLayer`` it keeps no running length, so rollback is a new position."""

    def __init__(self, max_cache_len: int, position: torch.Tensor):
        super().__init__(max_cache_len)
        self.position = position

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        idx = self.position + torch.arange(key_states.shape[-2], device=self.keys.device)
        self.keys.index_copy_(2, idx, key_states)
        self.values.index_copy_(2, idx, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> torch.Tensor:
        return self.position           # the query offset of the causal mask: keys at or after it are masked


class PositionedCache(Cache):
    """Static target KV cache (``PositionedLayer`` per layer), allocated up front on ``device``."""

    def __init__(self, config, max_len: int, device: torch.device, dtype: torch.dtype):
        self.position = torch.zeros((), dtype=torch.long, device=device)
        super().__init__(layers=[PositionedLayer(max_len, self.position) for _ in range(config.num_hidden_layers)])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.early_initialization(1, config.num_key_value_heads, head_dim, dtype, device)
        torch._dynamo.mark_static_address(self.position)

    def seek(self, position: int) -> None:
        """Next write position: the forward that follows writes (and attends up to) ``position + n - 1``; every
        entry at or after ``position`` is stale and invisible. This *is* the rollback of rejected drafts."""
        self.position.fill_(position)


class FastDecoder:
    """Batch-1 decoder with static buffers (see the module docstring). ``compile=True`` wraps the plain, verify and
    draft steps in ``torch.compile(mode=compile_mode, dynamic=False)`` (CUDA graphs with the default
    ``reduce-overhead``); off by default and meant for CUDA. ``fused``: greedy decoding runs each step as one call, the
    target's argmax inside it and, with a drafter, the draft and the verify in one graph (one launch and one host
    round trip a step instead of two; the tokens are the same; ``generate`` then cannot split draft from verify
    time and counts the whole step as verify); sampling (temperature > 0) keeps the unfused steps. ``window``: the drafter's context window in tokens
    (default: the drafter config's ``swa_window_size`` when ``use_swa``, else none). ``max_len`` bounds prompt +
    new tokens + one block. Call ``close()`` (or use ``with``) to remove the hooks from the target."""

    def __init__(self, target, drafter: DFlashDraftModel | None = None, max_len: int = 1024,
                 window: int | None = None, compile: bool = False, compile_mode: str = "reduce-overhead",
                 compile_backend: str = "inductor", fullgraph: bool = False, fused: bool = False):
        check_plain_attention(target)
        p = next(target.parameters())
        self.target, self.drafter, self.device, self.max_len = target, drafter, p.device, int(max_len)
        self.B = B = drafter.block_size if drafter is not None else 1
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.cache = PositionedCache(target.config, self.max_len + B, p.device, p.dtype)
        self.ids = torch.zeros(1, B, dtype=torch.long, device=p.device)      # [anchor, drafts]
        self._static = [self.ids]
        self._hooks, self._captured = [], {}
        if drafter is not None:
            self._init_drafter(drafter, window)
        self.compiled = bool(compile)
        mode = compile_mode if compile_backend == "inductor" else None      # a mode is inductor's option
        wrap = (lambda f: torch.compile(f, mode=mode, backend=compile_backend, dynamic=False,
                                        fullgraph=fullgraph)) if compile else (lambda f: f)
        if compile:
            for t in self._static:
                torch._dynamo.mark_static_address(t)
            # transformers installs its hidden-state capture hooks on the first output_hidden_states call and keeps
            # them; the graphs are guarded on the hook count, so install them now (a later eager call would recompile)
            with torch.no_grad():
                target(input_ids=self.ids[:, :1].clone(), use_cache=False, output_hidden_states=True)
            self._captured.clear()
        self._plain = wrap(self._plain_step)
        self._verify = wrap(self._verify_step)
        self._draft = wrap(self._draft_step) if drafter is not None else None
        # torch.compile is lazy: the fused step compiles only when generate uses it (greedy decoding)
        self._fused = wrap(self._fused_spec_step if drafter is not None else self._fused_plain_step) if fused else None

    # ------------------------------------------------------------------------------------------------ set-up
    def _init_drafter(self, d: DFlashDraftModel, window: int | None) -> None:
        B, dev, dtype = self.B, self.device, next(d.parameters()).dtype
        cfg = d.config
        self.window = resolve_window(d, window)
        self.layer_ids = d.target_layer_ids
        layers = self.target.base_model.layers
        for l in sorted(set(self.layer_ids)):
            # HF hidden_states[l + 1] is layer l's output, except the last entry, which is after the final norm
            mod = self.target.base_model.norm if l == len(layers) - 1 else layers[l]
            self._hooks.append(mod.register_forward_hook(self._capture_hook(l)))
        self.C = self.max_len + B                       # context slots: room for one unverified block's writes
        n_kv, hd = cfg.num_key_value_heads, d.layers[0].self_attn.head_dim
        self.dk = [torch.zeros(1, n_kv, self.C + B, hd, dtype=dtype, device=dev) for _ in d.layers]
        self.dv = [torch.zeros_like(k) for k in self.dk]
        n_feat = len(self.layer_ids) * self.target.config.hidden_size
        self.feats = torch.zeros(1, B, n_feat, dtype=next(self.target.parameters()).dtype, device=dev)
        self.dpos = torch.zeros(2, dtype=torch.long, device=dev)      # (block start, previous block start)
        self.mask_ids = torch.full((1, B - 1), d.mask_token_id, dtype=torch.long, device=dev)
        self.krange = torch.arange(B, device=dev)
        self._static += self.dk + self.dv + [self.feats, self.dpos, self.mask_ids, self.krange]

    def _capture_hook(self, layer: int):
        def hook(module, args, out) -> None:
            self._captured[layer] = out[0] if isinstance(out, tuple) else out
        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> FastDecoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ steps
    def _target_forward(self, ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        """Target forward of ``ids`` [1, n] at positions ``[cache.position, + n)``; logits [n (or keep), V]."""
        pos = self.cache.position + torch.arange(ids.shape[1], device=self.device)
        out = self.target(input_ids=ids, position_ids=pos[None], past_key_values=self.cache, use_cache=True,
                          logits_to_keep=logits_to_keep)
        return out.logits[0]

    def _features(self) -> torch.Tensor:
        feats = torch.cat([self._captured[l] for l in self.layer_ids], dim=-1)
        self._captured.clear()          # (inside a compiled step: no captured tensor leaves the graph)
        return feats

    def _plain_step(self) -> torch.Tensor:
        return self._target_forward(self.ids[:, :1])

    def _verify_step(self) -> torch.Tensor:
        logits = self._target_forward(self.ids)
        if self.drafter is not None:
            self.feats.copy_(self._features())          # the block's target features, for the next draft step
        return logits

    def _fused_plain_step(self) -> torch.Tensor:
        return self._plain_step().argmax(-1)

    def _fused_spec_step(self) -> torch.Tensor:
        """Draft, verify and the target's greedy tokens in one call: [drafts (B-1), target tokens (B)]."""
        self._draft_step()
        return torch.cat([self.ids[0, 1:], self._verify_step().argmax(-1)])

    def _write_context(self, feats: torch.Tensor, pos0: torch.Tensor) -> None:
        """Drafter context K/V of ``feats`` [1, n, n_t*H] at positions ``[pos0, pos0 + n)`` (by index)."""
        d, n = self.drafter, feats.shape[1]
        ctx = d.project_context(feats)
        cpos = pos0 + torch.arange(n, device=self.device)
        cos, sin = d.rotary_emb(ctx, cpos[None])
        for i, layer in enumerate(d.layers):
            a = layer.self_attn
            k = apply_rope(a.k_norm(a.k_proj(ctx).view(1, n, -1, a.head_dim)).transpose(1, 2), cos, sin)
            v = a.v_proj(ctx).view(1, n, -1, a.head_dim).transpose(1, 2)
            self.dk[i].index_copy_(2, cpos, k)
            self.dv[i].index_copy_(2, cpos, v)

    def _draft_step(self) -> None:
        """Append the last verify block's context (valid up to the new start: the trim is the mask), then draft the
        block [anchor, MASK x (B-1)] at positions [start, start + B); the drafts go to ``ids[:, 1:]``."""
        d, B, C = self.drafter, self.B, self.C
        start = self.dpos[0]
        self._write_context(self.feats, self.dpos[1])
        h = self.embed(torch.cat([self.ids[:, :1], self.mask_ids], dim=1))
        cos, sin = d.rotary_emb(h, (start + torch.arange(B, device=self.device))[None])
        kpos = torch.arange(C, device=self.device)
        valid = (kpos < start).expand(B, C)
        if self.window is not None:      # block position k sees the last W-1-k context tokens (drafter.window_mask)
            valid = valid & in_window(kpos[None, :], start, self.krange[:, None], self.window)
        mask = torch.cat([valid, torch.ones(B, B, dtype=torch.bool, device=self.device)], 1)[None, None]
        for i, layer in enumerate(d.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = apply_rope(a.q_norm(a.q_proj(x).view(1, B, -1, a.head_dim)).transpose(1, 2), cos, sin)
            self.dk[i][:, :, C:] = apply_rope(a.k_norm(a.k_proj(x).view(1, B, -1, a.head_dim)).transpose(1, 2), cos, sin)
            self.dv[i][:, :, C:] = a.v_proj(x).view(1, B, -1, a.head_dim).transpose(1, 2)
            k, v = repeat_kv(self.dk[i], a.num_key_value_groups), repeat_kv(self.dv[i], a.num_key_value_groups)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a.scaling)
            h = h + a.o_proj(o.transpose(1, 2).reshape(1, B, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.ids[:, 1:] = draft_tokens(d, self.lm_head, d.norm(h)[:, 1:])

    def _mark_step(self) -> None:
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()

    # ------------------------------------------------------------------------------------------------ decoding
    @torch.no_grad()
    def prefill(self, prompt_ids: list[int], temperature: float = 0.0,
                gen: torch.Generator | None = None) -> int:
        """Eager prefill of the prompt into the static caches; returns the first token."""
        P = len(prompt_ids)
        self.cache.seek(0)
        logits = self._target_forward(torch.tensor([prompt_ids], device=self.device), logits_to_keep=1)
        x = int(sample_tokens(logits, temperature, gen)[0])
        if self.drafter is not None:
            self._write_context(self._features(), torch.zeros((), dtype=torch.long, device=self.device))
        self.cache.seek(P)
        return x

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 eos_token_id: int | None = None, seed: int = 0, split_timing: bool = True) -> GenResult:
        """Same contract and result as ``speculative.generate``. ``split_timing``: synchronise after the draft to
        split draft and verify time (else the whole step is counted as verify time; ``decode_time_s`` is exact
        either way)."""
        P, B = len(prompt_ids), self.B
        if P + max_new_tokens + B > self.max_len:
            raise ValueError(f"prompt ({P}) + max_new_tokens ({max_new_tokens}) + block ({B}) exceeds "
                             f"max_len={self.max_len}; build the FastDecoder with a larger max_len")
        gen = torch.Generator(device=self.device).manual_seed(seed) if temperature > 0 else None
        res = GenResult(tokens=[], block_size=B)
        sync(self.device)
        t0 = time.perf_counter()
        x = self.prefill(prompt_ids, temperature, gen)
        start = prev = P
        sync(self.device)
        res.prefill_time_s = time.perf_counter() - t0
        res.tokens.append(x)
        done = x == eos_token_id or len(res.tokens) >= max_new_tokens
        while not done:
            t0 = time.perf_counter()
            self._mark_step()
            self.ids[:, :1].fill_(x)
            self.cache.seek(start)          # rollback by position: the rejected drafts' K/V are now invisible
            if self._draft is not None:
                self.dpos[0].fill_(start)
                self.dpos[1].fill_(prev)
            if self._fused is not None and temperature <= 0:
                row = self._fused().tolist()                            # the one device -> host read of the step
            elif self._draft is not None:
                self._draft()
                if split_timing:
                    sync(self.device)
                    t1 = time.perf_counter()
                    res.draft_time_s += t1 - t0
                    t0 = t1
                logits = self._verify()
                row = torch.cat([self.ids[0, 1:], sample_tokens(logits, temperature, gen)]).tolist()
            else:
                row = sample_tokens(self._plain(), temperature, gen).tolist()
            acc, new = accept_drafts([x] + row[: B - 1], row[B - 1:])
            res.verify_time_s += time.perf_counter() - t0
            res.accept_lengths.append(acc + 1)
            prev, start = start, start + acc + 1
            x = new[-1]
            done = emit_tokens(res.tokens, new, eos_token_id, max_new_tokens)
        return res
