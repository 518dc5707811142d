"""Teacher-forced acceptance (``walk.Walker``) against the lossless reference decoder at a real tau, on this CPU.

For each target (the FP model and the QAD W4A16 model of ``--runs``) and each drafter given, on the same held-out
prompts (stage 03's: the first N of 00_data's val split), greedy, fp32, eager: decode with the drafter, walk the
drafter along the plain greedy outputs, and compare the two prompt by prompt (identical accept-length sequences) and
in tau; also the time of each (decoder: the drafter run's draft + verify time; walk: the target forwards that build
the continuations, once per target, and the drafter steps). Drafters trained on the GPU (``smol-gpu``, tau ~1.6-1.9)
give the walk steps of every length, which the CPU ``smol`` drafters (tau ~1.15) rarely do.

    .venv/bin/python benchmarks/walk_vs_decoder.py --runs runs/smol --drafter NAME=DIR [--drafter ...] \
        [--prompts 8] [--new-tokens 64] --out benchmarks/cpu-walk-vs-decoder/walk-vs-decoder.json
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/smol")
    ap.add_argument("--drafter", action="append", required=True, help="NAME=checkpoint directory")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch

    from qdflash.drafter import load_drafter
    from qdflash.drafter_train import eval_prompts
    from qdflash.models import load_model, load_tokenizer, resolve_target
    from qdflash.runio import git_sha, read_json, write_json
    from qdflash.decode_stats import acceptance_stats
    from qdflash.speculative import decode_prompts
    from qdflash.walk import Walker, agreement
    runs = Path(a.runs).resolve()
    qm = read_json(runs / "01_qad" / "metrics.json")
    targets = {"fp": resolve_target(read_json(runs / "00_data" / "config.json")["target"]),
               "qad": str(runs / "01_qad" / qm["names"]["qad"])}
    drafters = dict(kv.split("=", 1) for kv in a.drafter)
    prompts = eval_prompts(runs / "00_data", a.prompts)
    tok = load_tokenizer(targets["qad"])
    out = {"command": " ".join(sys.argv), "git_sha": git_sha(), "host": platform.node(),
           "torch_threads": torch.get_num_threads(), "prompts": len(prompts), "new_tokens": a.new_tokens,
           "drafters": drafters, "targets": {}}
    for tname, tspec in targets.items():
        target = load_model(tspec, "float32", "cpu")
        plain, pst = decode_prompts(target, prompts, a.new_tokens, None, 0.0, tok.eos_token_id)
        walker = Walker(target, prompts, plain, tok.eos_token_id)
        layers = load_drafter(next(iter(drafters.values()))).target_layer_ids
        t0 = time.perf_counter()
        for i in range(len(prompts)):
            walker.context(i, 16, layers)            # the continuations and features, once for every drafter
        ctx_s = time.perf_counter() - t0
        rows = {"plain": {"decode_time_s": pst["decode_time_s"], "tokens_per_s": pst["tokens_per_s"]},
                "walk_contexts_s": ctx_s}
        for dname, path in drafters.items():
            d = load_drafter(path, torch.float32)
            dec, dst = decode_prompts(target, prompts, a.new_tokens, d, 0.0, tok.eos_token_id)
            t0 = time.perf_counter()
            walked = walker.walk(d, a.new_tokens)
            walk_s = time.perf_counter() - t0
            ag = agreement(walked, dec)
            ci = acceptance_stats(dec)["tau_ci95"]
            rows[dname] = {**ag, "tau_decoded_ci95": ci, "steps": dst["steps"],
                           "accept_length_counts": dst["histogram"],
                           "mismatched_outputs": sum(x.tokens != y.tokens for x, y in zip(plain, dec)),
                           "decoder_s": dst["decode_time_s"], "walk_s": walk_s,
                           "decoder_s_over_walk_s": dst["decode_time_s"] / walk_s}
            print(tname, dname, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[dname].items()},
                  flush=True)
        out["targets"][tname] = rows
        del target, walker
    write_json(Path(a.out), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
