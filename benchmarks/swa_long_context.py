"""The drafter's sliding window at long context (issue 35 item 3): tau and drafter time with and without the window.

Prompts: real multi-turn ShareGPT conversations (the ShareGPT answers as assistant turns) through the chat template up
to a later human turn, the longest such prefix of each conversation whose length lies in [--min-tokens,
--max-tokens]; a conversation whose first human turn is a training prompt of ``--data`` is skipped. The target
answers greedily (eager, fp32); every drafter is walked along that answer (``walk.Walker``: the decoder's tau without
a decode per drafter) with no window and with ``--window`` W, so the rows are paired over the same prompts. A drafter
trained with the window (``qdflash run 02_drafter_pretrain --set train_window=W``) is served with it.

Drafter time: the walk's drafter seconds per verify step on these prompts, and a micro-benchmark of one drafter step
(the drafter forward over a block + its draft head) with a drafter cache holding a context of each length, with and
without the window, interleaved, median and quartiles of --reps repetitions on this machine.

    python benchmarks/swa_long_context.py --data RUNS/00_data --drafter full=RUNS/02_drafter_pretrain/<name> \
        --drafter swa64=RUNS_W/02_drafter_pretrain/<name> --window 64 --prompts 24 --new 64 \
        --out benchmarks/cpu-swa-long/swa-long.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def chat_ids(tok, msgs: list[dict]) -> list[int]:
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):     # transformers 5 may still hand back an encoding
        ids = ids["input_ids"]
    return list(ids)


def long_prompts(tok, n: int, lo: int, hi: int, skip: set[tuple[int, ...]]) -> list[list[int]]:
    from qdflash.data import sharegpt_conversations
    convs, _, _ = sharegpt_conversations()
    out = []
    for c in convs:
        turns = [t for t in (c.get("conversations") or []) if t.get("from") in ("human", "gpt") and t.get("value")]
        if len(turns) < 3 or turns[0]["from"] != "human":
            continue
        msgs = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]
        first = tuple(chat_ids(tok, msgs[:1]))
        if first in skip:
            continue
        best = None
        for k in range(3, len(msgs) + 1, 2):               # prefixes ending in a user turn: 3, 5, ... messages
            if msgs[k - 1]["role"] != "user":
                break
            ids = chat_ids(tok, msgs[:k])
            if len(ids) > hi:
                break
            if len(ids) >= lo:
                best = ids
        if best is not None:
            out.append(list(best))
            if len(out) == n:
                break
    return out


def step_times(drafter, lm_head, embed, lengths, windows, reps, dim, seed=0, device="cpu") -> dict:
    """Median and quartiles (ms) of one drafter step with a cache of each context length, per window (0 = none)."""
    from qdflash.drafter import DraftCache, draft_tokens
    g = torch.Generator().manual_seed(seed)
    B = drafter.block_size
    caches = {}
    with torch.no_grad():
        for c in lengths:
            ctx = torch.randn(1, c, dim, generator=g).to(device)
            for w in windows:
                cache = DraftCache()
                noise = embed(torch.tensor([[1] + [drafter.mask_token_id] * (B - 1)], device=device))
                drafter(noise, ctx, torch.arange(c, c + B, device=device)[None], torch.arange(c, device=device)[None],
                        cache, window=w or None)
                caches[(c, w)] = cache
        times = {k: [] for k in caches}
        new = torch.randn(1, 2, dim, generator=g).to(device)
        from qdflash.decode_steps import sync
        for _ in range(reps):                              # interleaved: every (length, window) once per round
            for (c, w), cache in caches.items():
                cc = DraftCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values])
                noise = embed(torch.tensor([[1] + [drafter.mask_token_id] * (B - 1)], device=device))
                sync(noise.device)
                t0 = time.perf_counter()
                h = drafter(noise, new, torch.arange(c + 2, c + 2 + B, device=device)[None],
                            torch.arange(c, c + 2, device=device)[None], cc, window=w or None)
                draft_tokens(drafter, lm_head, h[:, 1:])
                sync(noise.device)
                times[(c, w)].append(1e3 * (time.perf_counter() - t0))
    out = {}
    for (c, w), ts in times.items():
        q = statistics.quantiles(ts, n=4)
        out.setdefault(str(c), {})["none" if not w else f"W={w}"] = {"median_ms": statistics.median(ts),
                                                                   "q1_ms": q[0], "q3_ms": q[2], "reps": len(ts)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a stage-00 run: its training prompts are not used")
    ap.add_argument("--drafter", required=True, action="append", help="NAME=PATH (repeatable)")
    ap.add_argument("--target", default="smol")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--min-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tqdm.auto import tqdm

    from qdflash.data import load_split
    from qdflash.decode_stats import acceptance_stats, paired_bootstrap, results_to_json
    from qdflash.drafter import load_drafter
    from qdflash.models import load_model, load_tokenizer, resolve_target
    from qdflash.runio import provenance, write_json
    from qdflash.speculative import generate
    from qdflash.walk import Walker
    t0 = time.time()
    tok = load_tokenizer(args.target)
    target = load_model(resolve_target(args.target), "float32")
    skip = {tuple(r["input_ids"][: r["prompt_len"]]) for r in load_split(args.data, "train")}
    prompts = long_prompts(tok, args.prompts, args.min_tokens, args.max_tokens, skip)
    plain = [generate(target, p, args.new, None, eos_token_id=tok.eos_token_id)
             for p in tqdm(prompts, desc="plain")]
    walker = Walker(target, prompts, plain, tok.eos_token_id)
    drafters = {}
    for d in args.drafter:
        name, _, path = d.partition("=")
        drafters[name] = load_drafter(path, torch.float32).to(target.device).eval()
    runs, rows = {}, {}
    for name, dr in drafters.items():
        for w in (0, args.window):
            key = f"{name} @ {'no window' if not w else f'W={w}'}"
            runs[key] = walker.walk(dr, args.new, w, progress=True, desc=key)
            st = acceptance_stats(runs[key])
            per_step = [1e3 * r.draft_time_s / len(r.accept_lengths) for r in runs[key] if r.accept_lengths]
            rows[key] = {"tau": st["tau"], "tau_ci95": st["tau_ci95"], "per_position": st["per_position"][:4],
                         "trained_window": (dr.config.dflash_config or {}).get("swa_window_size"),
                         "drafter_ms_per_step_median": statistics.median(per_step)}
    keys = list(runs)
    paired = {f"{a} - {b}": {k: v for k, v in paired_bootstrap(runs[a], runs[b]).items() if k in ("diff", "diff_ci95")}
              for i, a in enumerate(keys) for b in keys[i + 1:]}
    first = next(iter(drafters.values()))
    lengths = [int(x) for x in args.lengths.split(",")]
    micro = step_times(first, target.get_output_embeddings(), target.get_input_embeddings(), lengths,
                       (0, args.window), args.reps, first.config.hidden_size * len(first.target_layer_ids),
                       device=target.device)
    lens = [len(p) for p in prompts]
    out = {"command": "python benchmarks/swa_long_context.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "provenance": provenance(),
        "prompts": len(prompts), "prompt_tokens": {"min": min(lens), "median": statistics.median(lens),
                                                    "max": max(lens)},
        "new_tokens": args.new, "window": args.window, "rows": rows, "paired": paired, "step_ms": micro,
        "results": {k: results_to_json(v) for k, v in runs.items()}, "wall_s": round(time.time() - t0, 1)}
    write_json(args.out, out)
    for k, v in rows.items():
        print(k, json.dumps({a: (round(b, 3) if isinstance(b, float) else b) for a, b in v.items()}))
    for k, v in paired.items():
        print(k, round(v["diff"], 3), [round(x, 3) for x in v["diff_ci95"]])
    for c, v in micro.items():
        print(c, {w: round(x["median_ms"], 2) for w, x in v.items()})


if __name__ == "__main__":
    main()
