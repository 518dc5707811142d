"""The Qwen3.5-4B-shape projection (issue 19, item 3): measured step costs of a Qwen3.5-4B-shaped target (random
weights, the published shapes in ``models.QWEN35_4B``: 32 layers, Gated DeltaNet + full attention every 4th) and of
the ``full`` preset's DFlash drafter (5 layers, B=16, target layers 1,8,15,22,29), batch 1, eager PyTorch, one GPU.

* verify cost for 1, 8 and 16 tokens after a ``--context``-token prefill (a forward of n tokens on the cache with
  the hidden states the drafter needs; the recurrent states simply advance, which does not change the cost);
* the drafter's cost per step (a B-token block over its cached context plus ``--accepted`` new context tokens);
* the projected speedup at tau 3.6 and 6.5 (the paper's range): tau x t_verify(1) / (t_draft + t_verify(B)).

``kernels.fla`` records whether ``flash-linear-attention`` imports: transformers then uses its Gated DeltaNet kernels,
else its own torch path (``causal-conv1d`` likewise); the JSON does not trace which kernels each call ran. A projection from measured step costs, not a measured speedup.

    python3 benchmarks/qwen35_projection.py --out OUT.json            # on the GPU (carry the fla wheels)
    python benchmarks/qwen35_projection.py --small --device cpu --out /tmp/p.json   # smoke check of the code path
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def timed(fn, device, reps: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--accepted", type=int, default=4, help="new context tokens per draft step (~tau)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--small", action="store_true", help="qwen35-mini-like shapes (CPU smoke check)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from qdflash.drafter import DraftCache, new_drafter, target_features
    from qdflash import runio
    from qdflash.models import QWEN35_4B
    dev, dt = torch.device(a.device), getattr(torch, a.dtype)
    shape = dict(QWEN35_4B)
    layers, B = (1, 8, 15, 22, 29), 16
    if a.small:
        shape.update(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2)
        layers, B = (1, 3, 6), 4
    torch.manual_seed(0)
    with torch.device(dev):
        target = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape)).to(dt).eval()
    drafter = new_drafter(target, 5 if not a.small else 1, B, layers, 248070).to(dev, dt).eval()
    g = torch.Generator().manual_seed(0)
    V = shape["vocab_size"]
    res = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "dtype": a.dtype, "context": a.context, "block_size": B,
           "target_params": sum(p.numel() for p in target.parameters()),
           "drafter_params": sum(p.numel() for p in drafter.parameters()),
           "kernels": {"fla": importlib.util.find_spec("fla") is not None,
                       "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None},
           "provenance": runio.provenance()}
    res["git_sha"] = res["provenance"]["git_sha"]
    if res["kernels"]["fla"]:
        import fla
        res["kernels"]["fla_version"] = getattr(fla, "__version__", "?")
    with torch.no_grad():
        ids = torch.randint(0, V, (1, a.context), generator=g).to(dev)
        t = time.perf_counter()
        out = target(input_ids=ids, use_cache=True, output_hidden_states=True, logits_to_keep=1)
        res["prefill_s"] = time.perf_counter() - t
        base_cache = out.past_key_values
        cache = copy.deepcopy(base_cache)
        dcache = DraftCache()
        drafter(target.get_input_embeddings()(torch.full((1, B), 5, device=dev)),
                target_features(out.hidden_states, layers), torch.arange(a.context, a.context + B, device=dev)[None],
                torch.arange(a.context, device=dev)[None], dcache)
        pos = [a.context]

        def verify(n, c):
            def f():
                x = torch.randint(0, V, (1, n), generator=g).to(dev)
                target(input_ids=x, past_key_values=c, use_cache=True, output_hidden_states=n > 1)
            return f

        for n in (1, 8, 16) if not a.small else (1, B):
            # each shape from a copy of the prefilled cache: the context grows only by its own (warm + reps) x n
            res[f"verify_{n}_ms"] = 1e3 * timed(verify(n, copy.deepcopy(base_cache)), dev, a.reps)
            print(f"verify {n}: {res[f'verify_{n}_ms']:.2f} ms", flush=True)
        H = target.config.hidden_size
        noise = target.get_input_embeddings()(torch.full((1, B), 5, device=dev))

        def draft():
            p0 = len(dcache)
            ctx = torch.randn(1, a.accepted, len(layers) * H, generator=g).to(dev, dt)
            drafter(noise, ctx, torch.arange(p0 + a.accepted, p0 + a.accepted + B, device=dev)[None],
                    torch.arange(p0, p0 + a.accepted, device=dev)[None], dcache)
        res["draft_step_ms"] = 1e3 * timed(draft, dev, a.reps)
        print(f"draft step: {res['draft_step_ms']:.2f} ms", flush=True)
    t1, tB = res["verify_1_ms"], res[f"verify_{B}_ms"]
    res["verify_B_over_1"] = tB / t1
    for tau in (3.6, 6.5):
        res[f"projected_speedup_tau_{tau}"] = tau * t1 / (res["draft_step_ms"] + tB)
    res["note"] = ("random weights, eager PyTorch, batch 1; a projection from measured step costs: "
                   "tau x t_verify(1) / (t_draft + t_verify(B))")
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
