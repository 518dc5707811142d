"""Lossless reference speculative decoder (batch 1) and its metrics.

Each step: the drafter fills ``[x_start, MASK x (B-1)]`` greedily in one forward; the target verifies the block in
one forward and *samples* its own token at every position (argmax at temperature 0); the longest prefix where the
draft equals the target's token is accepted, plus the target's token at the first mismatch (correction) or after
the block (bonus). Every emitted token is therefore a target sample given the emitted prefix: lossless at any
temperature. Acceptance length per step = accepted drafts + 1 (the bonus/correction counted), in [1, B].
Plain decoding runs through the same loop with no drafter (B = 1).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .drafter import DFlashDraftModel, DraftCache, target_features


@dataclass
class GenResult:
    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)    # per verify step, bonus counted
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    block_size: int = 1

    @property
    def decode_time_s(self) -> float:
        return self.draft_time_s + self.verify_time_s


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _sample(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """logits [n, V] -> tokens [n]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def generate(target, prompt_ids: list[int], max_new_tokens: int, drafter: DFlashDraftModel | None = None,
             temperature: float = 0.0, eos_token_id: int | None = None, window: int | None = None,
             seed: int = 0) -> GenResult:
    from transformers import DynamicCache
    dev = next(target.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
    B = drafter.block_size if drafter is not None else 1
    layer_ids = drafter.target_layer_ids if drafter is not None else []
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    res = GenResult(tokens=[], block_size=B)

    _sync(dev)
    t0 = time.perf_counter()
    ids = torch.tensor([prompt_ids], device=dev)
    tcache = DynamicCache(config=target.config)
    out = target(input_ids=ids, past_key_values=tcache, use_cache=True, output_hidden_states=drafter is not None,
                 logits_to_keep=1)
    x = int(_sample(out.logits[0, -1:], temperature, gen)[0])
    start = len(prompt_ids)
    ctx = target_features(out.hidden_states, layer_ids) if drafter is not None else None
    ctx_pos = torch.arange(start, device=dev)[None]
    dcache = DraftCache()
    _sync(dev)
    res.prefill_time_s = time.perf_counter() - t0
    res.tokens.append(x)

    while len(res.tokens) < max_new_tokens and x != eos_token_id:
        block = [x]
        if drafter is not None:
            t0 = time.perf_counter()
            noise = embed(torch.tensor([[x] + [drafter.mask_token_id] * (B - 1)], device=dev))
            q_pos = torch.arange(start, start + B, device=dev)[None]
            h = drafter(noise, ctx, q_pos, ctx_pos, dcache, window=window)
            block += lm_head(h[:, 1:]).argmax(-1)[0].tolist()
            _sync(dev)
            res.draft_time_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        pos = torch.arange(start, start + B, device=dev)[None]
        out = target(input_ids=torch.tensor([block], device=dev), position_ids=pos, past_key_values=tcache,
                     use_cache=True, output_hidden_states=drafter is not None)
        post = _sample(out.logits[0], temperature, gen).tolist()
        acc = 0
        while acc < B - 1 and block[acc + 1] == post[acc]:
            acc += 1
        if B - acc - 1 > 0:
            tcache.crop(-(B - acc - 1))   # drop the rejected positions' KV
        if drafter is not None:
            ctx = target_features(out.hidden_states, layer_ids)[:, : acc + 1]
            ctx_pos = torch.arange(start, start + acc + 1, device=dev)[None]
        _sync(dev)
        res.verify_time_s += time.perf_counter() - t0
        res.accept_lengths.append(acc + 1)
        new = block[1: acc + 1] + [post[acc]]
        start += acc + 1
        x = post[acc]
        for t in new:
            res.tokens.append(t)
            if t == eos_token_id or len(res.tokens) >= max_new_tokens:
                x = eos_token_id if t == eos_token_id else x
                break
    return res


def acceptance_stats(results: list[GenResult]) -> dict:
    """tau (mean acceptance length, bonus counted, pooled over steps), per-position acceptance rates r_i
    (fraction of steps whose draft position i was accepted; sum r_i = tau - 1), and the per-request mean tau."""
    lens = [a for r in results for a in r.accept_lengths]
    if not lens:
        return {"tau": float("nan"), "per_position": [], "steps": 0}
    B = results[0].block_size
    n = len(lens)
    per_pos = [sum(1 for a in lens if a - 1 > i) / n for i in range(B - 1)]
    per_req = [sum(r.accept_lengths) / len(r.accept_lengths) for r in results if r.accept_lengths]
    tau = sum(lens) / n
    # standard error of tau over steps: a guide to sampling noise when comparing drafters
    var = sum((a - tau) ** 2 for a in lens) / max(1, n - 1)
    return {"tau": tau, "tau_stderr": (var / n) ** 0.5, "tau_per_request_mean": sum(per_req) / len(per_req),
            "per_position": per_pos, "accept_rate": (tau - 1) / max(1, B - 1), "steps": n,
            "histogram": [sum(1 for a in lens if a == k) for k in range(1, B + 1)]}


def run_decoding(target, prompts: list[list[int]], max_new_tokens: int, drafter=None, temperature: float = 0.0,
                 eos_token_id: int | None = None, window: int | None = None, seed: int = 0,
                 progress: bool = False, desc: str = "decode") -> tuple[list[GenResult], dict]:
    from tqdm.auto import tqdm
    results = [generate(target, p, max_new_tokens, drafter, temperature, eos_token_id, window, seed + i)
               for i, p in enumerate(tqdm(prompts, desc=desc, disable=not progress))]
    n_tok = sum(len(r.tokens) - 1 for r in results)  # decode tokens (the prefill token excluded)
    dec = sum(r.decode_time_s for r in results)
    stats = acceptance_stats(results) if drafter is not None else {"tau": 1.0, "steps": sum(
        len(r.accept_lengths) for r in results)}
    stats.update({"decode_tokens": n_tok, "decode_time_s": dec, "tokens_per_s": n_tok / max(dec, 1e-9),
                  "draft_time_s": sum(r.draft_time_s for r in results),
                  "verify_time_s": sum(r.verify_time_s for r in results)})
    stats["drafter_share"] = stats["draft_time_s"] / max(dec, 1e-9)
    return results, stats


def compare_with_plain(target, prompts, max_new_tokens, drafters: dict, temperature=0.0, eos_token_id=None,
                       window=None, seed=0, progress=False) -> dict:
    """Plain decoding then each drafter on the same prompts: tau, per-position, tokens/s, speedup, and (greedy)
    the number of outputs that differ from plain decoding (must be 0)."""
    plain, pstats = run_decoding(target, prompts, max_new_tokens, None, temperature, eos_token_id, None, seed,
                                 progress, "plain")
    out = {"plain": pstats}
    for name, d in drafters.items():
        res, st = run_decoding(target, prompts, max_new_tokens, d, temperature, eos_token_id, window, seed,
                               progress, name)
        st["speedup"] = st["tokens_per_s"] / max(pstats["tokens_per_s"], 1e-9)
        if temperature <= 0:
            st["mismatched_outputs"] = sum(a.tokens != b.tokens for a, b in zip(plain, res))
        out[name] = st
    return out
