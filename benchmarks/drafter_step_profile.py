"""Where a drafter training step's time goes (issue 34, item 3): the stage-02 step of ``drafter_train.train_drafter``
split into target features (one target forward per batch), the host-built batch (``make_batch``), the drafter
forward + loss + backward, and the optimizer, each synchronised; with tokens/s and achieved TFLOP/s against the
measured bf16 matmul peak.

    python benchmarks/drafter_step_profile.py --data RUNS/00_data --preset smol-gpu-xl --out OUT.json [--steps 30]
    python benchmarks/drafter_step_profile.py --synthetic 4096 --out OUT.json --trace OUT.txt

``--synthetic N``: no data or model files: a randomly initialised target of SmolLM2-135M's shape (a step's cost does
not depend on the weights) and N rows of random tokens with stage 00's mean lengths (30-94-token prompt, 60-224-token
answer). ``--trace``: the CUDA kernels of 5 steps by total time (torch.profiler), and ``train_drafter``'s loop timed
without the added synchronisations (what a real epoch runs at).
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--synthetic", type=int, default=0)
    ap.add_argument("--trace")
    ap.add_argument("--preset", default="smol-gpu-xl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=0, help="override the preset's batch size")
    ap.add_argument("--ce-chunk", type=int, default=-1, help="override the preset's ce_chunk (-1: keep)")
    ap.add_argument("--layers", type=int, default=0, help="override the preset's drafter depth (num_layers)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="a reduced draft vocabulary of N tokens")
    ap.add_argument("--compile-features", action="store_true",
                    help="the target's feature forward padded to one shape and compiled (CUDA graphs)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the target and drafter forwards (dynamic)")
    ap.add_argument("--loop-steps", type=int, default=60, help="steps of train_drafter itself, timed")
    args = ap.parse_args()
    from qdflash.config import DrafterConfig, default_gamma, load_config
    from qdflash.data import load_split
    from qdflash.drafter import new_drafter
    from qdflash.drafter_train import drafter_loss, make_batch, stage_features
    try:                                    # this tree; a baseline tree (--XL_BASE) has it in drafter_train
        from qdflash.training import autocast_dtype as compute_dtype
    except ImportError:
        from qdflash.drafter_train import compute_dtype
    from qdflash.models import load_model, load_tokenizer, mask_token_id, resolve_target
    from qdflash.runio import provenance, write_json
    over = {"batch_size": args.batch} if args.batch else {}
    if args.ce_chunk >= 0:
        over["ce_chunk"] = args.ce_chunk
    if args.compile_features:
        over["compile_features"] = True
    if args.layers:
        over["num_layers"] = args.layers
    cfg = load_config(DrafterConfig, args.preset, **over)
    if args.synthetic:
        from transformers import LlamaConfig, LlamaForCausalLM

        from qdflash.features import OnlineFeatures
        from qdflash.runio import device, torch_dtype
        torch.manual_seed(0)
        target = LlamaForCausalLM(LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                              num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                              rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                              max_position_embeddings=8192))
        target = target.to(device(), torch_dtype(cfg.dtype)).eval()
        g = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(args.synthetic):
            p, r = int(torch.randint(30, 95, (1,), generator=g)), int(torch.randint(60, 225, (1,), generator=g))
            rows.append({"input_ids": torch.randint(0, 49152, (p + r,), generator=g).tolist(),
                         "loss_mask": [0] * p + [1] * r, "prompt_len": p})
        feats = OnlineFeatures(target, rows, cfg.target_layer_ids, cfg.max_len,
                               **({"static": True} if args.compile_features else {}))   # older trees: no static
        mask_id = 0
    else:
        spec = json.load(open(f"{args.data}/config.json"))["target"]
        target = load_model(spec, cfg.dtype)
        rows = load_split(args.data, "train")
        feats = stage_features(target, resolve_target(spec), rows, cfg, False)
        mask_id = mask_token_id(load_tokenizer(spec), cfg.mask_token_id)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_id,
                    cfg.intermediate_size, cfg.seed, cfg.init, cfg.train_window).to(target.device)
    d.float().train()
    if args.draft_vocab:
        from qdflash.drafter import most_frequent_tokens, set_draft_vocab
        set_draft_vocab(d, most_frequent_tokens(rows, args.draft_vocab, cfg.max_len)[0])
    if args.compile:
        target.forward = torch.compile(target.forward, dynamic=True)
        d.forward = torch.compile(d.forward, dynamic=True)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    target.requires_grad_(False)
    opt = torch.optim.AdamW(d.parameters(), lr=cfg.lr, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(rows), generator=gen).tolist()
    gamma = cfg.gamma or default_gamma(cfg.block_size)
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t = {"features": [], "make_batch": [], "fwd_bwd": [], "optimizer": [], "step": []}
    toks, sup = [], []
    for s in range(args.steps):
        idx = order[s * cfg.batch_size: (s + 1) * cfg.batch_size]
        sync()
        t0 = time.perf_counter()
        if hasattr(feats, "prefetch"):
            feats.prefetch(idx)
        sync()
        t1 = time.perf_counter()
        batch = make_batch(rows, feats, idx, cfg, d.mask_token_id, gen, gamma, **_t2d(d))
        sync()
        t2 = time.perf_counter()
        loss, info = drafter_loss(d, embed, lm_head, batch, compute_dtype(cfg), **_chunk(cfg))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(d.parameters(), cfg.grad_clip)
        sync()
        t3 = time.perf_counter()
        opt.step()
        sync()
        t4 = time.perf_counter()
        for k, v in zip(t, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
            t[k].append(v)
        toks.append(sum(len(rows[i]["input_ids"][: cfg.max_len]) for i in idx))
        sup.append(info["n_sup"])
    skip = min(5, args.steps // 3)                       # warm-up steps
    med = {k: sorted(v[skip:])[len(v[skip:]) // 2] for k, v in t.items()}
    n_params = sum(p.numel() for p in d.parameters())
    H, V = target.config.hidden_size, target.config.vocab_size
    # FLOPs: drafter fwd+bwd 6 x params x block tokens; lm_head fwd + bwd (input grad) 4 x H x V x supervised
    blocks = cfg.batch_size * cfg.num_anchors * cfg.block_size
    flops = 6 * n_params * blocks + 4 * H * V * (sum(sup[skip:]) / len(sup[skip:]))
    peak = float("nan")
    if cuda:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        a @ a
        sync()
        p0 = time.perf_counter()
        for _ in range(10):
            a @ a
        sync()
        peak = 10 * 2 * 8192 ** 3 / (time.perf_counter() - p0)
    out = {"command": "python benchmarks/drafter_step_profile.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
           "provenance": provenance(), "preset": args.preset, "batch_size": cfg.batch_size,
           "num_anchors": cfg.num_anchors, "block_size": cfg.block_size, "median_s": {k: round(v, 4) for k, v in med.items()},
           "tok_per_s": round(sum(toks[skip:]) / sum(t["step"][skip:]), 1),
           "drafter_params": n_params, "fwd_bwd_tflops_achieved": round(flops / med["fwd_bwd"] / 1e12, 2),
           "bf16_peak_tflops": round(peak / 1e12, 1), "supervised_per_step": round(sum(sup[skip:]) / len(sup[skip:]), 1)}
    if cuda:
        out["loop_s_per_step"] = _loop(d, target, rows, feats, cfg, order, args.loop_steps)
        out["loop_steps"] = args.loop_steps
        out["loop_tok_per_s"] = round(sum(len(rows[i]["input_ids"][: cfg.max_len])
                                          for i in order[: args.loop_steps * cfg.batch_size]) /
                                      (out["loop_s_per_step"] * args.loop_steps), 1)
    if args.trace and cuda:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _loop(d, target, rows, feats, cfg, order, 5)
        with open(args.trace, "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60))
    print(json.dumps(out))
    write_json(args.out, out)


def _t2d(d) -> dict:
    """make_batch's draft-vocabulary map where the drafter has one (absent in older trees)."""
    if getattr(d, "draft_vocab", None) is None:
        return {}
    from qdflash.drafter import target_to_draft
    return {"t2d": target_to_draft(d, int(d.config.vocab_size))}


def _chunk(cfg) -> dict:
    """drafter_loss's ce_chunk where this checkout has it (the script also runs against older trees)."""
    return {"ce_chunk": cfg.ce_chunk} if getattr(cfg, "ce_chunk", 0) else {}


def _loop(d, target, rows, feats, cfg, order, steps) -> float:
    """``train_drafter`` itself (its own host reads and logging) over ``steps`` batches of one epoch: seconds per step,
    its final checkpoint save included."""
    import tempfile
    from pathlib import Path

    from qdflash.drafter_train import train_drafter
    sub = [rows[i] for i in order[: steps * cfg.batch_size]]
    sub_feats = _Subset(feats, order[: steps * cfg.batch_size])
    with tempfile.TemporaryDirectory() as tmp:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_drafter(d, target, sub, sub_feats, cfg, 1, Path(tmp) / "d.pt", Path(tmp) / "log.jsonl", "loop",
                      progress=False)
        torch.cuda.synchronize()
        return round((time.perf_counter() - t0) / steps, 4)


class _Subset:
    """Rows ``keep`` of a feature source, renumbered 0.. (OnlineFeatures or a FeatureStore)."""
    def __init__(self, feats, keep):
        self.feats, self.keep = feats, list(keep)

    def prefetch(self, idx):
        if hasattr(self.feats, "prefetch"):
            self.feats.prefetch([self.keep[i] for i in idx])

    def __getitem__(self, i):
        return self.feats[self.keep[i]]

    def __len__(self):
        return len(self.keep)


if __name__ == "__main__":
    main()
