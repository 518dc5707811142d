"""Regenerate the numbered notebooks: a short narrative (what the stage does, what to look at), the parameters
(PRESET, RUNS, OVERRIDES), one ``run_stage`` call, and the stage's key table and plot inline.

    python notebooks/_generate.py            # rewrite the notebooks
    python notebooks/_generate.py --check    # exit 1 if a committed notebook differs from what this writes

Notebooks that walk their stage step by step (issue 36: 00_data_prep, 01_qad, 02_drafter_pretrain,
03_drafter_finetune, 04_drafter_quant, 05_serving, 06_evaluation, 07_figures) are written by hand and not generated here. The files are written in nbstripout's clean form (no outputs, cell ids "0", "1", ...), so git's nbstripout filter
leaves them unchanged and an executed checkout stays clean.
"""
import sys
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent
PARAMS = ('PRESET = "smol"   # tiny | smol | full\nRUNS = None        # runs root; default runs/<PRESET>\n'
          'OVERRIDES = {}     # config overrides, e.g. {"steps": 10}')
RUN = "from qdflash.pipeline import run_stage\n\nres = run_stage({stage!r}, PRESET, RUNS, OVERRIDES)"

# name: (stage, narrative before the run, [(markdown, code), ...] shown after it)
NOTEBOOKS = {
}


def build(name: str, stage: str, intro: str, after: list) -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    p = nbf.v4.new_code_cell(PARAMS)
    p.metadata["tags"] = ["parameters"]
    cells = [nbf.v4.new_markdown_cell(intro), p, nbf.v4.new_code_cell(RUN.format(stage=stage))]
    for md, code in after:
        cells += [nbf.v4.new_markdown_cell(md), nbf.v4.new_code_cell(code)]
    nb.cells = cells
    for i, c in enumerate(nb.cells):   # nbstripout's form: sequential ids
        c["id"] = str(i)
    return nb


def render(name: str) -> str:
    stage, intro, after = NOTEBOOKS[name]
    return nbf.writes(build(name, stage, intro, after)) + "\n"


if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    stale = []
    for k in NOTEBOOKS:
        path = HERE / f"{k}.ipynb"
        text = render(k)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("differ from notebooks/_generate.py: " + ", ".join(stale) + " (run `python notebooks/_generate.py`)")
        sys.exit(1)
