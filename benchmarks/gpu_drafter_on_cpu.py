"""Issue 16 at a real tau: stage 04 (W4A16 GPTQ / W8A16 RTN drafters, with and without the drafter window, reference
decoder, paired over prompts) run on this CPU for a drafter trained on the GPU (the `smol-gpu` preset's two-stage
drafter, brought back as bf16 weights), against this machine's `smol` QAD target.

The `smol` and `smol-gpu` presets share the FP target (SmolLM2-135M), the drafter shape (2 layers, B=8, target layers
1,8,15,22,27) and the INT4 recipe; the GPU drafter was finetuned against the GPU run's QAD target, and is measured
here against the CPU run's QAD target (same method and data mix, another QAD run): a transfer, stated as such.

    .venv/bin/python benchmarks/gpu_drafter_on_cpu.py --runs runs/smol --drafter DIR --out benchmarks/cpu-gpu-drafter
    [--set eval_prompts=16 --set eval_new_tokens=64]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/smol")
    ap.add_argument("--drafter", required=True, help="the GPU two-stage drafter checkpoint (bf16 or fp32)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[], help="DrafterQuantConfig override key=value (JSON value)")
    a = ap.parse_args()
    from qdflash.config import DrafterQuantConfig, load_config
    from qdflash.stages.s04_drafter_quant import run_drafter_quant
    from qdflash.runio import write_json
    over = {}
    for kv in a.set:
        k, v = kv.split("=", 1)
        try:
            over[k] = json.loads(v)
        except json.JSONDecodeError:
            over[k] = v
    cfg = load_config(DrafterQuantConfig, "smol", **over)
    runs, out = Path(a.runs).resolve(), Path(a.out).resolve()
    ft = out / "03_gpu_drafter"                 # stands in for stage 03: names the drafter, no decodes to reuse
    ft.mkdir(parents=True, exist_ok=True)
    write_json(ft / "metrics.json", {"drafters": {"two_stage": str(Path(a.drafter).resolve())},
                                     "note": "a GPU-trained drafter measured on this CPU (benchmarks/gpu_drafter_on_cpu.py)"})
    r = run_drafter_quant(cfg, out / "04_drafter_quant", runs / "00_data", runs / "01_qad", ft)
    t = r.metrics["table"]
    print(json.dumps({k: {"tau": round(v["tau"], 3), "ci": v.get("tau_ci95"), "tok/s": round(v.get("tokens_per_s") or 0.0, 2)}
                      for k, v in t.items() if isinstance(v, dict) and "tau" in v}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
