"""The reference speculative decoder and its metrics: known-answer statistics on hand-made results, exact partial
acceptance against plain greedy decoding, and losslessness of speculative *sampling* (a seeded two-sample test)."""
import math

import pytest
import torch

from qdflash.data import prompt_ids
from qdflash.decode_stats import GenResult, acceptance_stats, paired_bootstrap
from qdflash.speculative import generate


pytestmark = pytest.mark.usefixtures("one_thread")


def _res(lens, B=4):
    return GenResult(tokens=[0] * (1 + sum(lens)), accept_lengths=list(lens), block_size=B)


# ----------------------------------------------------------------------------------------------- statistics
def test_acceptance_stats_known_values():
    st = acceptance_stats([_res([1, 2]), _res([4, 3, 1, 2])])
    # steps 1,2,4,3,1,2: tau pooled over steps (bonus counted), per-request mean (1.5 + 2.5) / 2
    assert st["tau"] == pytest.approx(13 / 6) and st["steps"] == 6 and st["prompts"] == 2
    assert st["tau_per_request_mean"] == pytest.approx(2.0)
    assert st["per_position"] == pytest.approx([4 / 6, 2 / 6, 1 / 6])
    assert st["histogram"] == [2, 2, 1, 1]
    assert st["accept_rate"] == pytest.approx((13 / 6 - 1) / 3)
    # two prompts: a resample is {A,A} (tau 1.5), {A,B} (13/6) or {B,B} (2.5), the extremes each with
    # probability 1/4 > 2.5%, so the 95% percentile interval is exactly [tau(A alone), tau(B alone)]
    assert st["tau_ci95"] == pytest.approx([1.5, 2.5])
    assert st["per_position_ci95"][0] == pytest.approx([0.5, 0.75])     # r0: A 1/2, B 3/4
    assert st["per_position_ci95"][2] == pytest.approx([0.0, 0.25])
    assert st["accept_rate_ci95"] == pytest.approx([0.5 / 3, 1.5 / 3])
    assert st["bootstrap"] == {"unit": "prompt", "resamples": 2000, "seed": 0, "level": 0.95}


def test_interval_is_over_prompts_not_steps():
    """One prompt with very different steps: nothing to resample (a step-level bootstrap would give a wide
    interval); many prompts: a nonzero interval that contains tau, reproducible under the same seed."""
    one = acceptance_stats([_res([1, 4, 1, 4, 2, 3, 1, 4])])
    assert one["tau_ci95"] == [one["tau"], one["tau"]] and one["tau_stderr"] == 0.0
    g = torch.Generator().manual_seed(1)
    many = [_res((torch.randint(1, 5, (int(n),), generator=g)).tolist()) for n in torch.randint(2, 9, (30,),
                                                                                                  generator=g)]
    a, b = acceptance_stats(many, seed=3), acceptance_stats(many, seed=3)
    lo, hi = a["tau_ci95"]
    assert lo < a["tau"] < hi and a["tau_ci95"] == b["tau_ci95"] and a["tau_stderr"] > 0
    assert acceptance_stats(many, seed=1)["tau_ci95"] != a["tau_ci95"]
    assert acceptance_stats(many)["bootstrap"]["seed"] == 0                  # the documented default


def test_acceptance_stats_edge_cases():
    assert math.isnan(acceptance_stats([_res([])])["tau"])
    with pytest.raises(ValueError, match="block sizes"):
        acceptance_stats([_res([1, 2], B=4), _res([1], B=8)])


def test_paired_bootstrap_cancels_prompt_difficulty():
    """b accepts exactly one token less than a at every step: the paired difference is 1 in every resample,
    although the prompts' own taus spread widely (their unpaired intervals overlap)."""
    a = [_res([4, 4, 3]), _res([2, 2, 2, 2]), _res([4, 3, 4, 4, 4]), _res([2, 3])]
    b = [_res([x - 1 for x in r.accept_lengths]) for r in a]
    d = paired_bootstrap(a, b)
    assert d["diff"] == pytest.approx(1.0) and d["diff_ci95"] == pytest.approx([1.0, 1.0])
    assert d["frac_a_above_b"] == 1.0 and d["prompts"] == 4
    ca, cb = acceptance_stats(a)["tau_ci95"], acceptance_stats(b)["tau_ci95"]
    assert ca[0] < cb[1]                                   # unpaired, the two intervals overlap
    rev = paired_bootstrap(b, a)
    assert rev["diff_ci95"] == pytest.approx([-1.0, -1.0]) and rev["frac_a_above_b"] == 0.0
    with pytest.raises(ValueError, match="same non-empty prompt list"):
        paired_bootstrap(a, b[:3])


# ----------------------------------------------------------------------------------------------- decoding
class OracleDrafter(torch.nn.Module):
    """Test double with the drafter interface. At each step it proposes the target's own greedy continuation of the
    emitted prefix for the first ``k`` draft positions (``k`` cycles through ``schedule``; default: all) and the
    target's *least* likely token after that (the negated hidden state flips the argmax to the argmin), so exactly
    ``k`` drafts are accepted under greedy verification."""

    def __init__(self, target, prompt, block, mask_id, schedule=None, memo=None):
        super().__init__()
        self.t, self.hist, self.block_size, self.mask_token_id = target, list(prompt), block, mask_id
        self.target_layer_ids, self.schedule, self.prev, self.calls = [0], schedule, None, 0
        self.memo = {} if memo is None else memo

    def greedy(self, prefix: tuple):
        if prefix not in self.memo:
            seq, hs = list(prefix), []
            for _ in range(self.block_size - 1):
                h = self.t.model(torch.tensor([seq])).last_hidden_state[:, -1]
                hs.append(h)
                seq.append(int(self.t.lm_head(h)[0].argmax()))
            self.memo[prefix] = (hs, seq[len(prefix):])
        return self.memo[prefix]

    def forward(self, noise, ctx, q_pos, ctx_pos, cache=None, window=None):
        emb = self.t.get_input_embeddings().weight
        x = int((emb - noise[0, 0]).abs().sum(-1).argmin())       # the anchor token, from its embedding
        start = int(q_pos[0, 0])                                    # = prompt + tokens emitted before the anchor
        if self.prev is not None:
            self.hist += self.prev[: start - len(self.hist)]        # the accepted part of the previous block
        assert len(self.hist) == start, (len(self.hist), start)
        k = self.block_size - 1 if self.schedule is None else self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        hs, drafts = self.greedy(tuple(self.hist + [x]))
        self.prev = [x] + drafts
        out = [h if j < k else -h for j, h in enumerate(hs)]
        return torch.stack([out[0]] + out, 1)


def _expected_lengths(schedule, B, n_tokens):
    out, emitted, i = [], 1, 0                                  # the first token comes from the prefill
    while emitted < n_tokens:
        out.append(min(schedule[i % len(schedule)], B - 1) + 1)
        emitted += out[-1]
        i += 1
    return out


@pytest.mark.parametrize("B,schedule", [(5, [0, 3, 1, 4, 2]), (4, [2]), (6, [5, 0, 0, 4])])
def test_partial_acceptance_against_plain_greedy(tiny_target, one_thread, B, schedule):
    """Drafts right for k positions then wrong: the output is token-identical to plain greedy decoding and to
    transformers' generate, and every step accepts exactly k drafts (acceptance length k + 1, bonus counted)."""
    target, tok = tiny_target
    N = 30
    for text in ("tell me about the moon", "write a song about cats and dogs"):
        p = prompt_ids(tok, text)
        plain = generate(target, p, N, None).tokens
        ref = target.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False, eos_token_id=None,
                              pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        spec = generate(target, p, N, OracleDrafter(target, p, B, tok.mask_token_id, schedule))
        assert plain == ref and spec.tokens == plain
        assert spec.accept_lengths == _expected_lengths(schedule, B, N)
        st = acceptance_stats([spec])
        assert st["per_position"][0] == pytest.approx(sum(1 for a in spec.accept_lengths if a > 1) / len(
            spec.accept_lengths))


def _homogeneity_pvalue(a: list, b: list, min_count: int = 10) -> float:
    """Chi-square two-sample (homogeneity) test of two categorical samples; categories with fewer than
    ``min_count`` pooled observations are merged into one."""
    from collections import Counter

    from scipy.stats import chi2_contingency
    ca, cb = Counter(a), Counter(b)
    keep = [c for c in set(ca) | set(cb) if ca[c] + cb[c] >= min_count]
    rest_a, rest_b = len(a) - sum(ca[c] for c in keep), len(b) - sum(cb[c] for c in keep)
    table = [[ca[c] for c in keep], [cb[c] for c in keep]]
    if rest_a + rest_b:
        table[0].append(rest_a)
        table[1].append(rest_b)
    if len(table[0]) < 2:
        return 1.0
    return float(chi2_contingency(table, correction=False).pvalue)


def test_speculative_sampling_is_lossless(tiny_target, one_thread):
    """Temperature 0.15 on the tiny target, a drafter proposing the target's greedy continuation (so drafts are often
    accepted and the accept path is exercised). The marginal distribution of emitted tokens 1, 2 and 3 (token 0
    comes from the prefill, shared by construction) under speculative sampling must equal plain sampling: a
    chi-square two-sample test per position at alpha = 1e-3 / 3 (Bonferroni), i.e. a false-alarm rate of at most
    0.1% for a correct decoder. Seeds are fixed, so the outcome is deterministic. The same test must reject a lossy
    decoder that emits the drafts unverified."""
    target, tok = tiny_target
    T, N, B, alpha = 0.15, 150, 4, 1e-3
    p = prompt_ids(tok, "tell me about the moon")
    memo = {}
    plain = [generate(target, p, 4, None, temperature=T, seed=s).tokens for s in range(N)]
    spec = [generate(target, p, 4, OracleDrafter(target, p, B, tok.mask_token_id, memo=memo), temperature=T,
                     seed=100_000 + s) for s in range(N)]
    accepted = sum(r.accept_lengths[0] > 1 for r in spec) / N
    assert 0.5 < accepted < 0.98, accepted                    # both the accept and the correction paths run
    pv = [_homogeneity_pvalue([t[j] for t in plain], [r.tokens[j] for r in spec]) for j in (1, 2, 3)]
    assert min(pv) > alpha / 3, pv
    # power: unverified drafts (the drafter's greedy continuation of the sampled token 0) are flagged
    lossy = [[r.tokens[0]] + OracleDrafter(target, p, B, tok.mask_token_id, memo=memo).greedy(
        tuple(p + r.tokens[:1]))[1] for r in spec]
    assert min(_homogeneity_pvalue([t[j] for t in plain], [t[j] for t in lossy]) for j in (1, 2, 3)) < alpha / 3
