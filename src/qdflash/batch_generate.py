"""Batched generation of a plain-attention target (Llama, Qwen3) with a static KV cache and CUDA graphs: stage 00's
``backend="fast"`` and the magpie prompt writer.

Transformers' ``generate`` re-builds masks, caches and Python state every token; at 135M parameters that overhead, not
the GPU, sets the pace (14-26K tok/s on one H200). Here one decode step is one fixed-shape function that reads and
writes only preallocated buffers, so on CUDA it is captured once as a CUDA graph and replayed for every token:

* **Layout.** A batch of ``B`` prompts is left-padded to its longest prompt ``W``; slot ``j`` of row ``b`` holds the
  token at position ``j - pad[b]``. Prompt K/V fill slots ``[0, W)`` (eager prefill, the one variable-shape call);
  decode step ``t`` writes slot ``W + t``. Keys are valid from ``pad[b]`` up to the current slot, so a step reads
  only the slots up to the next multiple of ``key_bucket`` (64) above it, masked past the current one: one graph per
  bucket serves every ``W`` and every step in it (a static cache read whole would cost every step the longest row).
* **Attention.** At one query token, grouped-query attention folds the ``n_heads / n_kv`` query heads that share a
  K/V head into the query-length axis: ``[B, n_kv, group, d]`` against ``[B, n_kv, T, d]``, no ``repeat_kv`` copy.
* **Sampling.** Greedy is ``argmax`` in the graph. Temperature sampling without top-p is the Gumbel-max trick in the
  graph (an exact sample of ``softmax(logits / T)``); with top-p the graph returns logits and the host samples.
* **Stopping.** A row is finished after its EOS (later tokens are cut); the loop ends when every row is finished,
  checked every ``check_every`` steps (one device->host read).

On the CPU the same code runs eagerly (tests: the greedy tokens equal transformers' ``generate``, ``tests/
test_batch_generate.py``). Weights are the model's own modules, used as they are (no copy, no conversion).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def check_supported(model) -> None:
    """Raise a one-line ValueError unless ``model`` is a plain-attention decoder this generator knows."""
    cfg = model.config
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"batch_generate supports full-attention Llama/Qwen3 targets only, not {cfg.model_type} "
                         f"with {sorted(types)} layers: use backend 'hf'")
    if getattr(cfg, "rope_scaling", None) and (cfg.rope_scaling or {}).get("rope_type", "default") not in (
            "default", "llama3"):
        raise ValueError(f"rope type {cfg.rope_scaling.get('rope_type')!r} is not supported: use backend 'hf'")


@dataclass
class GenerateStats:
    """What one ``generate`` call measured (output tokens counted up to and including each row's EOS)."""
    rows: int = 0
    output_tokens: int = 0
    steps: int = 0
    batches: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    capture_s: float = 0.0
    wall_s: float = 0.0
    graphs: bool = False
    per_batch: list = field(default_factory=list)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / max(self.wall_s, 1e-9)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "output_tokens": self.output_tokens, "steps": self.steps, "batches": self.batches,
                "prefill_s": round(self.prefill_s, 3), "decode_s": round(self.decode_s, 3),
                "capture_s": round(self.capture_s, 3), "wall_s": round(self.wall_s, 3), "graphs": self.graphs,
                "output_tokens_per_s": round(self.output_tokens_per_s, 1)}


class BatchGenerator:
    """Static-cache batched generator for ``model`` (see the module docstring).

    ``batch_size`` rows per batch (a short last batch is filled with copies of its first prompt), ``max_len`` slots
    per row (longest prompt + ``max_new_tokens`` must fit). ``graphs``: capture the decode step as a CUDA graph
    (default: on CUDA). Memory: the K/V buffers take ``2 * layers * batch * kv_heads * max_len * head_dim`` elements.
    """

    def __init__(self, model, batch_size: int, max_len: int, graphs: bool | None = None, check_every: int = 16,
                 key_bucket: int = 64):
        check_supported(model)
        p = next(model.parameters())
        self.model, self.device, self.dtype = model, p.device, p.dtype
        self.B, self.T, self.check_every = int(batch_size), int(max_len), int(check_every)
        self.key_bucket = max(1, int(key_bucket))
        self._L = self.T                    # keys a decode step reads: slots [0, L), L the bucket above the slot
        self.graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        base = model.base_model if hasattr(model, "base_model") else model.model
        self.layers, self.norm, self.rotary = base.layers, base.norm, base.rotary_emb
        self.embed, self.lm_head = model.get_input_embeddings(), model.get_output_embeddings()
        cfg = model.config
        a0 = self.layers[0].self_attn
        self.hd = a0.head_dim
        self.n_kv = cfg.num_key_value_heads
        self.n_h = cfg.num_attention_heads
        self.group = self.n_h // self.n_kv
        self.scaling = a0.scaling
        dev, B, T = self.device, self.B, self.T
        shape = (B, self.n_kv, T, self.hd)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        # the decode step's static inputs and outputs
        self.tok = torch.zeros(B, dtype=torch.long, device=dev)          # this step's input token per row
        self.slot = torch.zeros((), dtype=torch.long, device=dev)        # the slot this step writes
        self.pad = torch.zeros(B, dtype=torch.long, device=dev)          # left padding per row
        self.inv_temp = torch.ones((), dtype=torch.float32, device=dev)
        self.slots = torch.arange(T, device=dev)
        self.out_tok = torch.zeros(B, dtype=torch.long, device=dev)
        self.out_logits: torch.Tensor | None = None
        self._graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._capture_s = 0.0
        self.vocab = cfg.vocab_size

    # ------------------------------------------------------------------------------------------------ forward
    def _qkv(self, layer, x: torch.Tensor, cos, sin):
        a = layer.self_attn
        Bn, n, _ = x.shape
        q = a.q_proj(x).view(Bn, n, -1, self.hd)
        k = a.k_proj(x).view(Bn, n, -1, self.hd)
        if hasattr(a, "q_norm"):                  # Qwen3: per-head RMSNorm of q and k before RoPE
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)   # transformers' own RoPE
        v = a.v_proj(x).view(Bn, n, -1, self.hd).transpose(1, 2)
        return q, k, v

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h)).float()

    @torch.no_grad()
    def _prefill(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Prompts ``ids`` [B, W] (left-padded by ``pad``) into slots [0, W); returns the last position's logits."""
        B, W = ids.shape
        pos = (torch.arange(W, device=self.device)[None] - pad[:, None]).clamp(min=0)
        h = self.embed(ids)
        cos, sin = self.rotary(h, pos)
        j = torch.arange(W, device=self.device)
        mask = (j[None, :] <= j[:, None])[None] & (j[None, None, :] >= pad[:, None, None])      # [B, W, W]
        mask = mask | torch.eye(W, dtype=torch.bool, device=self.device)[None]   # pad rows attend to themselves
        mask = mask[:, None]
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            q, k, v = self._qkv(layer, x, cos, sin)
            self.k[i][:, :, :W] = k
            self.v[i][:, :, :W] = v
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.group > 1)
            h = h + layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, W, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(h[:, -1:])[:, 0]

    def _decode_logits(self) -> torch.Tensor:
        """One token per row at ``slot``: K/V written there, attention over the valid slots; logits [B, V]."""
        B = self.B
        pos = (self.slot - self.pad)[:, None]                                      # [B, 1]
        h = self.embed(self.tok[:, None])
        cos, sin = self.rotary(h, pos)
        L = self._L                      # only the first L slots can be valid at this step: read no more keys
        slots = self.slots[:L]
        valid = (slots[None, :] >= self.pad[:, None]) & (slots[None, :] <= self.slot)  # [B, L]
        mask = valid[:, None, None, :]
        idx = self.slot.reshape(1)
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            q, k, v = self._qkv(layer, x, cos, sin)
            self.k[i].index_copy_(2, idx, k)
            self.v[i].index_copy_(2, idx, v)
            # the query heads that share a K/V head become that head's query rows (one query position: no causality)
            qg = q.reshape(B, self.n_kv, self.group, self.hd)
            o = F.scaled_dot_product_attention(qg, self.k[i][:, :, :L], self.v[i][:, :, :L], attn_mask=mask,
                                               scale=self.scaling)
            h = h + layer.self_attn.o_proj(o.reshape(B, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self._logits(h)[:, 0]

    def _step_greedy(self) -> None:
        self.out_tok.copy_(self._decode_logits().argmax(-1))

    def _step_gumbel(self) -> None:
        logits = self._decode_logits() * self.inv_temp
        u = torch.rand_like(logits).clamp_(min=1e-20)
        self.out_tok.copy_((logits - torch.log(-torch.log(u))).argmax(-1))

    def _step_logits(self) -> None:
        self.out_logits.copy_(self._decode_logits())

    def _run_step(self, mode: str, slot: int) -> None:
        """Decode step writing ``slot`` (also set in ``self.slot``); one CUDA graph per (mode, key bucket)."""
        fn = {"greedy": self._step_greedy, "gumbel": self._step_gumbel, "logits": self._step_logits}[mode]
        if mode == "logits" and self.out_logits is None:
            self.out_logits = torch.zeros(self.B, self.vocab, dtype=torch.float32, device=self.device)
        self._L = min(self.T, -(-(slot + 1) // self.key_bucket) * self.key_bucket)
        if not self.graphs:
            with torch.no_grad():
                fn()
            return
        key = (mode, self._L)
        if key not in self._graphs:
            self._capture(fn, key)
        self._graphs[key].replay()

    def _capture(self, fn, key: tuple[str, int]) -> None:
        t0 = time.perf_counter()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()     # the graphs run one at a time: one memory pool
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):                      # warm-up outside the graph (allocator, kernel selection)
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool), torch.no_grad():
            fn()
        self._graphs[key] = g
        torch.cuda.synchronize()
        self._capture_s += time.perf_counter() - t0

    # ------------------------------------------------------------------------------------------------ sampling
    @staticmethod
    def _sample_host(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None
                     ) -> torch.Tensor:
        """Nucleus sampling of ``logits`` [B, V] (the top-p path; greedy at temperature 0)."""
        if temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p >= 1.0:
            return torch.multinomial(probs, 1, generator=gen)[:, 0]
        # the nucleus from the top 1024 tokens when they hold top_p of the mass (exact then; a full sort is only
        # needed for the rows where they do not)
        k = min(1024, probs.shape[-1])
        sp, si = probs.topk(k, dim=-1)
        short = sp.sum(-1) < top_p
        if bool(short.any()):
            full_p, full_i = probs[short].sort(dim=-1, descending=True)
            sp_full = torch.zeros(probs.shape[0], probs.shape[-1], dtype=sp.dtype, device=sp.device)
            si_full = torch.zeros(probs.shape[0], probs.shape[-1], dtype=si.dtype, device=si.device)
            sp_full[:, :k], si_full[:, :k] = sp, si
            sp_full[short], si_full[short] = full_p, full_i
            sp, si = sp_full, si_full
        keep = sp.cumsum(-1) - sp < top_p                   # the smallest prefix whose mass reaches top_p
        sp = sp * keep
        choice = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=gen)
        return si.gather(-1, choice)[:, 0]

    # ------------------------------------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None,
                 pad_token_id: int = 0, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 sort_by_length: bool = True, progress=None) -> tuple[list[list[int]], GenerateStats]:
        """Generated ids of every prompt (in input order), each cut after its first EOS; and what was measured.
        ``progress``: a callable taking the number of rows just finished (e.g. a tqdm bar's ``update``)."""
        if not prompts:
            return [], GenerateStats()
        longest = max(len(p) for p in prompts)
        if longest + max_new_tokens > self.T:
            raise ValueError(f"longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_len="
                             f"{self.T}; build the BatchGenerator with a larger max_len")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or [])
        eos_t = torch.tensor(sorted(eos) or [-1], device=self.device)
        mode = "greedy" if temperature <= 0 else ("gumbel" if top_p >= 1.0 else "logits")
        self.inv_temp.fill_(1.0 / temperature if temperature > 0 else 1.0)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i])) if sort_by_length else \
            list(range(len(prompts)))
        stats = GenerateStats(graphs=self.graphs)
        self._capture_s = 0.0
        out: list[list[int] | None] = [None] * len(prompts)
        torch.manual_seed(seed)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        t_start = time.perf_counter()
        for b0 in range(0, len(order), self.B):
            rows = order[b0: b0 + self.B]
            batch = [prompts[i] for i in rows]
            n_real = len(batch)
            batch = batch + [batch[0]] * (self.B - n_real)            # static batch: fill with copies
            W = max(len(p) for p in batch)
            ids = torch.tensor([[pad_token_id] * (W - len(p)) + list(p) for p in batch], device=self.device)
            self.pad.copy_(torch.tensor([W - len(p) for p in batch], device=self.device))
            t0 = time.perf_counter()
            logits = self._prefill(ids, self.pad)
            first = self._sample_host(logits, temperature, top_p, gen)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            stats.prefill_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            toks = torch.empty(self.B, max_new_tokens, dtype=torch.long, device=self.device)
            toks[:, 0] = first
            done = torch.isin(first, eos_t)
            done[n_real:] = True
            self.tok.copy_(first)
            n = 1
            while n < max_new_tokens:
                self.slot.fill_(W + n - 1)
                self._run_step(mode, W + n - 1)
                nxt = self.out_tok if mode != "logits" else self._sample_host(self.out_logits, temperature, top_p, gen)
                toks[:, n] = nxt
                done |= torch.isin(nxt, eos_t)
                self.tok.copy_(nxt)
                n += 1
                if n % self.check_every == 0 and bool(done.all()):
                    break
            host = toks[:n_real, :n].tolist()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            stats.decode_s += dt
            stats.steps += n - 1
            stats.batches += 1
            n_tok = 0
            for r, row in zip(rows, host):
                cut = next((j for j, t in enumerate(row) if t in eos), None)
                row = row if cut is None else row[: cut + 1]
                out[r] = row
                n_tok += len(row)
            stats.output_tokens += n_tok
            stats.per_batch.append({"rows": n_real, "width": W, "steps": n, "tokens": n_tok, "decode_s": round(dt, 3)})
            if progress is not None:
                progress(n_real)
        stats.rows = len(prompts)
        stats.capture_s = self._capture_s
        stats.wall_s = time.perf_counter() - t_start
        return out, stats

