"""Statistics of decoding runs: a run's per-prompt result (``GenResult``), tau and per-position acceptance with
seeded percentile-bootstrap intervals over prompts (the unit of independence), paired differences, speedup
intervals, and the JSON form the stages save. numpy only: report code reads saved runs without torch models."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


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



BOOTSTRAP_RESAMPLES = 2000      # percentile bootstrap over prompts (the unit of independence), 95% intervals
BOOTSTRAP_SEED = 0


def per_prompt_sums(results: list[GenResult], B: int):
    """Per prompt: sum of acceptance lengths [P], verify steps [P], steps accepting draft position i [P, B-1]."""
    import numpy as np
    s = np.array([sum(r.accept_lengths) for r in results], dtype=np.float64)
    n = np.array([len(r.accept_lengths) for r in results], dtype=np.float64)
    c = np.array([[sum(1 for a in r.accept_lengths if a - 1 > i) for i in range(B - 1)] for r in results],
                 dtype=np.float64).reshape(len(results), B - 1)
    return s, n, c


def resample_counts(n_prompts: int, resamples: int, seed: int):
    """[R, P] multiplicities of each prompt in R bootstrap resamples of the P prompts (with replacement)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_prompts, size=(resamples, n_prompts))
    w = np.zeros((resamples, n_prompts))
    np.add.at(w, (np.arange(resamples)[:, None], idx), 1.0)
    return w


def ci95(x) -> list[float]:
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
    s, k, c = per_prompt_sums(results, B)
    w = resample_counts(len(results), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        steps_r = w @ k
        tau_r = (w @ s) / steps_r                                   # [R]
        pos_r = (w @ c) / steps_r[:, None]                          # [R, B-1]
    acc_r = (tau_r - 1) / max(1, B - 1)
    finite = tau_r[np.isfinite(tau_r)]
    return {"tau": tau, "tau_ci95": ci95(tau_r),
            "tau_stderr": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
            "tau_per_request_mean": sum(per_req) / len(per_req),
            "per_position": per_pos, "per_position_ci95": [ci95(pos_r[:, i]) for i in range(B - 1)],
            "accept_rate": (tau - 1) / max(1, B - 1), "accept_rate_ci95": ci95(acc_r), "steps": n,
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
    sa, ka, _ = per_prompt_sums(a_results, 1)
    sb, kb, _ = per_prompt_sums(b_results, 1)
    if not ka.sum() or not kb.sum():
        raise ValueError("paired_bootstrap: a decoder has no verify steps")
    w = resample_counts(len(a_results), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = (w @ sa) / (w @ ka) - (w @ sb) / (w @ kb)
    d = d[np.isfinite(d)]
    ta, tb = float(sa.sum() / ka.sum()), float(sb.sum() / kb.sum())
    return {"tau_a": ta, "tau_b": tb, "diff": ta - tb, "diff_ci95": ci95(d),
            "frac_a_above_b": float((d > 0).mean()) if d.size else float("nan"), "prompts": len(a_results),
            "bootstrap": {"unit": "prompt", "paired": True, "resamples": resamples, "seed": seed, "level": 0.95}}


def paired_per_position(a_results: list[GenResult], b_results: list[GenResult], resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> dict:
    """Per draft position i, r_i(a) - r_i(b) (the pooled fraction of verify steps that accepted position i, as
    ``acceptance_stats`` gives it) for two drafters run on the same prompts in the same order, each with a 95% interval
    from a paired bootstrap over prompts (both sides recomputed on the same draw, like ``paired_bootstrap``)."""
    import numpy as np
    if len(a_results) != len(b_results) or not a_results:
        raise ValueError(f"paired_per_position needs results on the same non-empty prompt list "
                         f"(got {len(a_results)} and {len(b_results)})")
    B = a_results[0].block_size
    if any(r.block_size != B for r in a_results + b_results):
        raise ValueError("paired_per_position: the two sides must share one block size")
    _, ka, ca = per_prompt_sums(a_results, B)
    _, kb, cb = per_prompt_sums(b_results, B)
    if not ka.sum() or not kb.sum():
        raise ValueError("paired_per_position: a drafter has no verify steps")
    w = resample_counts(len(a_results), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = (w @ ca) / (w @ ka)[:, None] - (w @ cb) / (w @ kb)[:, None]           # [R, B-1]
    ra, rb = ca.sum(0) / ka.sum(), cb.sum(0) / kb.sum()
    return {"a": ra.tolist(), "b": rb.tolist(), "diff": (ra - rb).tolist(),
            "diff_ci95": [ci95(d[:, i]) for i in range(B - 1)], "prompts": len(a_results),
            "bootstrap": {"unit": "prompt", "paired": True, "resamples": resamples, "seed": seed, "level": 0.95}}


def seeds_and_items_bootstrap(num_a, den_a, num_b, den_b, resamples: int = BOOTSTRAP_RESAMPLES,
                              seed: int = BOOTSTRAP_SEED, ratio: bool = False) -> dict:
    """A comparison of A with B run with S training seeds on the same N items (prompts, conversations): per seed,
    the pooled statistic sum(num) / sum(den) of each side, and their difference (or, ``ratio``, A / B). Arrays are
    [S, N]. The estimate is the mean over seeds; its 95% interval comes from a two-level bootstrap that resamples the
    seeds, then the items (one item resample for all seeds: every seed ran on the same items, so the pairing holds
    across seeds as well as between A and B). ``per_seed`` gives each seed's own value."""
    import numpy as np
    arrs = [np.asarray(x, dtype=np.float64) for x in (num_a, den_a, num_b, den_b)]
    S, N = arrs[0].shape
    if any(a.shape != (S, N) for a in arrs) or S < 1 or N < 1:
        raise ValueError(f"seeds_and_items_bootstrap: arrays must share one [seeds, items] shape, got "
                         f"{[a.shape for a in arrs]}")

    a, b = arrs[0].sum(1) / arrs[1].sum(1), arrs[2].sum(1) / arrs[3].sum(1)
    per_seed = (a / b) if ratio else (a - b)
    w = resample_counts(N, resamples, seed)                         # [R, N] item multiplicities
    seeds = np.random.default_rng(seed).integers(0, S, size=(resamples, S))
    with np.errstate(invalid="ignore", divide="ignore"):
        sums = [np.einsum("rn,sn->rs", w, x) for x in arrs]         # [R, S]: each seed's sums in each item resample
        ra, rb = sums[0] / sums[1], sums[2] / sums[3]
        per_resample = ra / rb if ratio else ra - rb
    boot = np.take_along_axis(per_resample, seeds, 1).mean(1)       # seeds resampled too
    items_only = per_resample.mean(1)                               # every seed once
    return {"estimate": float(per_seed.mean()), "ci95": ci95(boot), "ci95_items_only": ci95(items_only),
            "per_seed": per_seed.tolist(), "seed_sd": float(per_seed.std(ddof=1)) if S > 1 else 0.0,
            "side_a": a.tolist(), "side_b": b.tolist(), "seeds": S, "items": N, "statistic": "ratio" if ratio else
            "difference", "bootstrap": {"resamples": resamples, "seed": seed, "levels": "seeds, then items"}}


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


def speedup_ci95(plain: list[GenResult], spec: list[GenResult], resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> list[float]:
    """95% paired bootstrap interval over prompts of (decode tokens / decode time) spec over plain."""
    import numpy as np
    tok = lambda rs: np.array([len(r.tokens) - 1 for r in rs], dtype=np.float64)   # noqa: E731
    sec = lambda rs: np.array([r.decode_time_s for r in rs], dtype=np.float64)     # noqa: E731
    w = resample_counts(len(plain), resamples, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = ((w @ tok(spec)) / (w @ sec(spec))) / ((w @ tok(plain)) / (w @ sec(plain)))
    return ci95(ratio)


def results_to_json(results: list[GenResult]) -> list[dict]:
    return [dataclasses.asdict(r) for r in results]


def results_from_json(rows: list[dict]) -> list[GenResult]:
    return [GenResult(**r) for r in rows]


def ci_text(st: dict, key: str = "tau_ci95") -> str:
    """A saved interval ``st[key]`` as "lo–hi" (3 decimals), or "" where the stats have none."""
    ci = st.get(key)
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if isinstance(ci, list) and len(ci) == 2 else ""


def mismatch_causes(model, prompts: list[list[int]], plain: list[list[int]], spec: list[list[int]]) -> list[dict]:
    """Why a speculative output differs from plain greedy (bf16 on vLLM, or the reference decoder in bf16): for each differing output, the first
    differing position, both tokens, and the target's top-2 logit margin there recomputed by ``model`` (the target
    loaded by transformers, e.g. ``models.load_model(path, "float32", "cpu")``) on the common prefix. A margin far
    below bf16's resolution of the logits (~0.06 at |logit| ~ 16) is a near-tie that a different kernel shape (a
    B-token verify vs a 1-token step) can flip; a large margin would be a bug."""
    import torch
    rows = [(i, next((j for j, (a, b) in enumerate(zip(p, s)) if a != b), min(len(p), len(s))))
            for i, (p, s) in enumerate(zip(plain, spec)) if p != s]
    out = []
    with torch.no_grad():
        for i, j in rows:
            ids = torch.tensor([prompts[i] + plain[i][:j]])
            logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
            top = torch.topk(logits, 2)
            a = plain[i][j] if j < len(plain[i]) else None
            b = spec[i][j] if j < len(spec[i]) else None
            out.append({"prompt": i, "position": j, "plain_token": a, "spec_token": b,
                        "margin": float(top.values[0] - top.values[1]), "reference_token": int(top.indices[0]),
                        "reference_agrees_with": "plain" if a == int(top.indices[0]) else
                        "speculative" if b == int(top.indices[0]) else "neither"})
    return out
