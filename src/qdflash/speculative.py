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
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from .config import DECODERS
from .drafter import DFlashDraftModel, DraftCache, draft_tokens, resolve_window, target_features


@dataclass
class GenResult:
    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)    # per verify step, bonus counted
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    block_size: int = 1
    walk: bool = False              # accept lengths from ``walk.Walker`` (no verify forward ran: no verify time)

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


def _recurrent(layer_or_class) -> bool:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    cls = layer_or_class if isinstance(layer_or_class, type) else type(layer_or_class)
    return issubclass(cls, LinearAttentionCacheLayerMixin)


def snapshot_recurrent(cache) -> list | None:
    """Copies of the conv and recurrent states of every linear-attention layer of ``cache``; None when it has none
    (a plain-attention cache, which ``crop`` rolls back)."""
    snap = [(i, {k: None if v is None else v.clone() for k, v in layer.conv_states.items()},
             {k: None if v is None else v.clone() for k, v in layer.recurrent_states.items()},
             dict(layer.has_previous_state)) for i, layer in enumerate(cache.layers) if _recurrent(layer)]
    return snap or None


def rollback_block(cache, snapshot: list, n_block: int) -> None:
    """Undo the last forward of ``n_block`` tokens: crop them from every attention layer's KV and put the
    linear-attention states back to ``snapshot`` (taken just before that forward)."""
    from transformers.cache_utils import CacheLayerMixin
    for i, conv, rec, prev in snapshot:
        layer = cache.layers[i]
        for states, saved in ((layer.conv_states, conv), (layer.recurrent_states, rec)):
            for k, v in saved.items():
                if v is not None and states[k] is not None and states[k].shape == v.shape:
                    states[k].copy_(v)          # in place: transformers keeps these tensors at a static address
                else:
                    states[k] = None if v is None else v.clone()
        layer.has_previous_state.update(prev)
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin):
            continue
        # a layer holding both kinds crops only its attention part (the first non-recurrent crop in its MRO)
        crop = next(c.crop for c in type(layer).__mro__
                    if "crop" in c.__dict__ and issubclass(c, CacheLayerMixin) and not _recurrent(c))
        crop(layer, -n_block)


def accept_drafts(block: list[int], post: list[int]) -> tuple[int, list[int]]:
    """Verification of one block (shared by this decoder and ``fast_decode``). ``block`` = [anchor, drafts...];
    ``post[i]`` is the target's token (argmax or sample) after ``block[: i + 1]``. Returns the number of accepted
    drafts (the longest prefix of drafts equal to the target's tokens) and the tokens this step emits: the accepted
    drafts plus the target's token at the first mismatch (correction) or after the block (bonus)."""
    acc = 0
    while acc < len(block) - 1 and block[acc + 1] == post[acc]:
        acc += 1
    return acc, block[1: acc + 1] + [post[acc]]


def emit_tokens(tokens: list[int], new: list[int], eos_token_id: int | None, max_new_tokens: int) -> bool:
    """Append ``new`` to ``tokens``, stopping at EOS or at ``max_new_tokens``; True when decoding is over."""
    for t in new:
        tokens.append(t)
        if t == eos_token_id or len(tokens) >= max_new_tokens:
            return True
    return False


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
            block += draft_tokens(drafter, lm_head, h[:, 1:])[0].tolist()
            _sync(dev)
            res.draft_time_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        pos = torch.arange(start, start + B, device=dev)[None]
        snap = snapshot_recurrent(tcache) if B > 1 else None
        out = target(input_ids=torch.tensor([block], device=dev), position_ids=pos, past_key_values=tcache,
                     use_cache=True, output_hidden_states=drafter is not None)
        post = _sample(out.logits[0], temperature, gen).tolist()
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
        _sync(dev)
        res.verify_time_s += time.perf_counter() - t0
        res.accept_lengths.append(acc + 1)
        start += acc + 1
        x = post[acc]
        if emit_tokens(res.tokens, new, eos_token_id, max_new_tokens):
            break
    return res


BOOTSTRAP_RESAMPLES = 2000      # percentile bootstrap over prompts (the unit of independence), 95% intervals
BOOTSTRAP_SEED = 0


def _per_prompt(results: list[GenResult], B: int):
    """Per prompt: sum of acceptance lengths [P], verify steps [P], steps accepting draft position i [P, B-1]."""
    import numpy as np
    s = np.array([sum(r.accept_lengths) for r in results], dtype=np.float64)
    n = np.array([len(r.accept_lengths) for r in results], dtype=np.float64)
    c = np.array([[sum(1 for a in r.accept_lengths if a - 1 > i) for i in range(B - 1)] for r in results],
                 dtype=np.float64).reshape(len(results), B - 1)
    return s, n, c


def _resample_counts(n_prompts: int, resamples: int, seed: int):
    """[R, P] multiplicities of each prompt in R bootstrap resamples of the P prompts (with replacement)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_prompts, size=(resamples, n_prompts))
    w = np.zeros((resamples, n_prompts))
    np.add.at(w, (np.arange(resamples)[:, None], idx), 1.0)
    return w


def _ci95(x) -> list[float]:
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return [float("nan"), float("nan")]
    lo, hi = np.percentile(x, [2.5, 97.5])
    return [float(lo), float(hi)]


def acceptance_stats(results: list[GenResult], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> dict:
    """tau (mean acceptance length, bonus counted, pooled over all verify steps), per-position acceptance rates r_i
    (fraction of steps whose draft position i was accepted; sum r_i = tau - 1), the per-request mean tau, and their
    uncertainty over *prompts*: a seeded percentile bootstrap that resamples whole prompts (steps within a prompt
    are correlated, so resampling steps would understate it). ``tau_ci95``, ``per_position_ci95`` and
    ``accept_rate_ci95`` are 95% intervals of the same pooled ratios; ``tau_stderr`` is the bootstrap standard
    deviation of tau (over prompts, not over steps)."""
    import numpy as np
    lens = [a for r in results for a in r.accept_lengths]
    boot = {"unit": "prompt", "resamples": resamples, "seed": seed, "level": 0.95}
    if not lens:
        return {"tau": float("nan"), "tau_ci95": [float("nan")] * 2, "per_position": [], "per_position_ci95": [],
                "steps": 0, "prompts": len(results), "bootstrap": boot}
    B = results[0].block_size
    if any(r.block_size != B for r in results):
        raise ValueError(f"acceptance_stats: results mix block sizes {sorted({r.block_size for r in results})}")
    n = len(lens)
    per_pos = [sum(1 for a in lens if a - 1 > i) / n for i in range(B - 1)]
    per_req = [sum(r.accept_lengths) / len(r.accept_lengths) for r in results if r.accept_lengths]
    tau = sum(lens) / n
    s, k, c = _per_prompt(results, B)
    w = _resample_counts(len(results), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        steps_r = w @ k
        tau_r = (w @ s) / steps_r                                   # [R]
        pos_r = (w @ c) / steps_r[:, None]                          # [R, B-1]
    acc_r = (tau_r - 1) / max(1, B - 1)
    finite = tau_r[np.isfinite(tau_r)]
    return {"tau": tau, "tau_ci95": _ci95(tau_r),
            "tau_stderr": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
            "tau_per_request_mean": sum(per_req) / len(per_req),
            "per_position": per_pos, "per_position_ci95": [_ci95(pos_r[:, i]) for i in range(B - 1)],
            "accept_rate": (tau - 1) / max(1, B - 1), "accept_rate_ci95": _ci95(acc_r), "steps": n,
            "prompts": len(results), "histogram": [sum(1 for a in lens if a == j) for j in range(1, B + 1)],
            "bootstrap": boot}


def paired_bootstrap(a_results: list[GenResult], b_results: list[GenResult], resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> dict:
    """tau(a) - tau(b) for two decoders run on the same prompts in the same order, with a 95% interval from a paired
    bootstrap: each resample draws prompts with replacement and recomputes both pooled taus on the same draw, so
    prompt difficulty cancels. ``frac_a_above_b``: the fraction of resamples where tau(a) > tau(b)."""
    import numpy as np
    if len(a_results) != len(b_results) or not a_results:
        raise ValueError(f"paired_bootstrap needs results on the same non-empty prompt list "
                         f"(got {len(a_results)} and {len(b_results)})")
    sa, ka, _ = _per_prompt(a_results, 1)
    sb, kb, _ = _per_prompt(b_results, 1)
    if not ka.sum() or not kb.sum():
        raise ValueError("paired_bootstrap: a decoder has no verify steps")
    w = _resample_counts(len(a_results), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = (w @ sa) / (w @ ka) - (w @ sb) / (w @ kb)
    d = d[np.isfinite(d)]
    ta, tb = float(sa.sum() / ka.sum()), float(sb.sum() / kb.sum())
    return {"tau_a": ta, "tau_b": tb, "diff": ta - tb, "diff_ci95": _ci95(d),
            "frac_a_above_b": float((d > 0).mean()) if d.size else float("nan"), "prompts": len(a_results),
            "bootstrap": {"unit": "prompt", "paired": True, "resamples": resamples, "seed": seed, "level": 0.95}}


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


def run_decoding(target, prompts: list[list[int]], max_new_tokens: int, drafter=None, temperature: float = 0.0,
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


def run_stats(results: list[GenResult], speculative: bool) -> dict:
    """Acceptance (speculative runs), decode tokens, times, tokens/s and drafter share of one decoding run. A walked
    run (``walk.Walker``) ran no verifier: it has the drafter's time per step, and no tokens/s, share or speedup."""
    n_tok = sum(len(r.tokens) - 1 for r in results)  # decode tokens (the prefill token excluded)
    stats = acceptance_stats(results) if speculative else {"tau": 1.0, "steps": sum(
        len(r.accept_lengths) for r in results)}
    draft = sum(r.draft_time_s for r in results)
    stats.update({"decode_tokens": n_tok, "draft_time_s": draft,
                  "drafter_ms_per_step": 1e3 * draft / max(1, stats["steps"]) if speculative else 0.0})
    if results and all(r.walk for r in results):
        stats.update({"measured_by": "walk", "decode_time_s": None, "tokens_per_s": None, "verify_time_s": None,
                      "drafter_share": None})
        return stats
    dec = sum(r.decode_time_s for r in results)
    stats.update({"measured_by": "decoder", "decode_time_s": dec, "tokens_per_s": n_tok / max(dec, 1e-9),
                  "verify_time_s": sum(r.verify_time_s for r in results)})
    stats["drafter_share"] = draft / max(dec, 1e-9)
    return stats


def _speedup_ci95(plain: list[GenResult], spec: list[GenResult], resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> list[float]:
    """95% paired bootstrap interval over prompts of (decode tokens / decode time) spec over plain."""
    import numpy as np
    tok = lambda rs: np.array([len(r.tokens) - 1 for r in rs], dtype=np.float64)   # noqa: E731
    sec = lambda rs: np.array([r.decode_time_s for r in rs], dtype=np.float64)     # noqa: E731
    w = _resample_counts(len(plain), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = ((w @ tok(spec)) / (w @ sec(spec))) / ((w @ tok(plain)) / (w @ sec(plain)))
    return _ci95(ratio)


def results_to_json(results: list[GenResult]) -> list[dict]:
    return [dataclasses.asdict(r) for r in results]


def results_from_json(rows: list[dict]) -> list[GenResult]:
    return [GenResult(**r) for r in rows]


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
            rs, st = run_decoding(target, prompts, max_new_tokens, d, temperature, eos_token_id, win, seed,
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
                    st["speedup_ci95"] = _speedup_ci95(plain, res)
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
