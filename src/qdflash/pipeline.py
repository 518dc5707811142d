"""The stage DAG: names, run directories and upstream wiring, shared by the CLI, the notebooks and the tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .runio import runs_dir

STAGES = ["00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant", "05_serving",
          "06_evaluation", "07_figures"]


def stage_dir(preset: str, stage: str, runs: str | Path | None = None) -> Path:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {STAGES}")
    return (Path(runs) if runs else runs_dir(preset)) / stage


def run_stage(stage: str, preset: str, runs: str | Path | None = None, overrides: dict[str, Any] | None = None,
              progress: bool = True):
    """Run one stage with its preset config (plus overrides) on the standard run directories."""
    from .config import (DataConfig, DrafterConfig, DrafterQuantConfig, EvalConfig, FiguresConfig, QADConfig,
                         load_config)
    ov = dict(overrides or {})
    d = lambda s: stage_dir(preset, s, runs)  # noqa: E731
    if stage == "00_data":
        from .data import run_data
        return run_data(load_config(DataConfig, preset, **ov), d(stage), progress)
    if stage == "01_qad":
        from .qad import run_qad
        return run_qad(load_config(QADConfig, preset, **ov), d(stage), d("00_data"), progress)
    if stage == "02_drafter_pretrain":
        from .drafter_train import run_drafter_pretrain
        return run_drafter_pretrain(load_config(DrafterConfig, preset, **ov), d(stage), d("00_data"), progress)
    if stage == "03_drafter_finetune":
        from .drafter_train import run_drafter_finetune
        return run_drafter_finetune(load_config(DrafterConfig, preset, **ov), d(stage), d("00_data"),
                                    d("02_drafter_pretrain"), d("01_qad"), progress)
    if stage == "04_drafter_quant":
        from .drafter_quant import run_drafter_quant
        return run_drafter_quant(load_config(DrafterQuantConfig, preset, **ov), d(stage), d("00_data"),
                                 d("01_qad"), d("03_drafter_finetune"), progress)
    if stage == "05_serving":
        from .serving import run_serving
        return run_serving(preset, d(stage), d("00_data"), d("01_qad"), d("03_drafter_finetune"),
                           d("04_drafter_quant"), **ov)
    if stage == "06_evaluation":
        from .evaluation import run_evaluation
        return run_evaluation(load_config(EvalConfig, preset, **ov), d(stage), d("00_data"), d("01_qad"),
                              d("03_drafter_finetune"), progress)
    if stage == "07_figures":
        from .figures import run_figures
        return run_figures(load_config(FiguresConfig, preset, **ov), d(stage), d(stage).parent)
    raise ValueError(f"unknown stage {stage!r}")
