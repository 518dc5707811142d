"""The numbered stages and what each reads: the DAG that ``make reproduce``, the CLI, the pipeline and the report
code agree on (no other imports, so report code can name stages without importing the pipeline)."""
from __future__ import annotations

STAGES = ["00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant", "05_serving",
          "06_evaluation", "07_figures"]
UPSTREAM = {"00_data": (), "01_qad": ("00_data",), "02_drafter_pretrain": ("00_data",),
            "03_drafter_finetune": ("00_data", "02_drafter_pretrain", "01_qad"),
            "04_drafter_quant": ("00_data", "01_qad", "03_drafter_finetune"),
            "05_serving": ("00_data", "01_qad", "03_drafter_finetune", "04_drafter_quant"),
            "06_evaluation": ("00_data", "01_qad", "03_drafter_finetune"), "07_figures": ()}


class StageError(RuntimeError):
    """Bad input to a stage (unknown stage, missing upstream, corrupt checkpoint, run dir of another config)."""
