"""True decoded tau of a trained drafter on held-out real prompts, overall and per prompt source, with bootstrap
intervals over prompts: the reference decoder (``decode_grid``, the stage grids' code) on the first N val prompts of
a stage-00 run (real prompts only: ``data.held_out_split``), greedy, N x max_new_tokens.

    python benchmarks/drafter_tau_by_source.py --data RUNS/00_data --drafter RUNS/02_drafter_pretrain/<name> \
        --target smol --out OUT.json [--prompts 64] [--new 128] [--decoder graphs] [--dtype float32]

Sources come from the example ids (``sharegpt-12``, ``reasoning-40``...): chat = sharegpt, sharegpt_later, chitchat;
maths/reasoning = gsm, reasoning; magpie never appears (it is never held out).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--drafter", required=True, action="append", help="NAME=PATH (repeatable) or PATH")
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--decoder", default="graphs")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--walk", action="store_true", help="measure every drafter by teacher forcing along the plain "
                    "greedy outputs (walk.Walker: the decoder's tau without a decode per drafter)")
    args = ap.parse_args()
    from qdflash.data import load_split, source_group, source_of
    from qdflash.decode_grid import decode_grid
    from qdflash.drafter import load_drafter
    from qdflash.drafter_train import tau_by_group
    from qdflash.models import load_model, load_tokenizer, resolve_target
    from qdflash.runio import provenance, torch_dtype, write_json
    from qdflash.decode_stats import acceptance_stats, results_from_json
    t0 = time.time()
    rows = load_split(args.data, "val")[: args.prompts]
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    sources = [source_of(r["id"]) for r in rows]
    groups = [source_group(r["id"]) for r in rows]
    spec = resolve_target(args.target)
    target = load_model(spec, args.dtype)
    tok = load_tokenizer(args.target)
    drafters = {}
    for d in args.drafter:
        name, _, path = d.rpartition("=")
        drafters[name or Path(path).name] = load_drafter(path, torch_dtype(args.dtype)).to(target.device).eval()
    grid_path = Path(args.out).with_suffix(".grid.json")
    stats = decode_grid(grid_path, target, {"target": spec, "prompts": prompts, "max_new_tokens": args.new,
                                            "dtype": args.dtype, "temperature": 0.0, "seed": 0,
                                            "decoder": args.decoder}, drafters, tok.eos_token_id, progress=True,
                        walk=list(drafters) if args.walk else ())
    saved = json.loads(grid_path.read_text())["results"]
    by_group = tau_by_group(grid_path, groups)
    out = {"command": "python benchmarks/drafter_tau_by_source.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()), "provenance": provenance(), "prompts": len(prompts),
        "sources": {s: sources.count(s) for s in sorted(set(sources))}, "max_new_tokens": args.new,
        "decoder": args.decoder, "dtype": args.dtype, "drafters": {}}
    for name in drafters:
        res = results_from_json(saved[name])
        by = {g: {"prompts": v["prompts"], "tau": round(v["tau"], 4), "tau_ci95": [round(x, 4) for x in v["tau_ci95"]]}
              for g, v in by_group[name].items()}
        st = acceptance_stats(res)
        out["drafters"][name] = {"tau": round(st["tau"], 4), "tau_ci95": [round(x, 4) for x in st["tau_ci95"]],
                                 "per_position": [round(x, 4) for x in st["per_position"]], "by_source": by,
                                 "speedup": stats.get(name, {}).get("speedup"),
                                 "greedy_mismatches": stats.get(name, {}).get("greedy_mismatches")}
        print(name, json.dumps(out["drafters"][name]), flush=True)
    out["wall_s"] = round(time.time() - t0, 1)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
