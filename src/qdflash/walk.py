"""Acceptance by teacher forcing: the tau of greedy speculative decoding without running the verifier.

Under greedy verification the speculative decoder emits exactly the target's greedy continuation (lossless), so the
outcome of every verify step is fixed by that continuation: a step anchored at position q (the last emitted token)
accepts the longest prefix of the drafter's block equal to the continuation at q+1.., and the next step is anchored
at the target's own token after it. Given the plain greedy decode of a prompt, one target forward over prompt +
continuation gives every context feature the drafter would see; the walk replays the decoder's steps with the
drafter's real calls (the same module, ``DraftCache`` and window as ``speculative.generate``) and a lookup in place
of each verify forward. Accept lengths count the bonus/correction token and are recorded before EOS or the length
limit truncate the emitted tokens, as in the decoder, so the continuation is extended B tokens past the plain
output (past EOS too).

What it measures and what it does not: tau, per-position rates and the drafter's time per step. No verify forward
runs, so a walked run has no tokens/s or speedup (``GenResult.walk``; ``speculative.run_stats``). Greedy only.

Exactness: the walk's features come from one forward over the whole sequence, the decoder's from block-by-block
verify forwards with a KV cache. They agree to rounding, so a drafter argmax at a near-tie can flip; stages that walk
also decode their headline drafter and record the agreement of the two (``walk_check``).
"""
from __future__ import annotations

import time

import torch

from .drafter import DraftCache, draft_tokens, resolve_window, target_features


class Walker:
    """Greedy continuations and target features of ``prompts`` (computed once per prompt, on first use), shared by
    every drafter walked on this target. ``plain``: the plain decoder's results on the same prompts."""

    def __init__(self, target, prompts: list[list[int]], plain: list, eos_token_id: int | None):
        if len(plain) != len(prompts):
            raise ValueError(f"walk: {len(plain)} plain results for {len(prompts)} prompts")
        self.target, self.prompts, self.plain, self.eos = target, prompts, plain, eos_token_id
        self.dev = next(target.parameters()).device
        self._ctx: dict[int, tuple[list[int], int, dict]] = {}

    @torch.no_grad()
    def context(self, i: int, extra: int, layer_ids) -> tuple[list[int], torch.Tensor]:
        """(prompt + plain tokens + at least ``extra`` greedy tokens after them, the target's features at
        ``layer_ids`` over prompt + plain tokens). Kept per prompt: the tokens and the features of each layer set
        asked for (every drafter of a grid reads the same layers: one target forward per prompt)."""
        layer_ids = tuple(layer_ids)
        got = self._ctx.get(i)
        if got is not None and got[1] >= extra and layer_ids in got[2]:
            return got[0], got[2][layer_ids]
        from transformers import DynamicCache
        seq = list(self.prompts[i]) + list(self.plain[i].tokens)
        cache = DynamicCache(config=self.target.config)
        out = self.target(input_ids=torch.tensor([seq], device=self.dev), past_key_values=cache, use_cache=True,
                          output_hidden_states=True, logits_to_keep=1)
        feats = {**(got[2] if got is not None else {}), layer_ids: target_features(out.hidden_states, layer_ids)}
        for _ in range(extra):                  # continue greedily, EOS or not: a block may be checked past it
            x = int(out.logits[0, -1].argmax())
            seq.append(x)
            out = self.target(input_ids=torch.tensor([[x]], device=self.dev), past_key_values=cache, use_cache=True,
                              logits_to_keep=1)
        self._ctx[i] = (seq, extra, feats)
        return seq, feats[layer_ids]

    @torch.no_grad()
    def walk(self, drafter, max_new_tokens: int, window: int | None = None, progress: bool = False,
             desc: str = "walk") -> list:
        """One ``GenResult`` per prompt (``walk=True``): the accept lengths the greedy speculative decoder would
        record with ``drafter`` (window as in ``generate``: None = the checkpoint's, 0 = none) and the drafter time."""
        from tqdm.auto import tqdm

        from .decode_stats import GenResult
        from .decode_steps import sync
        B = drafter.block_size
        window = resolve_window(drafter, window)
        embed = self.target.get_input_embeddings()
        lm_head = self.target.get_output_embeddings()
        out = []
        for i in tqdm(range(len(self.prompts)), desc=desc, disable=not progress):
            tokens = list(self.plain[i].tokens)
            if not tokens or (tokens[-1] != self.eos and len(tokens) != max_new_tokens):
                raise ValueError(f"walk: plain output {i} has {len(tokens)} tokens and does not end in EOS: it was "
                                 f"not decoded with max_new_tokens={max_new_tokens} and this EOS id")
            seq, feats = self.context(i, B, drafter.target_layer_ids)
            start = len(self.prompts[i])
            res = GenResult(tokens=tokens, block_size=B, walk=True)
            ctx, ctx_pos = feats[:, :start], torch.arange(start, device=self.dev)[None]
            dcache, emitted, x = DraftCache(), 1, seq[start]
            done = emitted >= max_new_tokens or x == self.eos
            while not done:
                t0 = time.perf_counter()
                noise = embed(torch.tensor([[x] + [drafter.mask_token_id] * (B - 1)], device=self.dev))
                q_pos = torch.arange(start, start + B, device=self.dev)[None]
                h = drafter(noise, ctx, q_pos, ctx_pos, dcache, window=window)
                draft = draft_tokens(drafter, lm_head, h[:, 1:])[0].tolist()
                sync(self.dev)
                res.draft_time_s += time.perf_counter() - t0
                acc = 0
                while acc < B - 1 and draft[acc] == seq[start + 1 + acc]:
                    acc += 1
                res.accept_lengths.append(acc + 1)
                ctx = feats[:, start: start + acc + 1]
                ctx_pos = torch.arange(start, start + acc + 1, device=self.dev)[None]
                for t in seq[start + 1: start + acc + 2]:      # the accepted drafts and the target's token
                    emitted += 1
                    if t == self.eos or emitted >= max_new_tokens:
                        done = True
                        break
                start += acc + 1
                x = seq[start]
            out.append(res)
        return out


def agreement(walked: list, decoded: list) -> dict:
    """How a walk compares with the decoder on the same prompts: prompts with identical accept lengths, and both
    taus (pooled over steps)."""
    tau = (lambda rs: sum(sum(r.accept_lengths) for r in rs) / max(1, sum(len(r.accept_lengths) for r in rs)))  # noqa: E731
    return {"prompts": len(walked), "prompts_identical": sum(a.accept_lengths == b.accept_lengths
                                                              for a, b in zip(walked, decoded)),
            "tau_walk": tau(walked), "tau_decoded": tau(decoded)}
