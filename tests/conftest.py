"""Shared fixtures. ``tiny_pipeline`` runs every numbered notebook on the ``tiny`` preset with papermill (the same
path as ``make reproduce PRESET=tiny``) once per session; stage tests then inspect its artifacts."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STAGE_OF = {"00_data_prep": "00_data", "01_qad": "01_qad", "02_drafter_pretrain": "02_drafter_pretrain",
            "03_drafter_finetune": "03_drafter_finetune", "04_drafter_quant": "04_drafter_quant",
            "05_serving": "05_serving", "06_evaluation": "06_evaluation", "07_figures": "07_figures"}


def pytest_collection_modifyitems(items):
    """Every test of the papermill-executed tiny pipeline is ``notebooks`` and ``slow`` (the session fixture runs all
    eight notebooks, minutes), so ``pytest -m "not slow"`` never starts it; other long tests carry ``slow`` in their
    own files."""
    for item in items:
        if "tiny_pipeline" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.notebooks)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    import papermill as pm
    reuse = os.environ.get("QDFLASH_TEST_RUNS")     # developer shortcut: reuse an executed tiny pipeline
    runs = Path(reuse) if reuse else tmp_path_factory.mktemp("runs_tiny")
    figs = runs / "figures"
    executed = {}
    for nb in NOTEBOOKS:
        if reuse and (runs / STAGE_OF[nb.stem] / "metrics.json").exists():
            executed[STAGE_OF[nb.stem]] = runs / STAGE_OF[nb.stem] / "executed.ipynb"
            continue
        stage = STAGE_OF[nb.stem]
        (runs / stage).mkdir(parents=True, exist_ok=True)
        params = {"PRESET": "tiny", "RUNS": str(runs)}
        if stage == "07_figures":
            params["OVERRIDES"] = {"fig_dir": str(figs)}
        out = runs / stage / "executed.ipynb"
        pm.execute_notebook(str(nb), str(out), parameters=params, kernel_name="python3", cwd=str(nb.parent),
                            progress_bar=False)
        executed[stage] = out
    return {"runs": runs, "figures": figs, "executed": executed}


@pytest.fixture(scope="session")
def tiny_target():
    from qdflash.models import load_model, load_tokenizer
    return load_model("tiny", "float64"), load_tokenizer("tiny")


@pytest.fixture
def one_thread():
    """One intra-op thread: the tiny model's forwards take ~1 ms, and on a shared 2-core machine two threads spin
    far longer than that (used by the modules that run many tiny forwards)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
