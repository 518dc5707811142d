"""Stage 07: every table and figure from the saved metrics (runs/<preset>, else results/<preset>), the model cards."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..config import FiguresConfig
from ..figures import FIGURES, save_figure, stage_tables, table_markdown
from ..runio import REPO_ROOT, atomic_write_text, finish_run, start_run


@dataclass
class FiguresResult:
    out_dir: Path
    fig_dir: Path
    files: list
    tables_md: str
    metrics: dict


def run_figures(cfg: FiguresConfig, out_dir, runs_root, cards: bool = True) -> FiguresResult:
    """Figures and tables from the metrics under ``runs_root``; model cards for its checkpoints (``cards``)."""
    import matplotlib
    matplotlib.use("Agg")
    import seaborn as sns
    t0 = time.time()
    out = start_run(out_dir, cfg, "07_figures")
    runs_root = Path(runs_root)
    fig_dir = Path(cfg.fig_dir) if cfg.fig_dir else REPO_ROOT / "figures" / cfg.preset
    fig_dir.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="paper")
    files, mds = [], []
    for name, title, df in stage_tables(runs_root):
        md = table_markdown(df, title)
        atomic_write_text(fig_dir / f"{name}.md", md)
        atomic_write_text(fig_dir / f"{name}.tex", df.to_latex(float_format="%.4g", na_rep="–"))
        mds.append(md)
        files += [fig_dir / f"{name}.md", fig_dir / f"{name}.tex"]
    for stage, name, fn in FIGURES:
        if (runs_root / stage / "metrics.json").exists():
            files += save_figure(fn(runs_root / stage), fig_dir, name, cfg.formats)
    from ..scaling import GPU_RUN, scaling_plot
    if cfg.preset in ("smol", "smol-gpu") and (GPU_RUN / "scaling.json").exists():   # the saved GPU run (scaling.py)
        files += save_figure(scaling_plot(GPU_RUN), fig_dir, "fig-drafter-scaling", cfg.formats)
    # the GPU runs' tau against training (the manifest's regime_curve reads) and each gpu_xl_scaling run's data curves
    if cfg.preset == "smol":
        from ..bench_index import readme_sections
        from ..gpu_results import regime_curve_plot
        for show, reads in readme_sections("smol"):
            if show == "regime_curve" and all(p.exists() for p in reads):
                files += save_figure(regime_curve_plot(reads), fig_dir, "fig-regime-curve", cfg.formats)
            if show == "gpu_xl_scaling" and all(p.exists() for p in reads):
                from ..scaling import xl_scaling_plot
                grids = tuple(p for p in reads if p.name.endswith(".grid.json"))
                for run in dict.fromkeys(p.parent for p in reads if p.name.startswith("scaling-")):
                    files += save_figure(xl_scaling_plot(run, grids), fig_dir, f"fig-xl-scaling-{run.name}",
                                         cfg.formats)
    tables_md = "\n".join(mds)
    atomic_write_text(fig_dir / "tables.md", tables_md or "(no stage results found)\n")
    written_cards = []
    if cards:
        from ..cards import write_cards
        written_cards = [str(p) for p in write_cards(runs_root)]
    missing = [s for s in ("01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant", "05_serving",
                           "06_evaluation") if not (runs_root / s / "metrics.json").exists()]
    m = finish_run(out, {"files": [str(p.relative_to(fig_dir)) for p in files], "fig_dir": str(fig_dir),
                         "metrics_root": str(runs_root), "missing_stages": missing, "cards": written_cards}, t0)
    return FiguresResult(out, fig_dir, files, tables_md, m)
