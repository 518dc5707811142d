"""Issue 16 at a real tau: stage 04 (W4A16 GPTQ / W8A16 RTN drafters, with and without the drafter window, reference
decoder, paired over prompts) run on this CPU for a drafter trained on the GPU (the `smol-gpu` preset's two-stage
drafter, brought back as bf16 weights), against this machine's `smol` QAD target.

The `smol` and `smol-gpu` presets share the FP target (SmolLM2-135M), the drafter shape (2 layers, B=8, target layers
1,8,15,22,27) and the INT4 recipe; the GPU drafter was finetuned against the GPU run's QAD target, and is measured
here against the CPU run's QAD target (same method and data mix, another QAD run): a transfer, stated as such.

    .venv/bin/python benchmarks/gpu_drafter_on_cpu.py --runs runs/smol --drafter DIR --out benchmarks/cpu-gpu-drafter
    [--set eval_prompts=16 --set eval_new_tokens=64]

``--finetune``: a pretrained GPU drafter finetuned here first, by stage 03 of the ``smol`` preset against this CPU's
QAD target (its own answers to the run's training prompts; the drafter's depth and draft vocabulary kept; no direct
ablation; the grid on the QAD target: the two-stage drafter decoded, the pretrained one walked, paired), so that the
drafter stage 04 quantizes has seen the target it is served with.
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
    ap.add_argument("--finetune", action="store_true", help="first stage 03 of the smol preset on this CPU's QAD target "
                    "with --drafter as the pretrained drafter (its depth kept; no direct ablation, the grid on the "
                    "QAD target), then stage 04 on the two-stage drafter it makes")
    ap.add_argument("--finetune-set", action="append", default=[], help="DrafterConfig override key=value for --finetune")
    a = ap.parse_args()
    from qdflash.config import DrafterQuantConfig, load_config, parse_overrides
    from qdflash.stages.s04_drafter_quant import run_drafter_quant
    from qdflash.runio import write_json
    cfg = load_config(DrafterQuantConfig, "smol", **parse_overrides(a.set))
    runs, out = Path(a.runs).resolve(), Path(a.out).resolve()
    if a.finetune:              # stage 03 on this CPU: the GPU drafter stands in for stage 02's
        from qdflash.config import DrafterConfig
        from qdflash.stages.s03_drafter_finetune import run_drafter_finetune
        pre = out / "02_gpu_drafter"
        pre.mkdir(parents=True, exist_ok=True)
        write_json(pre / "metrics.json", {"drafter": str(Path(a.drafter).resolve()),
                                          "note": "a GPU-trained drafter (benchmarks/gpu_drafter_on_cpu.py --finetune)"})
        dcfg = json.loads((Path(a.drafter) / "config.json").read_text())
        fover = {"num_layers": dcfg["num_hidden_layers"], "direct_ablation": False, "eval_random": False,
                 "grid_targets": ["qad"], **parse_overrides(a.finetune_set)}
        r3 = run_drafter_finetune(load_config(DrafterConfig, "smol", **fover), out / "03_drafter_finetune",
                                  runs / "00_data", pre, runs / "01_qad")
        ft = out / "03_drafter_finetune"
        print(json.dumps({k: round(v["tau"], 3) for k, v in r3.metrics["decoding"]["qad"].items()
                          if isinstance(v, dict) and "tau" in v}), flush=True)
    else:
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
