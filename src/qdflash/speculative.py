"""Lossless reference speculative decoder (batch 1) and its metrics.

Each step: the drafter fills ``[x_start, MASK x (B-1)]`` greedily in one forward; the target verifies the block in
one forward and *samples* its own token at every position (argmax at temperature 0); the longest prefix where the
draft equals the target's token is accepted, plus the target's token at the first mismatch (correction) or after
the block (bonus). Every emitted token is therefore a target sample given the emitted prefix: lossless at any
temperature. Acceptance length per step = accepted drafts + 1 (the bonus/correction counted), in [1, B].
Plain decoding runs through the same loop with no drafter (B = 1).

Rolling back the rejected positions: attention layers crop their KV (``DynamicCache.crop``). A hybrid target
(Qwen3.5: Gated DeltaNet layers with a conv state and a recurrent state that has absorbed every verified token)
cannot be cropped, so its linear-attention states are snapshotted before verification; on a rejection the block's
KV is cropped, the snapshot restored and the accepted tokens re-run (``rollback_block``). A fully accepted block
needs neither.
"""
from __future__ import annotations

import copy
import time

import torch

from .config import DECODERS
from .decode_stats import GenResult, paired_bootstrap, run_stats, speedup_ci95
from .decode_steps import accept_drafts, emit_tokens, rollback_block, sample_tokens, snapshot_recurrent, sync
from .drafter import DFlashDraftModel, DraftCache, draft_tokens, resolve_window, target_features


@torch.no_grad()
def generate(target, prompt_ids: list[int], max_new_tokens: int, drafter: DFlashDraftModel | None = None,
             temperature: float = 0.0, eos_token_id: int | None = None, window: int | None = None,
             seed: int = 0) -> GenResult:
    from transformers import DynamicCache
    dev = next(target.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
    B = drafter.block_size if drafter is not None else 1
    layer_ids = drafter.target_layer_ids if drafter is not None else []
    window = resolve_window(drafter, window) if drafter is not None else None
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    res = GenResult(tokens=[], block_size=B)

    sync(dev)
    t0 = time.perf_counter()
    ids = torch.tensor([prompt_ids], device=dev)
    tcache = DynamicCache(config=target.config)
    out = target(input_ids=ids, past_key_values=tcache, use_cache=True, output_hidden_states=drafter is not None,
                 logits_to_keep=1)
    x = int(sample_tokens(out.logits[0, -1:], temperature, gen)[0])
    start = len(prompt_ids)
    ctx = target_features(out.hidden_states, layer_ids) if drafter is not None else None
    ctx_pos = torch.arange(start, device=dev)[None]
    dcache = DraftCache()
    sync(dev)
    res.prefill_time_s = time.perf_counter() - t0
    res.tokens.append(x)

    while len(res.tokens) < max_new_tokens and x != eos_token_id:
        block = [x]
        if drafter is not None:
            t0 = time.perf_counter()
            noise = embed(torch.tensor([[x] + [drafter.mask_token_id] * (B - 1)], device=dev))
            q_pos = torch.arange(start, start + B, device=dev)[None]
            h = drafter(noise, ctx, q_pos, ctx_pos, dcache, window=window)
            block += draft_tokens(drafter, lm_head, h[:, 1:])[0].tolist()
            sync(dev)
            res.draft_time_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        pos = torch.arange(start, start + B, device=dev)[None]
        snap = snapshot_recurrent(tcache) if B > 1 else None
        out = target(input_ids=torch.tensor([block], device=dev), position_ids=pos, past_key_values=tcache,
                     use_cache=True, output_hidden_states=drafter is not None)
        post = sample_tokens(out.logits[0], temperature, gen).tolist()
        acc, new = accept_drafts(block, post)
        if B - acc - 1 > 0 and snap is None:
            tcache.crop(-(B - acc - 1))   # drop the rejected positions' KV
        elif B - acc - 1 > 0:             # recurrent layers: back to the pre-block state, then the accepted tokens
            rollback_block(tcache, snap, B)
            target.base_model(input_ids=torch.tensor([block[: acc + 1]], device=dev),   # no lm_head: states only
                              position_ids=pos[:, : acc + 1], past_key_values=tcache, use_cache=True)
        if drafter is not None:
            ctx = target_features(out.hidden_states, layer_ids)[:, : acc + 1]
            ctx_pos = torch.arange(start, start + acc + 1, device=dev)[None]
        sync(dev)
        res.verify_time_s += time.perf_counter() - t0
        res.accept_lengths.append(acc + 1)
        start += acc + 1
        x = post[acc]
        if emit_tokens(res.tokens, new, eos_token_id, max_new_tokens):
            break
    return res


def _drafter_shape(drafter) -> tuple:
    """What a FastDecoder's buffers and graphs depend on: drafters equal here can share one (weights copied in)."""
    if drafter is None:
        return (None,)
    return (type(drafter).__name__, drafter.block_size, tuple(drafter.target_layer_ids), drafter.mask_token_id,
            tuple((n, tuple(t.shape), t.dtype, str(t.device)) for n, t in drafter.state_dict().items()))


def decoder_for(target, prompts: list[list[int]], max_new_tokens: int, drafter=None, window: int | None = None,
                decoder: str = "eager", pool: dict | None = None):
    """``(generate_fn(prompt, max_new_tokens, temperature, eos, seed) -> GenResult, name of the decoder used, close)``.

    ``eager``: ``generate`` (DynamicCache; any target). ``fast``: ``fast_decode.FastDecoder`` (static caches, fixed
    shapes, the same acceptance code; token-identical to eager in fp32), one per run, reused over the prompts.
    ``graphs``: the fast path under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), warmed up on the first
    prompt before any timed call. A target the fast path cannot roll back (hybrid Qwen3.5: recurrent states) falls
    back to ``eager``, and the name returned says so.

    ``pool`` (a dict the caller keeps, then closes with ``close_pool``): runs on the same target with drafters of the
    same shape and window share one FastDecoder, which holds its own copy of the drafter and gets each run's weights
    copied into it in place, so compiled graphs are built once per shape, not once per drafter."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, not {decoder!r}")
    window = resolve_window(drafter, window) if drafter is not None else None
    window = 0 if window is None else window       # resolved: 0 = no window (None would mean "the checkpoint's")
    eager = (lambda p, n, t, eos, s: generate(target, p, n, drafter, t, eos, window, s))   # noqa: E731
    if decoder == "eager" or not prompts:
        return eager, "eager", lambda: None
    from .fast_decode import FastDecoder, check_plain_attention
    try:
        check_plain_attention(target)
    except ValueError:
        return eager, "eager (recurrent target)", lambda: None
    B = drafter.block_size if drafter is not None else 1
    max_len = max(len(p) for p in prompts) + max_new_tokens + B
    key = (id(target), _drafter_shape(drafter), window, max_len, decoder)
    fd = pool.get(key) if pool is not None else None
    if fd is None:
        own = copy.deepcopy(drafter) if (pool is not None and drafter is not None) else drafter
        # fullgraph: a graph break (e.g. a compressed-tensors Linear, whose forward dynamo cannot trace) must fail
        # here, not fall back to recompiling every layer until dynamo's limit and decoding slower than eager
        fd = FastDecoder(target, own, max_len=max_len, window=window, compile=decoder == "graphs",
                         fullgraph=decoder == "graphs")
        if decoder == "graphs":     # compile, cudagraph warm-up and record: outside every timed call
            for _ in range(3):
                fd.generate(prompts[0], min(max_new_tokens, 16 + B))
        if pool is None:
            return fd.generate, decoder, fd.close
        pool[key] = fd
    elif drafter is not None:
        with torch.no_grad():
            for mine, theirs in zip(fd.drafter.state_dict().values(), drafter.state_dict().values()):
                mine.copy_(theirs)
    return fd.generate, decoder, lambda: None


def close_pool(pool: dict) -> None:
    for fd in pool.values():
        fd.close()
    pool.clear()


def decode_prompts(target, prompts: list[list[int]], max_new_tokens: int, drafter=None, temperature: float = 0.0,
                 eos_token_id: int | None = None, window: int | None = None, seed: int = 0,
                 progress: bool = False, desc: str = "decode", decoder: str = "eager",
                 pool: dict | None = None) -> tuple[list[GenResult], dict]:
    from tqdm.auto import tqdm
    gen, used, close = decoder_for(target, prompts, max_new_tokens, drafter, window, decoder, pool)
    try:
        results = [gen(p, max_new_tokens, temperature, eos_token_id, seed + i)
                   for i, p in enumerate(tqdm(prompts, desc=desc, disable=not progress))]
    finally:
        close()
    stats = run_stats(results, drafter is not None)
    stats["decoder"] = used
    return results, stats


def compare_with_plain(target, prompts, max_new_tokens, drafters: dict, temperature=0.0, eos_token_id=None,
                       window=None, seed=0, progress=False, reuse: dict | None = None,
                       results: dict | None = None, decoder: str = "eager", on_result=None,
                       walk: tuple | list | set = (), walkers: dict | None = None) -> dict:
    """Plain decoding then each drafter on the same prompts: tau (with its bootstrap interval over prompts),
    per-position rates, tokens/s, speedup (with a paired bootstrap interval over prompts), the paired tau difference
    to every other drafter (``paired_tau_diff``), and (greedy) the number of outputs that differ from plain decoding
    (must be 0). ``decoder``: see ``decoder_for`` (each run's stats name the decoder it used).

    ``walk``: drafters whose acceptance is measured by teacher forcing along the plain greedy outputs
    (``walk.Walker``: tau and per-position rates without the verifier; greedy only) instead of decoding. When any
    drafter walks, every decoded drafter is walked too and its stats get ``walk_check`` (prompts whose accept
    lengths agree, both taus): the walk's exactness, measured in every run (not for rows reused from an earlier
    stage, which checked them). ``walkers``: a dict the caller keeps to share one ``Walker`` (its target forwards)
    between calls on the same target and plain results (e.g. stage 04's passes with and without a window).

    ``reuse`` maps "plain" and/or drafter names to results already decoded on exactly these prompts with these
    settings (e.g. by an earlier stage): they are not decoded again, and their stats say ``"reused": true``.
    ``results``, if given, receives every run's per-prompt results (for a later stage to reuse). ``on_result(name,
    results, stats)`` is called as soon as each run that was not reused has decoded (to save it: a resumable grid)."""
    reuse = reuse or {}
    walk = set(walk)
    if walk and temperature > 0:
        raise ValueError("walk: teacher-forced acceptance is exact for greedy decoding only (temperature 0)")
    if walk - set(drafters):
        raise ValueError(f"walk: no drafter named {sorted(walk - set(drafters))}")
    walker = None

    def decode(name, d, win):
        if name in reuse:
            rs = reuse[name]
            st = run_stats(rs, d is not None)
            st["reused"] = True
            return rs, st
        if name in walk:
            rs = walker.walk(d, max_new_tokens, win, progress, f"walk {name}")
            st = run_stats(rs, True)
        else:
            rs, st = decode_prompts(target, prompts, max_new_tokens, d, temperature, eos_token_id, win, seed,
                                  progress, name, decoder, pool)
        if on_result is not None:
            on_result(name, rs, st)
        return rs, st
    pool: dict = {}         # one fast decoder per drafter shape: graphs compiled once, weights copied per run
    try:
        plain, pstats = decode("plain", None, None)
        out = {"plain": pstats}
        runs = {}
        if results is not None:
            results["plain"] = plain
        if walk:
            from .walk import Walker, agreement
            walker = (walkers or {}).get("walker")
            if walker is None or walker.target is not target or walker.plain is not plain:
                walker = Walker(target, prompts, plain, eos_token_id)
            if walkers is not None:
                walkers["walker"] = walker
        for name, d in drafters.items():
            res, st = decode(name, d, window)
            if results is not None:
                results[name] = res
            if st["measured_by"] == "decoder":
                st["speedup"] = st["tokens_per_s"] / max(pstats["tokens_per_s"] or 0.0, 1e-9)
                if prompts:
                    st["speedup_ci95"] = speedup_ci95(plain, res)
                if temperature <= 0:
                    st["mismatched_outputs"] = sum(a.tokens != b.tokens for a, b in zip(plain, res))
                if walker is not None and not st.get("reused"):
                    st["walk_check"] = agreement(walker.walk(d, max_new_tokens, window, progress,
                                                             f"walk check {name}"), res)
            out[name] = st
            runs[name] = res
        for name, res in runs.items():
            if not out[name]["steps"]:
                continue
            keep = ("diff", "diff_ci95", "frac_a_above_b")
            out[name]["paired_tau_diff"] = {
                other: {k: v for k, v in paired_bootstrap(res, ores).items() if k in keep}
                for other, ores in runs.items() if other != name and out[other]["steps"]}
        return out
    finally:
        close_pool(pool)
