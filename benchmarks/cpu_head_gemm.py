"""The drafter's output head on the CPU (issue 35): the smol head scores a 7-row draft block against the 49,152-token
vocabulary, and MKL's GEMM for ``F.linear(h, W)`` (W [V, H]) was 40 ms of the drafter's 46 ms step on the AMD EPYC.
``drafter.head_logits`` computes the same products as ``(W @ h.T).T``.

Part 1, the GEMM: for 1-16 rows of the smol head's shape (fp32, random values), the median time of ``F.linear`` and of
the transposed order over interleaved repetitions, and next to them the floor of reading W once at this machine's
copy bandwidth (measured here by summing W). Part 2, with ``--runs``: the walk of the finetuned drafters of a smol run
(``walk.Walker``, the stage 03/04 acceptance path) on its held-out prompts, both orders interleaved, accept lengths
compared prompt by prompt.

    .venv/bin/python benchmarks/cpu_head_gemm.py --runs runs/smol --out benchmarks/cpu-head-gemm/cpu-head-gemm.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def _median_ms(fns: dict, reps: int, inner: int) -> dict:
    """Median ms per call of each function, the functions interleaved within each repetition."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()                                                     # warm-up
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                f()
            times[k].append((time.perf_counter() - t) / inner * 1e3)
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)} for k, v in times.items()}


def gemm_part(reps: int) -> dict:
    import torch
    import torch.nn.functional as F
    V, H = 49152, 576
    g = torch.Generator().manual_seed(0)
    W = torch.randn(V, H, generator=g)
    read = _median_ms({"sum": lambda: W.sum()}, reps, 3)["sum"]["median_ms"]
    bw = W.numel() * 4 / (read / 1e3)                           # reading W once (a sum: no output to write)
    rows = []
    for m in (1, 2, 4, 7, 8, 12, 16):
        h = torch.randn(m, H, generator=g)
        t = _median_ms({"F.linear": lambda: F.linear(h, W), "(W @ h.T).T": lambda: (W @ h.t()).t()}, reps, 5)
        err = float((F.linear(h, W) - (W @ h.t()).t()).abs().max())
        rows.append({"rows": m, **{f"{k} {s}": v[s] for k, v in t.items() for s in ("median_ms", "min_ms", "max_ms")},
                     "ratio": t["F.linear"]["median_ms"] / t["(W @ h.T).T"]["median_ms"], "max_abs_diff": err,
                     "floor_ms (read W once)": W.numel() * 4 / bw * 1e3})
    return {"shape": [V, H], "dtype": "float32", "read_bandwidth_gbs": bw / 1e9, "reps": reps, "rows": rows}


def walk_part(runs: Path, n_prompts: int, new_tokens: int, reps: int) -> dict:
    import torch

    import qdflash.drafter as D
    from qdflash.drafter import load_drafter
    from qdflash.drafter_train import eval_prompts
    from qdflash.models import load_model, load_tokenizer
    from qdflash.runio import read_json
    from qdflash.speculative import decode_prompts
    from qdflash.walk import Walker
    m1, m3 = read_json(runs / "01_qad" / "metrics.json"), read_json(runs / "03_drafter_finetune" / "metrics.json")
    target = load_model(str(runs / "01_qad" / m1["names"]["twin"]), "float32", "cpu")
    eos = load_tokenizer(str(runs / "01_qad" / m1["names"]["qad"])).eos_token_id
    prompts = eval_prompts(runs / "00_data", n_prompts)
    plain, _ = decode_prompts(target, prompts, new_tokens, None, eos_token_id=eos)
    walker = Walker(target, prompts, plain, eos)
    out = {}
    default = D.HEAD_GEMM_MAX_ROWS
    for name, rel in m3["drafters"].items():
        drafter = load_drafter(runs / "03_drafter_finetune" / rel)        # an absolute rel stays itself
        walker.walk(drafter, new_tokens)                          # target features once, warm-up
        ms = {"F.linear": [], "(W @ h.T).T": []}
        lengths = {}
        for _ in range(reps):
            for order, rows in (("(W @ h.T).T", default), ("F.linear", 0)):
                D.HEAD_GEMM_MAX_ROWS = rows
                res = walker.walk(drafter, new_tokens)
                ms[order].append(1e3 * sum(r.draft_time_s for r in res) / sum(len(r.accept_lengths) for r in res))
                lengths[order] = [r.accept_lengths for r in res]
        D.HEAD_GEMM_MAX_ROWS = default
        out[name] = {**{f"{k} median ms/step": statistics.median(v) for k, v in ms.items()},
                     **{f"{k} ms/step all reps": v for k, v in ms.items()},
                     "prompts_identical": sum(a == b for a, b in zip(*lengths.values())), "prompts": len(prompts)}
    return {"target": "QAD W4A16 (fp32 twin)", "prompts": n_prompts, "new_tokens": new_tokens, "reps": reps,
            "drafters": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, help="a finished smol run (stages 00-03) for the walk part")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gemm-only", action="store_true", help="redo part 1 only, keeping --out's walk part")
    a = ap.parse_args(argv)
    import torch

    from qdflash.runio import provenance, write_json
    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    res = {"provenance": provenance(), "command": " ".join(sys.argv), "torch_threads": torch.get_num_threads(),
           "gemm": gemm_part(a.reps)}
    if a.gemm_only and a.out.exists():
        old = json.loads(a.out.read_text())
        res["walk"], res["walk_command"], res["walk_provenance"] = old["walk"], old["command"], old["provenance"]
    elif a.runs:
        res["walk"] = walk_part(a.runs, a.prompts, a.new, max(5, a.reps // 2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, res)
    for r in res["gemm"]["rows"]:
        print(f"rows {r['rows']:2d}: F.linear {r['F.linear median_ms']:.2f} ms, (W @ h.T).T "
              f"{r['(W @ h.T).T median_ms']:.2f} ms (x{r['ratio']:.1f}), floor {r['floor_ms (read W once)']:.2f} ms")
    for k, v in res.get("walk", {}).get("drafters", {}).items():
        print(k, {kk: vv for kk, vv in v.items() if "all reps" not in kk})
    return 0


if __name__ == "__main__":
    sys.exit(main())
