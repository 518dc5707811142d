"""What more data buys the drafter: tables and the figure from the saved GPU run of ``smol-gpu``
(``benchmarks/smol-gpu-h200/``: the scaling sweep of ``benchmarks/drafter_scaling.py`` and the held-out decoding of
the trained drafters with the reference decoder), and the ``smol-gpu-xl`` data curves of ``benchmarks/gpu_xl.sh``
(``XL_SCALING``: real only against real + self-prompted, the decoder's tau walked on held-out real prompts). Read only
from those files; ``qdflash figures`` puts the tables in the README block and the figures in ``figures/<preset>/``."""
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
SOURCES = {"real": "real only", "all": "real + self-prompted"}


def xl_curves(xl_dir: Path) -> dict:
    """``scaling-real.json`` and ``scaling-all.json`` of a ``gpu_xl.sh`` run with ``XL_SCALING`` (real-only and real +
    self-prompted training data), those the run has: {sources: [(point, its walked per-prompt results or None)]} by
    conversations, then steps."""
    from .decode_stats import results_from_json
    out = {}
    for src in SOURCES:
        f = Path(xl_dir) / f"scaling-{src}.json"
        if f.exists():              # a run may have finished one curve only
            pts = sorted((p for p in read_json(f)["points"] if p.get("sources", "all") == src),
                         key=lambda p: (p["conversations"], p["steps"]))
            out[src] = [(p, results_from_json(p["walk_results"]) if "walk_results" in p else None) for p in pts]
    return out


def point_train_s(p: dict) -> float | None:
    """A drafter_scaling.py point's training seconds, or None where the file cannot say: ``train_s`` None (a resumed
    checkpoint whose log carries no seconds), or, before ``call_train_s`` was recorded, a point resumed from a
    checkpoint that an earlier, cut call had finished (it recorded only the resuming call's ~0 s). A partly resumed
    point of those older files (its earlier call's seconds lost) cannot be told apart and shows this call's seconds."""
    if p.get("train_s") is None or ("call_train_s" not in p and p["train_s"] < 1 and p["steps"] > 0):
        return None
    return p["train_s"]


def xl_scaling_trained(xl_dir: Path) -> str:
    """How the curves' points were trained: "N epoch(s) a point" or, for ``drafter_scaling.py --steps``, "N optimizer
    steps a point" (several values joined by "/")."""
    pts = [p for curve in xl_curves(xl_dir).values() for p, _ in curve]
    if any("steps_target" in p for p in pts):
        s = sorted({p["steps"] for p in pts})
        return f"{'/'.join(f'{x:,}' for x in s)} optimizer steps a point"
    e = sorted({p["epochs"] for p in pts})
    return f"{'/'.join(map(str, e))} epoch{'s' * (e != [1])} a point"


def xl_scaling_table(xl_dir: Path) -> pd.DataFrame:
    """One row per point of both curves: training conversations, epochs, optimizer steps, training seconds, the decoder's
    tau walked on the held-out real prompts (95% CI over prompts) and the block-level estimate (CI over conversations)."""
    rows = []
    for src, curve in xl_curves(xl_dir).items():
        for p, _ in curve:
            rows.append({"training data": SOURCES[src], "conversations": p["conversations"], "epochs": p["epochs"],
                         "steps": p["steps"], "train s": point_train_s(p),
                         "tau (walked)": round(p["tau_walk"], 3) if "tau_walk" in p else None,
                         "95% CI": ci_text(p, "tau_walk_ci95") if "tau_walk" in p else None,
                         "tau estimate (block)": round(p["tau_est"], 3), "estimate CI": ci_text(p, "tau_est_ci95")})
    return pd.DataFrame(rows).sort_values(["training data", "conversations"]).set_index(["training data", "conversations"])


def _label(src: str, p: dict) -> str:
    return f"{SOURCES[src]}, {p['conversations']:,} conversations, {p['steps']:,} steps"


def xl_scaling_pairs(xl_dir: Path) -> list[dict]:
    """Paired differences of the walked tau on the same held-out real prompts (a minus b; a, b: each point's label):
    at each size and number of steps both curves have, real + self-prompted minus real only (what swapping real
    conversations for the target's own costs); within each curve, of the points trained the same number of steps, the
    largest minus the smallest (what more conversations add at equal training); then, where the real + self-prompted
    curve reaches further than the real-only one, its largest point minus the largest real-only one (what the
    self-prompted conversations add on top of every real one), of those two sizes the pair closest in steps. Each pair
    also carries its ``kind`` (those three: "self-prompted vs real", "more data", "largest") and both points."""
    from .decode_stats import paired_bootstrap
    c = xl_curves(xl_dir)
    walked = {src: [(p, r) for p, r in c.get(src, []) if r is not None] for src in SOURCES}
    real, allp = walked["real"], walked["all"]
    by_real = {(p["conversations"], p["steps"]): (p, r) for p, r in real}
    pairs = []
    for p, r in allp:
        q = by_real.get((p["conversations"], p["steps"]))
        if q is not None:
            pairs.append({"a": _label("all", p), "b": _label("real", q[0]), "kind": "self-prompted vs real",
                          "a_point": p, "b_point": q[0], **paired_bootstrap(r, q[1])})
    for src, curve in walked.items():
        for steps in sorted({p["steps"] for p, _ in curve}):
            same = [(p, r) for p, r in curve if p["steps"] == steps]
            (p, r), (q, rq) = max(same, key=lambda x: x[0]["conversations"]), min(same, key=lambda x: x[0]["conversations"])
            if p["conversations"] > q["conversations"]:
                pairs.append({"a": _label(src, p), "b": _label(src, q), "kind": "more data", "sources": src,
                              "a_point": p, "b_point": q, **paired_bootstrap(r, rq)})
    if real and allp:
        na, nr = max(p["conversations"] for p, _ in allp), max(p["conversations"] for p, _ in real)
        if na > nr:
            (p, r), (q, rq) = min(((x, y) for x in allp if x[0]["conversations"] == na
                                   for y in real if y[0]["conversations"] == nr),
                                  key=lambda xy: abs(xy[0][0]["steps"] - xy[1][0]["steps"]))
            pairs.append({"a": _label("all", p), "b": _label("real", q), "kind": "largest",
                          "a_point": p, "b_point": q, **paired_bootstrap(r, rq)})
    return pairs


def stage02_point(grid: Path) -> tuple[dict, list]:
    """Another ``gpu_xl.sh`` run's stage-02 pretrained drafter as a curve point: its decoded grid on the FP target
    (``tau-pretrain-fp.grid.json``; drafter ``pretrain``) beside that run's ``metrics-02_drafter_pretrain.json`` (steps),
    ``metrics-00_data.json`` (conversations: all of the run's) and ``manifest-00_data.json`` (its sources: "all" where
    the training split holds self-prompted rows, else "real"). Returns (point, per-prompt results); the point's ``run``
    names the run folder."""
    from .decode_stats import results_from_json
    run = Path(grid).parent
    m2, m0 = read_json(run / "metrics-02_drafter_pretrain.json"), read_json(run / "metrics-00_data.json")
    man = run / "manifest-00_data.json"
    by_source = read_json(man).get("rows_by_source", {}).get("train", {}) if man.exists() else {}
    res = results_from_json(read_json(grid)["results"]["pretrain"])
    return {"run": run.name, "conversations": m0["n_train"], "steps": m2["train"]["steps"],
            "sources": "all" if by_source.get("magpie") or not by_source else "real"}, res


def _stage02_points(xl_dir: Path, grids) -> list[tuple[dict, list]]:
    """``stage02_point`` of each grid trained as many steps as some walked point of ``xl_dir``'s curves, checked
    against those points: the runs must share the data split and the fp32 target, which lossless decoding shows in
    the outputs (each prompt's tokens equal to the target's own greedy answer, so equal across drafters); a grid whose
    outputs differ (another split or target) raises."""
    walked = [(p, r) for c in xl_curves(xl_dir).values() for p, r in c if r is not None]
    steps = {p["steps"] for p, _ in walked}
    out = []
    for g in grids:
        q, rq = stage02_point(g)
        if q["steps"] not in steps:
            continue
        r = walked[0][1]
        if len(r) != len(rq) or any(x.tokens != y.tokens for x, y in zip(r, rq)):
            raise ValueError(f"{g}: its prompts or target differ from {xl_dir}'s walked points "
                             f"(the outputs of a lossless decoder must be equal)")
        out.append((q, rq))
    return out


def xl_cross_run_pairs(xl_dir: Path, grids: list[Path]) -> list[dict]:
    """Each other run's stage-02 pretrained drafter (``stage02_point``, checked by ``_stage02_points``) minus every
    walked curve point trained the same number of steps, paired on the held-out prompts (kind "cross-run", with both
    points). Across runs: GPU nondeterminism and the other run's code path (stage 02, not drafter_scaling.py) are part
    of the difference; its drafter was decoded, the points walked (the same tau for a lossless greedy decoder)."""
    from .decode_stats import paired_bootstrap
    pairs = []
    for q, rq in _stage02_points(xl_dir, grids):
        for src, curve in xl_curves(xl_dir).items():
            for p, r in curve:
                if r is not None and p["steps"] == q["steps"]:
                    pairs.append({"a": f"{q['run']}'s stage 02, {_label(q['sources'], q)}", "b": _label(src, p),
                                  "kind": "cross-run", "a_point": q, "b_point": p, **paired_bootstrap(rq, r)})
    return pairs


def xl_scaling_plot(xl_dir: Path, grids: tuple = ()):
    """The decoder's tau (walked, 95% CI over the held-out real prompts) against training conversations, real only
    against real + self-prompted (the second curve's walked points drawn 3% to the right, so that equal sizes do not
    hide each other); the block-level estimates dashed; hollow: another run's stage-02 drafter (``grids``,
    ``stage02_point``) trained as many steps as a point of the curves (others are left out)."""
    import matplotlib.pyplot as plt

    from .decode_stats import acceptance_stats
    fig, ax = plt.subplots(figsize=(5, 3.8))
    curves = xl_curves(xl_dir)
    for i, (src, curve) in enumerate(curves.items()):
        pts = [p for p, _ in curve]
        x = [p["conversations"] for p in pts]
        if all("tau_walk" in p for p in pts):
            y = [p["tau_walk"] for p in pts]
            err = [[p["tau_walk"] - p["tau_walk_ci95"][0] for p in pts], [p["tau_walk_ci95"][1] - p["tau_walk"] for p in pts]]
            ax.errorbar([v * 1.03 ** i for v in x], y, yerr=err, marker="o", capsize=3, c=f"C{i}",
                        label=f"{SOURCES[src]} (decoder's tau, walked)")
        ax.plot(x, [p["tau_est"] for p in pts], ls="--", marker=".", c=f"C{i}", alpha=0.6,
                label=f"{SOURCES[src]} (block estimate)")
    for q, rq in _stage02_points(xl_dir, grids):   # another run's stage-02 drafter at the curves' steps: hollow
        colour = f"C{list(curves).index(q['sources']) if q['sources'] in curves else len(curves)}"
        st = acceptance_stats(rq)
        ax.errorbar([q["conversations"]], [st["tau"]], yerr=[[st["tau"] - st["tau_ci95"][0]], [st["tau_ci95"][1] - st["tau"]]],
                    marker="o", mfc="none", capsize=3, c=colour, ls="none",
                    label=f"{q['run']}'s stage 02 ({SOURCES[q['sources']]}, decoded)")
    ax.set_xscale("log")
    ax.set_xlabel(f"training conversations\n({xl_scaling_trained(xl_dir)}, smol-gpu-xl drafter)")
    ax.set_ylabel("tau (bonus token counted)")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)
    fig.tight_layout()
    return fig
