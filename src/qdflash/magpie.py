"""Self-prompted data (Magpie, Xu et al. 2024, arXiv 2406.08464): the aligned target writes user queries itself.

Give the model only its chat template up to where the user's words begin (the *pre-query template*) and sample: it
continues with a query of the kind it was tuned on (SmolLM2-Instruct's SFT mix, smol-smoltalk, is largely Magpie
data). The template is read off the tokenizer's own chat template (rendered around a sentinel user message), never
written per model. A query is finished when the model emits the token that the template puts after a user message
(``<|im_end|>`` for ChatML); unfinished ones (the token cap hit first) are dropped, then the usual prompt filter
(16-1200 characters, English) and exact duplicates, then near-duplicates by MinHash LSH over character 5-gram shingles
(``datasketch``): a query whose estimated Jaccard similarity to a kept one reaches ``threshold`` is dropped.

Deterministic for a seed on one device and batch size (``batch_generate`` sampling, seeded per round).
"""
from __future__ import annotations

import re
import time

SENTINEL = "\u2063QDFLASH_USER_QUERY\u2063"


def pre_query_template(tok) -> tuple[str, str]:
    """(text before the user's words, text right after them) in the tokenizer's chat template, with whatever
    system prompt the template adds by default."""
    text = tok.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                   add_generation_prompt=False)
    if SENTINEL not in text:
        raise ValueError("the tokenizer's chat template does not place the user message verbatim")
    before, after = text.split(SENTINEL, 1)
    if not after:
        raise ValueError("the chat template puts nothing after a user message: no end-of-query token to stop on")
    return before, after


def end_of_query_ids(tok, after: str) -> list[int]:
    """The token(s) that end a query: the first token of what the template writes after a user message, and EOS."""
    ids = tok(after, add_special_tokens=False)["input_ids"]
    out = {ids[0]} if ids else set()
    if tok.eos_token_id is not None:
        out.add(int(tok.eos_token_id))
    return sorted(out)


def _shingles(text: str, n: int = 5) -> set[str]:
    """Character ``n``-grams of the lower-cased text with runs of non-word characters folded to one space."""
    t = " ".join(re.findall(r"\w+", text.lower()))
    return {t[i: i + n] for i in range(max(1, len(t) - n + 1))}


class NearDuplicateFilter:
    """Texts offered in order; ``add`` keeps a text (and returns True) unless its MinHash-estimated Jaccard similarity
    to a text kept before reaches ``threshold`` (character 5-grams; datasketch ``MinHashLSH``). The index grows with
    every kept text, so texts offered later (another sampling round) are checked against all kept so far."""

    def __init__(self, threshold: float = 0.7, num_perm: int = 128):
        try:
            from datasketch import MinHash, MinHashLSH
        except ImportError as e:
            raise RuntimeError("near-duplicate removal needs the PyPI package datasketch (pip install datasketch)") from e
        self._minhash, self.num_perm = MinHash, num_perm
        self.lsh, self.kept = MinHashLSH(threshold=threshold, num_perm=num_perm), 0

    def add(self, text: str) -> bool:
        m = self._minhash(num_perm=self.num_perm)
        m.update_batch([s.encode("utf-8") for s in _shingles(text)])
        if self.lsh.query(m):
            return False
        self.lsh.insert(str(self.kept), m)
        self.kept += 1
        return True


def drop_near_duplicates(texts: list[str], threshold: float = 0.7, num_perm: int = 128) -> tuple[list[str], int]:
    """``texts`` in order without those whose MinHash-estimated Jaccard similarity to an earlier kept
    text reaches ``threshold`` (``NearDuplicateFilter``). Returns (kept, number dropped)."""
    f = NearDuplicateFilter(threshold, num_perm)
    kept = [t for t in texts if f.add(t)]
    return kept, len(texts) - len(kept)


def magpie_prompts(target: str, n: int, seed: int = 0, dtype: str = "float32", max_new_tokens: int = 64,
                   temperature: float = 1.0, top_p: float = 0.99, batch_size: int | None = None,
                   threshold: float = 0.7, max_rounds: int = 8, model=None, tok=None,
                   progress: bool = True) -> tuple[list[str], dict]:
    """Up to ``n`` distinct queries written by ``target`` (a preset name or model directory) from its pre-query
    template; sampled in rounds until ``n`` survive the filters or ``max_rounds`` rounds ran. Returns (queries,
    what was measured)."""
    from tqdm.auto import tqdm

    from .batch_generate import BatchGenerator
    from .models import load_model, load_tokenizer
    from .prompt_filter import keep_prompt
    t0 = time.time()
    tok = tok or load_tokenizer(target)
    model = model or load_model(target, dtype)
    before, after = pre_query_template(tok)
    prefix = tok(before, add_special_tokens=False)["input_ids"]
    stops = end_of_query_ids(tok, after)
    on_gpu = next(model.parameters()).device.type == "cuda"
    bs = batch_size or (2048 if on_gpu else 64)
    gen = BatchGenerator(model, batch_size=bs, max_len=len(prefix) + max_new_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    kept: list[str] = []
    seen: set[str] = set()
    near = NearDuplicateFilter(threshold)
    counts = {"samples": 0, "unfinished": 0, "filtered": 0, "near_duplicates": 0, "rounds": 0}
    bar = tqdm(total=n, desc="magpie", disable=not progress)
    while len(kept) < n and counts["rounds"] < max_rounds:
        want = max(bs, int((n - len(kept)) * 1.5))
        want = -(-want // bs) * bs
        rows, _ = gen.generate([prefix] * want, max_new_tokens, stops, pad_token_id=pad, temperature=temperature,
                               top_p=top_p, seed=seed * 1000 + counts["rounds"], sort_by_length=False)
        counts["rounds"] += 1
        counts["samples"] += want
        for r in rows:
            if not r or r[-1] not in stops:
                counts["unfinished"] += 1
                continue
            text = tok.decode(r[:-1], skip_special_tokens=True).strip()
            if not keep_prompt(text, seen):
                counts["filtered"] += 1
            elif not near.add(text):
                counts["near_duplicates"] += 1
            elif len(kept) < n:                 # the round's survivors past n are counted, not kept
                kept.append(text)
        bar.update(len(kept) - bar.n)
    bar.close()
    meta = {"generator": "magpie", "target": str(target), "pre_query_template": before, "stop_ids": stops,
            "seed": seed, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
            "batch_size": bs, "near_duplicate_threshold": threshold, **counts, "candidate_prompts": len(kept),
            "seconds": round(time.time() - t0, 2)}
    return kept, meta
