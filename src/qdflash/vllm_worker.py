"""Runs inside the vLLM virtual environment (``.venv-vllm``): one offline ``LLM`` job per call.

``python -m qdflash.vllm_worker JOB.json OUT.json``; JOB = {target, drafter|null, num_speculative_tokens,
prompts (token ids), max_tokens, dtype, max_model_len}. Writes the generated token ids, wall time and vLLM's
spec-decode counters. Imports only vLLM and the standard library (not the rest of qdflash).
"""
from __future__ import annotations

import json
import os
import sys
import time


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    spec = None
    if job.get("drafter"):
        spec = {"method": "dflash", "model": job["drafter"], "num_speculative_tokens": job["num_speculative_tokens"]}
    t0 = time.time()
    llm = LLM(model=job["target"], dtype=job.get("dtype", "float32"), max_model_len=job.get("max_model_len", 1024),
              max_num_seqs=job.get("max_num_seqs", 1), enforce_eager=True, seed=0, disable_log_stats=False,
              speculative_config=spec)
    init_s = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=False)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))            # warm-up
    before = _counters(llm)
    t0 = time.time()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    gen_s = time.time() - t0
    after = _counters(llm)
    c = {k: _sub(after.get(k), before.get(k)) for k in after}
    toks = [list(o.outputs[0].token_ids) for o in outs]
    res = {"init_s": init_s, "generate_s": gen_s, "tokens": toks, "output_tokens": sum(len(t) for t in toks),
           "output_tokens_per_s": sum(len(t) for t in toks) / gen_s, "counters": c}
    drafts = c.get("vllm:spec_decode_num_drafts") or 0
    if spec and drafts:
        acc = c.get("vllm:spec_decode_num_accepted_tokens") or 0
        res["tau"] = 1 + acc / drafts
        res["per_position"] = [x / drafts for x in (c.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [])]
    return res


def _sub(a, b):
    if isinstance(a, list):
        return [x - (y or 0) for x, y in zip(a, b or [0] * len(a))]
    return (a or 0) - (b or 0)


def _counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    try:
        res = run(job)
    except Exception as e:  # report the real vLLM error (e.g. no CPU kernel for W8A16) instead of crashing
        import traceback
        res = {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    tmp = sys.argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
