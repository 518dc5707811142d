"""Drafter scaling sweep: how the DFlash drafter's acceptance grows with training conversations and epochs.

Trains drafters with the project's own trainer (``drafter_train.train_drafter``: loss, batches, schedule, fp32
master weights under bf16 autocast) on prefixes of a stage-00 training set (the mixed sources keep their proportions
in every prefix) and scores each on the held-out split with the *block-level* greedy estimate: for every block of
``block_size`` tokens inside a held-out response, the drafter sees the target's features of the context and the
anchor token, and tau_est = 1 + E[number of leading block positions it predicts right] (the bonus token counted).
This needs one forward per block instead of a decode, so a sweep point costs seconds. It overestimates the
decoder's tau: it averages acceptance over uniformly drawn anchors, while decoding moves past easy stretches in one
step and spends many steps on hard ones (tokens / steps weights hard positions more); blocks in a response's last
``block_size - 1`` tokens are not scored. (The issue's measurement: 0.24-0.30 above the decoder at tau ~2.) Stage 03 of the same preset measures the true tau of the all-data point with the reference
decoder, which calibrates the curve. Resumable: finished points are kept in the output JSON.

  python benchmarks/drafter_scaling.py --runs RUNS --preset smol-gpu --sizes 1000,2000,4000,8000,0 \
      --epochs 4 --extra-epochs 1,2 --out benchmarks/drafter-scaling-h200/scaling.json
(size 0 = all training conversations; --extra-epochs adds points at those epochs for the largest size; --steps S trains
every size for exactly S optimizer steps instead of a fixed number of epochs; --sources real
trains on the conversations with real prompts only, a real-only curve beside the default real + self-prompted one;
--walk N adds the decoder's tau on N held-out real prompts, walked along the fp32 target's plain greedy outputs)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def block_tau(drafter, target, rows, cfg, n_anchors: int = 64, bs: int = 8, seed: int = 123) -> dict:
    """Block-level greedy estimate on ``rows`` with a bootstrap interval over conversations."""
    from qdflash.config import default_gamma
    from qdflash.drafter_train import make_batch
    from qdflash.features import OnlineFeatures
    from qdflash.qad import bootstrap_ratio_diff
    E, H = target.get_input_embeddings(), target.get_output_embeddings()
    feats = OnlineFeatures(target, rows, cfg.target_layer_ids, cfg.max_len)
    ecfg = cfg.__class__(**{**cfg.__dict__, "num_anchors": n_anchors})
    gen = torch.Generator().manual_seed(seed)
    B = cfg.block_size
    per_conv, pos_hits, n_blocks = [], torch.zeros(B - 1), 0
    drafter.eval()
    with torch.no_grad(), torch.autocast(drafter.device.type, dtype=torch.bfloat16):
        for b in range(0, len(rows), bs):
            idx = list(range(b, min(b + bs, len(rows))))
            feats.prefetch(idx)
            bt = make_batch(rows, feats, idx, ecfg, drafter.mask_token_id, gen, default_gamma(B))
            bt = {k: v.to(drafter.device) for k, v in bt.items()}
            h = drafter(E(bt["noise_ids"]), bt["ctx"], bt["q_pos"], bt["ctx_pos"], attn_mask=bt["mask"])
            pred = H(h).argmax(-1)
            ok = (pred == bt["labels"]).view(len(idx), -1, B)[:, :, 1:]
            inside = (bt["weights"].view(len(idx), -1, B)[:, :, 1:] > 0).all(-1)   # blocks wholly in a response
            lead = ok.float().cumprod(-1)
            for r in range(len(idx)):
                m = inside[r]
                if m.any():
                    per_conv.append((float(lead[r][m].sum(-1).sum()), int(m.sum())))
                    pos_hits += lead[r][m].sum(0).float().cpu()
                    n_blocks += int(m.sum())
    # 1 + (leading-correct sum) / (blocks), the ratio bootstrapped over conversations
    r = bootstrap_ratio_diff([x for x, _ in per_conv], [float(n) for _, n in per_conv], [1] * len(per_conv))
    return {"tau_est": 1 + r["ratio"], "tau_est_ci95": [1 + x for x in r["ratio_ci95"]],
            "per_position": [float(x) / max(1, n_blocks) for x in pos_hits], "blocks": n_blocks,
            "scored_conversations": len(per_conv)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="runs directory with 00_data of the preset")
    ap.add_argument("--preset", default="smol-gpu")
    ap.add_argument("--sizes", default="1000,2000,4000,8000,0")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--epochs", type=int, default=None, help="epochs of the size points (default: the preset's)")
    how.add_argument("--steps", type=int, default=None, help="exactly this many optimizer steps at every size (whole "
                     "epochs, then part of one; drafter_train.train_drafter(steps=)) instead of a number of epochs: a "
                     "data curve at equal training steps (at a fixed number of epochs a point's steps grow with its size)")
    ap.add_argument("--extra-epochs", default="", help="more epoch counts for the largest size")
    ap.add_argument("--val", type=int, default=256, help="held-out conversations scored")
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[], help="DrafterConfig override k=v (json value)")
    ap.add_argument("--sources", choices=("all", "real"), default="all",
                    help="train on every stage-00 conversation, or only on those with real prompts (no magpie)")
    ap.add_argument("--features", choices=("stage", "eager"), default="stage",
                    help="the target's features during training: as stage 02 computes them (drafter_train.stage_features:"
                         " the preset's compile_features / feature_cache), or eager per batch (what this script did "
                         "before this option, e.g. run-1207f-h100)")
    ap.add_argument("--walk", type=int, default=0, help="also the decoder's tau, walked along the fp32 target's "
                    "plain greedy outputs on this many held-out real prompts (the stage grids' code, decode_grid)")
    ap.add_argument("--new", type=int, default=128, help="tokens per walked prompt")
    ap.add_argument("--walk-grid", default=None, help="the walk's grid file (default: OUT with .walk-grid.json); two "
                    "sweeps that name the same one decode the target's plain answers once")
    a = ap.parse_args()
    from qdflash.config import DrafterConfig, load_config
    from qdflash.data import load_split
    from qdflash.drafter import new_drafter
    from qdflash.drafter_train import stage_features, train_drafter
    from qdflash.features import OnlineFeatures
    from qdflash.models import load_model, load_tokenizer, mask_token_id, resolve_target
    over = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    cfg = load_config(DrafterConfig, a.preset, **over)
    data = Path(a.runs) / "00_data"
    spec = json.loads((data / "config.json").read_text())["target"]
    target = load_model(spec, cfg.dtype)
    tok = load_tokenizer(spec)
    from qdflash.data import is_self_prompted
    train, val = load_split(data, "train"), load_split(data, "val")[: a.val]
    if a.sources == "real":
        train = [r for r in train if not is_self_prompted(r["id"])]
    epochs = a.epochs or cfg.epochs
    sizes = [min(int(s) or len(train), len(train)) for s in a.sizes.split(",")]
    # a point: (conversations, epochs, steps or None); with --steps its epochs are the fraction those steps cover
    # (drafter_train: n // batch steps an epoch), recorded as a number so that a resumed sweep finds its finished points
    if a.steps:
        points = [(n, round(a.steps / max(1, n // cfg.batch_size), 3), a.steps) for n in sizes]
    else:
        points = [(n, epochs, None) for n in sizes]
    points += [(max(sizes), int(e), None) for e in a.extra_epochs.split(",") if e]
    points = list(dict.fromkeys(points))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = json.loads(out.read_text()) if out.exists() else {"points": []}
    from qdflash.runio import provenance
    prov = provenance()      # QDFLASH_GIT_SHA on the GPU box: its copy of the tree may carry a stale .git
    res.update({"command": " ".join(sys.argv), "git_sha": prov["git_sha"], "provenance": prov, "preset": a.preset, "config": cfg.__dict__,
                "train_conversations": len(train), "val_conversations": len(val), "device": str(target.device),
                "estimate": "block-level greedy tau (bonus counted), bootstrap over held-out conversations"})
    done = {(p["conversations"], p["epochs"], p.get("sources", "all")) for p in res["points"]}
    walk = None
    if a.walk:
        from qdflash.drafter_train import eval_prompts
        walk = (load_model(spec, "float32"), eval_prompts(data, a.walk),
                Path(a.walk_grid) if a.walk_grid else out.with_suffix(".walk-grid.json"))
    work = out.parent / "work"
    work.mkdir(exist_ok=True)
    for n, ep, steps in points:
        if (n, ep, a.sources) in done:
            continue
        rows = train[:n]
        d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids,
                        mask_token_id(tok, cfg.mask_token_id), cfg.intermediate_size, cfg.seed, cfg.init)
        d = d.to(target.device)
        t0 = time.time()
        name = f"{a.sources}-n{n}-" + (f"s{steps}" if steps else f"e{ep}")
        tag = name if a.sources != "all" or steps else f"n{n}-e{ep}"    # "all" by epochs: the older files' names
        resumed = (work / f"{tag}.ckpt.pt").exists()
        feats = (stage_features(target, resolve_target(spec), rows, cfg, False) if a.features == "stage"
                 else OnlineFeatures(target, rows, cfg.target_layer_ids, cfg.max_len))
        log = train_drafter(d, target, rows, feats, cfg,
                            int(ep), work / f"{tag}.ckpt.pt", work / f"{tag}.log.jsonl", tag, progress=False,
                            steps=steps)
        train_s = time.time() - t0
        ev = block_tau(d, target, val, cfg)
        if walk is not None:
            import copy

            from qdflash.decode_grid import decode_grid
            tgt32, prompts, grid = walk
            st = decode_grid(grid, tgt32, {"target": spec, "prompts": prompts, "max_new_tokens": a.new,
                                           "dtype": "float32", "temperature": 0.0, "seed": 0, "decoder": cfg.decoder},
                             {name: copy.deepcopy(d).float().eval()}, tok.eos_token_id, walk=[name])[name]
            # the grid file keeps the drafters of its last call only: each point keeps its own per-prompt results
            # (paired comparisons between points and curves: scaling.xl_scaling_pairs)
            ev.update({"tau_walk": st["tau"], "tau_walk_ci95": st["tau_ci95"], "walk_prompts": len(prompts),
                       "walk_results": json.loads(grid.read_text())["results"][name]})
        # training seconds from the log, which carries them over a resume (a point whose checkpoint a cut call left
        # finished trains nothing here; None: a resumed log without them); this call's training wall time beside it
        logged = log[-1].get("train_s") if log else None
        p = {"conversations": n, "epochs": ep, "sources": a.sources, "steps": len(log),
             "train_s": round(logged, 1) if logged is not None else (None if resumed else round(train_s, 1)),
             "call_train_s": round(train_s, 1), "features": a.features,
             "self_prompted": sum(is_self_prompted(r["id"]) for r in rows),
             **({"steps_target": steps} if steps else {}),
             "response_tokens": sum(sum(r["loss_mask"]) for r in rows),
             "final_loss": sum(r["loss"] for r in log[-20:]) / max(1, len(log[-20:])), **ev}
        print(json.dumps({k: v for k, v in p.items() if k != "walk_results"}), flush=True)
        res["points"].append(p)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(out)


if __name__ == "__main__":
    main()
