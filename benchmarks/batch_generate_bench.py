"""Regeneration throughput of stage 00 on one GPU: the static-cache batched generator (``qdflash.batch_generate``,
stage 00's ``backend="fast"``) against transformers' ``generate`` (``backend="hf"``), on the same real prompts, greedy,
with the roofline of a decode step next to the measured figure and a greedy-token comparison on a sample.

    python benchmarks/batch_generate_bench.py --out OUT.json [--prompts N] [--batch 1024,2048,4096] [--hf-prompts N]
    python benchmarks/batch_generate_bench.py --synthetic --out OUT.json --batch 2048 --key-buckets 64,416 --reps 3

``--synthetic``: a randomly initialised model of SmolLM2-135M's shape and random prompts of 30-94 tokens, no EOS
(every row runs max_new tokens): the fast path's speed alone (no transformers comparison), for each key bucket
(``BatchGenerator.key_bucket``; 416 = every slot read every step), repetitions interleaved, medians; with
``--profile-step 2048:256`` also where a decode step's kernel time goes (``step_profile``: attention, matmuls,
argmax, copies) at that batch and context.

Prompts: the real pools of a prompt dump (``QDFLASH_PROMPTS_DUMP``, as stage 00 reads it) or synthetic text.
Roofline per decode step at batch B and mean context L: bytes = weights + K/V read (2 x layers x kv_heads x head_dim x
L x B x 2 bytes) over the measured copy bandwidth; FLOPs = 2 x params x B (+ attention) over the bf16 peak measured by
a large matmul. Records the commit, the GPU and library versions.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import torch


def _prompts(tok, n: int) -> list[list[int]]:
    from qdflash.data import prompt_ids
    dump = os.environ.get("QDFLASH_PROMPTS_DUMP")
    texts = []
    if dump:
        raw = Path(dump).read_bytes()
        d = json.loads(gzip.decompress(raw) if dump.endswith(".gz") else raw)
        pools = d["pools"]
        i = 0
        while len(texts) < n and any(i < len(v) for v in pools.values()):
            texts += [v[i] for v in pools.values() if i < len(v)]
            i += 1
    while len(texts) < n:
        texts.append(f"Tell me a story about the number {len(texts)} and a small red fox.")
    ids = [prompt_ids(tok, t) for t in texts[: n * 2]]
    return [x for x in ids if len(x) <= 192][:n]


def _peak(dev) -> dict:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    flops = 10 * 2 * 8192 ** 3 / (time.perf_counter() - t)
    x = torch.empty(2 * 1024 ** 3, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 10 * 2 * x.numel() / (time.perf_counter() - t)          # bytes read + written
    del a, x, y
    return {"bf16_matmul_tflops": round(flops / 1e12, 1), "copy_gbps": round(bw / 1e9, 1)}


def _roofline(model, B: int, ctx: float, peak: dict) -> dict:
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    params = sum(p.numel() for p in model.parameters())
    w_bytes = params * 2
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * hd * ctx * B * 2
    flops = 2 * params * B + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * hd * ctx * B
    t_bw = (w_bytes + kv_bytes) / (peak["copy_gbps"] * 1e9)
    t_fl = flops / (peak["bf16_matmul_tflops"] * 1e12)
    return {"batch": B, "mean_context": round(ctx, 1), "bytes_per_step_gb": round((w_bytes + kv_bytes) / 1e9, 3),
            "bandwidth_floor_ms": round(t_bw * 1e3, 3), "compute_floor_ms": round(t_fl * 1e3, 3),
            "floor_tok_per_s": round(B / max(t_bw, t_fl), 0)}


def _hf(model, tok, prompts, max_new, batch) -> tuple[list[list[int]], float]:
    from qdflash.config import DataConfig, load_config
    from qdflash.data import generate_batch
    cfg = load_config(DataConfig, "smol", max_new_tokens=max_new, batch_size=batch)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for b in range(0, len(order), batch):
        rows = order[b: b + batch]
        for r, g in zip(rows, generate_batch(model, tok, [prompts[i] for i in rows], cfg, seed=0)):
            out[r] = g
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def _margins(model, prompts, a, b) -> list[dict]:
    """First differing position of each differing pair and the fp32 top-2 margin of the target there."""
    res = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        j = next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), min(len(x), len(y)))
        ids = torch.tensor([prompts[i] + x[:j]], device=model.device)
        with torch.no_grad(), torch.autocast("cuda", enabled=False):
            logits = model.float()(input_ids=ids).logits[0, -1]
        model.to(torch.bfloat16)
        top = logits.topk(2).values
        res.append({"row": i, "first_diff": j, "fp32_top2_margin": round(float(top[0] - top[1]), 4)})
    return res


_KERNEL_KINDS = (("attention", ("fmha", "flash", "attention", "attn", "softmax")),
                 ("matmul", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "sm90_", "matmul", "addmm", "aten::mm",
                             "aten::bmm", "linear")),
                 ("argmax / reduce", ("argmax", "reduce")), ("copy / cast", ("copy", "cast", "index", "cat", "to_copy")))


def step_profile(model, batch: int, context: int, steps: int = 8, key_bucket: int = 64) -> dict:
    """Where a decode step's time goes at ``batch`` rows and ``context`` filled slots: the fast path without CUDA
    graphs (a kernel runs as long inside a graph as outside it) under ``torch.profiler``; per step = (profile of
    1 + ``steps`` tokens - profile of 1 token) / ``steps``, i.e. the prefill cancels. GPU: CUDA kernel time; CPU:
    the self time of aten ops (noisy: a check of the code path, not a measurement). Returns ms per step by kind of kernel (``_KERNEL_KINDS``: attention, matmul,
    argmax / reduce, copy / cast, other) and the 12 costliest kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from qdflash.batch_generate import BatchGenerator
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    gen = BatchGenerator(model, batch_size=batch, max_len=context + steps + 2, graphs=False, key_bucket=key_bucket)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (context,), generator=g).tolist() for _ in range(batch)]
    gen.generate(prompts, 2, None)                                   # warm-up (allocator, kernel selection)

    def times(n: int) -> dict[str, float]:
        with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
            gen.generate(prompts, n, None)
            if cuda:
                torch.cuda.synchronize()
        out: dict[str, float] = {}
        for e in prof.events():
            if cuda and e.device_type == DeviceType.CUDA:
                us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            elif not cuda and e.name.startswith("aten::"):
                us = e.self_cpu_time_total                           # self time: an op's children are counted apart
            else:
                continue
            out[e.name] = out.get(e.name, 0.0) + us
        return out
    one, many = times(1), times(1 + steps)
    per = {k: (many.get(k, 0.0) - one.get(k, 0.0)) / steps / 1e3 for k in many}      # ms per decode step
    kinds: dict[str, float] = {}
    for name, ms in per.items():
        low = name.lower()
        kind = next((k for k, keys in _KERNEL_KINDS if any(x in low for x in keys)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    top = sorted(per.items(), key=lambda kv: -kv[1])[:12]
    return {"batch": batch, "context": context, "steps": steps, "key_bucket": key_bucket,
            "unit": "CUDA kernel ms per step" if cuda else "CPU aten-op self ms per step",
            "total_ms": round(sum(per.values()), 3), "by_kind_ms": {k: round(v, 3) for k, v in sorted(kinds.items())},
            "top_kernels_ms": [[name[:120], round(ms, 3)] for name, ms in top]}


def _synthetic(args, dev) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from qdflash.batch_generate import BatchGenerator
    from qdflash.runio import provenance
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                         rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192))
    model = model.to(dev, torch.bfloat16).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (int(torch.randint(30, 95, (1,), generator=g)),), generator=g).tolist()
               for _ in range(args.prompts)]
    peak = _peak(dev)
    out = {"command": "python benchmarks/batch_generate_bench.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "provenance": provenance(),
        "gpu": torch.cuda.get_device_name(), "peak": peak, "prompts": len(prompts), "max_new_tokens": args.max_new,
        "runs": []}
    gens = {}
    for B in [int(x) for x in args.batch.split(",")]:
        for kb in [int(x) for x in args.key_buckets.split(",")]:
            gens[(B, kb)] = BatchGenerator(model, batch_size=B, max_len=192 + args.max_new, key_bucket=kb)
            gens[(B, kb)].generate(prompts[:B], args.max_new, None)           # capture every bucket's graph
    for rep in range(args.reps):
        for (B, kb), gen in gens.items():
            _, st = gen.generate(prompts, args.max_new, None)
            rec = {"rep": rep, "batch": B, "key_bucket": kb, "output_tokens_per_s": round(st.output_tokens_per_s, 1),
                   "ms_per_step": round(1e3 * st.decode_s / max(st.steps, 1), 3), "wall_s": round(st.wall_s, 2)}
            out["runs"].append(rec)
            print(json.dumps(rec), flush=True)
    med = {}
    for (B, kb) in gens:
        xs = sorted(r["output_tokens_per_s"] for r in out["runs"] if (r["batch"], r["key_bucket"]) == (B, kb))
        ctx = sum(map(len, prompts)) / len(prompts) + args.max_new / 2
        med[f"{B}/{kb}"] = {"median_tok_per_s": xs[len(xs) // 2], "min": xs[0], "max": xs[-1],
                            "roofline": _roofline(model, B, ctx, peak)}
    out["median"] = med
    print(json.dumps(med))
    if args.profile_step:                       # B:L pairs, e.g. 2048:256,2048:416
        out["step_profile"] = [step_profile(model, int(b), int(c)) for b, c in
                               (x.split(":") for x in args.profile_step.split(","))]
        print(json.dumps(out["step_profile"]), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=16384)
    ap.add_argument("--batch", default="1024,2048,4096")
    ap.add_argument("--hf-prompts", type=int, default=2048)
    ap.add_argument("--hf-batch", type=int, default=1024)
    ap.add_argument("--max-new", type=int, default=224)
    ap.add_argument("--compare", type=int, default=512)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--key-buckets", default="64")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--profile-step", default="", help="with --synthetic: B:L,... where a decode step's kernel time "
                    "goes at batch B and context L (step_profile)")
    args = ap.parse_args()
    from qdflash.batch_generate import BatchGenerator
    from qdflash.models import load_model, load_tokenizer
    from qdflash.runio import provenance
    dev = torch.device("cuda")
    if args.synthetic:
        return _synthetic(args, dev)
    tok = load_tokenizer("smol")
    model = load_model("smol", "bfloat16", device="cuda")
    prompts = _prompts(tok, args.prompts)
    peak = _peak(dev)
    out = {"command": "python benchmarks/batch_generate_bench.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "provenance": provenance(),
        "gpu": torch.cuda.get_device_name(), "peak": peak, "prompts": len(prompts),
        "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1), "max_new_tokens": args.max_new,
        "fast": [], "hf": None}
    eos = tok.eos_token_id
    for B in [int(x) for x in args.batch.split(",")]:
        g = BatchGenerator(model, batch_size=B, max_len=192 + args.max_new)
        g.generate(prompts[:B], 8, eos, pad_token_id=tok.pad_token_id or eos)          # capture + warm-up
        rows, st = g.generate(prompts, args.max_new, eos, pad_token_id=tok.pad_token_id or eos)
        steps = max(st.steps, 1)
        ctx = sum(len(p) for p in prompts) / len(prompts) + args.max_new / 2
        rec = {**st.as_dict(), "batch": B, "ms_per_step": round(1e3 * st.decode_s / steps, 3),
               "roofline": _roofline(model, B, ctx, peak)}
        rec.pop("per_batch", None)
        out["fast"].append(rec)
        print(json.dumps(rec), flush=True)
        del g
        torch.cuda.empty_cache()
    # transformers' generate on a subset, and the greedy tokens of both paths on the same prompts
    sub = prompts[: args.hf_prompts]
    hf_rows, hf_s = _hf(model, tok, sub, args.max_new, args.hf_batch)
    n_tok = sum(map(len, hf_rows))
    g = BatchGenerator(model, batch_size=args.hf_batch, max_len=192 + args.max_new)
    fast_rows, st = g.generate(sub, args.max_new, eos, pad_token_id=tok.pad_token_id or eos)
    out["hf"] = {"prompts": len(sub), "batch": args.hf_batch, "output_tokens": n_tok, "wall_s": round(hf_s, 2),
                 "output_tokens_per_s": round(n_tok / hf_s, 1),
                 "fast_same_prompts_tok_per_s": round(st.output_tokens_per_s, 1),
                 "speedup": round(st.output_tokens_per_s / (n_tok / hf_s), 2)}
    k = min(args.compare, len(sub))
    same = sum(1 for a, b in zip(hf_rows[:k], fast_rows[:k]) if a == b)
    out["greedy_compare"] = {"rows": k, "identical": same,
                             "differences": _margins(model, sub, hf_rows[:k], fast_rows[:k])}
    print(json.dumps(out["hf"]), json.dumps({kk: v for kk, v in out["greedy_compare"].items() if kk != "differences"}))
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
