"""What more data buys the drafter: tables and the figure from the saved GPU run of ``smol-gpu``
(``benchmarks/smol-gpu-h200/``: the scaling sweep of ``benchmarks/drafter_scaling.py`` and the held-out decoding of
the trained drafters with the reference decoder). Read only from those files; ``qdflash figures`` puts the tables in
the README block and the figure in ``figures/<preset>/``."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import bench_index
from .decode_stats import ci_text
from .runio import read_json

GPU_RUN = bench_index.folder("smol-gpu-h200")


def scaling_table(run_dir: Path = GPU_RUN) -> pd.DataFrame:
    """One row per sweep point: conversations, epochs, steps, training time, the block-level tau estimate."""
    s = read_json(Path(run_dir) / "scaling.json")
    rows = [{"conversations": p["conversations"], "epochs": p["epochs"], "steps": p["steps"],
             "train s": p["train_s"], "response tokens": p["response_tokens"], "tau estimate": p["tau_est"],
             "95% CI": ci_text(p, "tau_est_ci95"), "r1": p["per_position"][0]} for p in s["points"]]
    return pd.DataFrame(rows).sort_values(["epochs", "conversations"]).set_index(["conversations", "epochs"])


def decode_table(run_dir: Path = GPU_RUN) -> pd.DataFrame:
    """True tau of the trained drafters on held-out prompts (reference decoder, greedy, fp32), with the bootstrap
    interval over prompts, against the same drafter's block-level estimate where the sweep has that point."""
    run_dir = Path(run_dir)
    rows = []
    fp = read_json(run_dir / "eval-fp.json")
    for name, st in fp["grid"].items():
        if name == "plain":
            continue
        rows.append({"target": "FP target (fp32 decode)", "drafter": name, "prompts": fp["prompts"],
                     "tau": st["tau"], "95% CI": ci_text(st), "speedup (eager, batch 1)": st.get("speedup"),
                     "mismatches": st.get("mismatched_outputs")})
    q = read_json(run_dir / "eval-qad-twostage.json")
    rows.append({"target": "QAD target (its dense twin, fp32 decode)", "drafter": q["drafter"], "prompts": q["prompts"],
                 "tau": q["stats"]["tau"], "95% CI": ci_text(q["stats"]),
                 "speedup (eager, batch 1)": None, "mismatches": None})
    return pd.DataFrame(rows).set_index(["target", "drafter"])


def scaling_plot(run_dir: Path = GPU_RUN):
    """tau estimate against conversations (at the preset's epochs) and against epochs (all conversations), with
    95% intervals; the reference decoder's true tau of the pretrained drafter marked where it was measured."""
    import matplotlib.pyplot as plt
    s = read_json(Path(run_dir) / "scaling.json")
    pts = s["points"]
    top = max(p["conversations"] for p in pts)
    main_ep = s["config"]["epochs"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
    for ax, sel, key, label in ((a, [p for p in pts if p["epochs"] == main_ep], "conversations",
                                 f"training conversations ({main_ep} epochs)"),
                                (b, [p for p in pts if p["conversations"] == top], "epochs",
                                 f"epochs ({top} conversations)")):
        sel = sorted(sel, key=lambda p: p[key])
        x = [p[key] for p in sel]
        y = [p["tau_est"] for p in sel]
        err = [[p["tau_est"] - p["tau_est_ci95"][0] for p in sel], [p["tau_est_ci95"][1] - p["tau_est"] for p in sel]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label="block-level estimate")
        ax.set_xlabel(label)
    a.set_xscale("log")
    a.set_ylabel("tau (bonus token counted)")
    fp = Path(run_dir) / "eval-fp.json"
    if fp.exists():
        st = read_json(fp)["grid"].get("pretrain")
        if st:
            for ax, x in ((a, top), (b, main_ep)):
                lo, hi = st["tau_ci95"]
                ax.errorbar([x], [st["tau"]], yerr=[[st["tau"] - lo], [hi - st["tau"]]], marker="s", c="C3",
                            capsize=3, ls="none", label="reference decoder (32 prompts x 128)")
    a.legend(fontsize=7)
    fig.tight_layout()
    return fig


def cpu_minutes_table(smol_root: Path, run_dir: Path = GPU_RUN) -> pd.DataFrame:
    """What the GPU sweep's points would cost on this CPU: the response tokens of each point regenerated at stage 00's
    measured vLLM output rate, and trained for the point's epochs at stage 02's measured drafter rate, both from the
    ``smol`` run under ``smol_root`` (response tokens trained per second: epochs x train conversations x mean response
    tokens / train time). A projection from two measured rates, not a run: the CPU preset trains 16 anchors per row
    (the sweep 64) and regenerates 448 prompts (a larger batch-saturated run is faster per token)."""
    s = read_json(Path(run_dir) / "scaling.json")
    d = read_json(Path(smol_root) / "00_data" / "metrics.json")
    t = read_json(Path(smol_root) / "02_drafter_pretrain" / "metrics.json")["train"]
    regen_rate = d["regeneration"]["output_tokens_per_s"]
    train_rate = t["epochs"] * d["n_train"] * d["mean_response_tokens"] / t["train_s"]
    rows = [{"conversations": p["conversations"], "epochs": p["epochs"], "tau estimate": p["tau_est"],
             "CPU min: regenerate": p["response_tokens"] / regen_rate / 60,
             "CPU min: train": p["epochs"] * p["response_tokens"] / train_rate / 60} for p in s["points"]]
    df = pd.DataFrame(rows)
    df["CPU min: total"] = df["CPU min: regenerate"] + df["CPU min: train"]
    return df.sort_values(["epochs", "conversations"]).set_index(["conversations", "epochs"]).round(
        {"tau estimate": 3, "CPU min: regenerate": 0, "CPU min: train": 0, "CPU min: total": 0})


# ----------------------------------------------------------------------------------------- smol-gpu-xl curves
def _xl_curves(xl_dir: Path) -> dict:
    """``scaling-real.json`` and ``scaling-all.json`` of a ``gpu_xl.sh`` run with ``XL_SCALING`` (real-only and real +
    self-prompted training data), those the run has: {sources: (points, each walked point's per-prompt results by its
    name)}."""
    from .decode_stats import results_from_json
    out = {}
    for src in ("real", "all"):
        f = Path(xl_dir) / f"scaling-{src}.json"
        if not f.exists():          # a run that finished one curve only
            continue
        pts = [p for p in read_json(f)["points"] if p.get("sources", "all") == src]
        out[src] = (pts, {f"{src}-n{p['conversations']}-e{p['epochs']}": results_from_json(p["walk_results"])
                          for p in pts if "walk_results" in p})
    return out


def xl_scaling_table(xl_dir: Path) -> pd.DataFrame:
    """One row per point of both curves: training conversations, epochs, optimizer steps, training seconds, the decoder's
    tau walked on the held-out real prompts (95% CI over prompts) and the block-level estimate (CI over conversations)."""
    rows = []
    for src, (pts, _) in _xl_curves(xl_dir).items():
        for p in pts:
            rows.append({"training data": "real only" if src == "real" else "real + self-prompted",
                         "conversations": p["conversations"], "epochs": p["epochs"], "steps": p["steps"],
                         "train s": p["train_s"], "tau (walked)": round(p["tau_walk"], 3) if "tau_walk" in p else None,
                         "95% CI": ci_text(p, "tau_walk_ci95") if "tau_walk" in p else None,
                         "tau estimate (block)": round(p["tau_est"], 3), "estimate CI": ci_text(p, "tau_est_ci95")})
    return pd.DataFrame(rows).sort_values(["training data", "conversations"]).set_index(["training data", "conversations"])


def xl_scaling_pairs(xl_dir: Path) -> list[dict]:
    """Paired differences of the walked tau on the same held-out real prompts: at each size both curves reached, real +
    self-prompted minus real only (what swapping real conversations for the target's own costs); and the largest
    real + self-prompted point minus the largest real-only one (what the self-prompted conversations add on top of every
    real one)."""
    from .decode_stats import paired_bootstrap
    c = _xl_curves(xl_dir)
    (real, greal), (allp, gall) = c.get("real", ([], {})), c.get("all", ([], {}))
    name = lambda src, p: f"{src}-n{p['conversations']}-e{p['epochs']}"      # noqa: E731 (drafter_scaling's names)
    by_real = {p["conversations"]: p for p in real}
    pairs = []
    for p in sorted(allp, key=lambda p: p["conversations"]):
        q = by_real.get(p["conversations"])
        if q is not None and name("all", p) in gall and name("real", q) in greal:
            pairs.append({"a": f"real + self-prompted, {p['conversations']:,}", "b": f"real only, {q['conversations']:,}",
                          **paired_bootstrap(gall[name("all", p)], greal[name("real", q)])})
    if real and allp:
        p, q = max(allp, key=lambda p: p["conversations"]), max(real, key=lambda p: p["conversations"])
        if p["conversations"] != q["conversations"] and name("all", p) in gall and name("real", q) in greal:
            pairs.append({"a": f"real + self-prompted, {p['conversations']:,}", "b": f"real only, {q['conversations']:,}",
                          **paired_bootstrap(gall[name("all", p)], greal[name("real", q)])})
    return pairs


def xl_scaling_plot(xl_dir: Path):
    """The decoder's tau (walked, 95% CI over the held-out real prompts) against training conversations, real only
    against real + self-prompted, at the epochs of the sweep; the block-level estimates dashed."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for i, (src, (pts, _)) in enumerate(_xl_curves(xl_dir).items()):
        pts = sorted(pts, key=lambda p: p["conversations"])
        label = "real only" if src == "real" else "real + self-prompted"
        x = [p["conversations"] for p in pts]
        if all("tau_walk" in p for p in pts):
            y = [p["tau_walk"] for p in pts]
            err = [[p["tau_walk"] - p["tau_walk_ci95"][0] for p in pts], [p["tau_walk_ci95"][1] - p["tau_walk"] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, c=f"C{i}", label=f"{label} (decoder's tau, walked)")
        ax.plot(x, [p["tau_est"] for p in pts], ls="--", marker=".", c=f"C{i}", alpha=0.6,
                label=f"{label} (block estimate)")
    allpts = [p for pts, _ in _xl_curves(xl_dir).values() for p in pts]
    ep = sorted({p["epochs"] for p in allpts})
    trained = (f"{ep[0]} epoch{'s' * (ep[0] != 1)}" if len(ep) == 1        # else drafter_scaling.py --steps
               else f"about {round(sum(p['steps'] for p in allpts) / len(allpts)):,} steps each")
    ax.set_xscale("log")
    ax.set_xlabel(f"training conversations ({trained}, smol-gpu-xl drafter)")
    ax.set_ylabel("tau (bonus token counted)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
