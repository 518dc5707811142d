"""Why QAD keeps fp32 latents under bf16 compute (issue: QAD correct in bf16): AdamW at the paper's lr 2e-6 on
latents stored in bf16 vs fp32, same gradients. Latents: the smol target's real Linear weights (all 210 quantized
Linears); gradients: seeded Gaussian noise (Adam's update is ~lr whatever their scale).

    .venv/bin/python benchmarks/bf16_latent_stall.py --out benchmarks/bf16_latent_stall.json
"""
from __future__ import annotations

import argparse
import sys

import torch

from qdflash.models import load_model
from qdflash.runio import git_sha, write_json


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/bf16_latent_stall.json")
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=12, help="Linears sampled (every k-th) to bound memory/time")
    a = ap.parse_args()
    m = load_model("smol", "float32")
    lins = [mod.weight.detach() for n, mod in m.named_modules()
            if isinstance(mod, torch.nn.Linear) and n != "lm_head"]
    ws = lins[:: max(1, len(lins) // a.layers)]
    res = {"command": " ".join(sys.argv), "git_sha": git_sha(), "lr": a.lr, "steps": a.steps,
           "elements": sum(w.numel() for w in ws)}
    moved = {}
    for dt in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(w.clone().to(dt)) for w in ws]
        start = [p.detach().clone() for p in ps]
        opt = torch.optim.AdamW(ps, lr=a.lr, weight_decay=0.0, betas=(0.9, 0.95))
        for _ in range(a.steps):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g).to(dt)
            opt.step()
        changed = sum(int((p.detach() != s).sum()) for p, s in zip(ps, start))
        disp = sum(float((p.detach().float() - s.float()).abs().sum()) for p, s in zip(ps, start))
        moved[str(dt).split(".")[-1]] = {"fraction_changed": changed / res["elements"],
                                         "mean_abs_displacement": disp / res["elements"]}
    res["latents"] = moved
    res["expected_displacement_upper_bound"] = a.lr * a.steps
    write_json(a.out, res)
    print(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
