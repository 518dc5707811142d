"""The steps of the stepped notebooks 05_serving, 06_evaluation and 07_figures (issue 36) ran in the executed tiny
notebooks (the ``tiny_pipeline`` fixture: papermill, as ``make reproduce``) and showed what they are for, read from
what the stage saved; their step cells (all but the stage call) stay cheap and no stderr wall comes before the first
result."""
import json
import re

import pytest
from nb_outputs import code_cell as _cell, data_of as _data, executed as _read, stdout_of as _stdout

pytestmark = pytest.mark.slow


def _steps_cheap_and_quiet(nb, name: str):
    """Step cells (all but the stage call) under 60 s together; at most a few stderr lines up to the stage's result."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    steps_s = sum(c.metadata.get("papermill", {}).get("duration") or 0 for c in code if "run_stage(" not in c.source)
    assert steps_s < 60, (name, steps_s)
    upto = code[: next(i for i, c in enumerate(code) if "run_stage(" in c.source) + 1]
    err = [ln for c in upto for o in c.get("outputs", []) if o.get("output_type") == "stream"
           and o.get("name") == "stderr" for ln in o.get("text", "").splitlines() if ln.strip()]
    assert len(err) <= 5, (name, err[:20])
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"], name


def test_serving_notebook_shows_the_command_and_one_request(tiny_pipeline):
    nb = _read(tiny_pipeline, "05_serving")
    runs = tiny_pipeline["runs"]
    metrics = json.loads((runs / "05_serving" / "metrics.json").read_text())
    cmd = _stdout(nb, "plugin_env = ")
    assert "QDFLASH_VLLM_PLUGIN=1 " in cmd and re.search(r"\S*vllm serve \S+qad-w4a16", cmd), cmd
    spec = re.search(r"--speculative-config '(.+)'", cmd)
    assert spec, cmd
    spec = json.loads(spec[1])
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == metrics["block_size"] - 1, spec
    assert "drafter-w4a16" in spec["model"], spec
    assert _data(nb, 'res.metrics["sites"]', "text/html"), "no plugin site table"

    req = _stdout(nb, 'prompt = read_json(work / "job-offline.json")')
    assert re.search(r"prompt \(\d+ tokens\): ", req) and "speculative answer: " in req, req
    assert re.search(r"plain answer identical: (True|False)", req), req
    counters = _stdout(nb, 'r, p = spec_run["per_prompt"][0]')
    m = re.search(r"drafts (\d+) \(up to (\d+) tokens each\), accepted (\d+), tau (\d+\.\d+)", counters)
    assert m, counters
    drafts, k, accepted, tau = int(m[1]), int(m[2]), int(m[3]), float(m[4])
    assert drafts > 0 and k == metrics["block_size"] - 1 and accepted <= drafts * k, counters
    assert tau == pytest.approx(1 + accepted / drafts, abs=1e-3)
    # the numbers shown are the saved request's (the worker's per-request counter deltas)
    saved = json.loads((runs / "05_serving" / "work" / "result-offline.json").read_text())["qad-w4a16"]["per_prompt"][0]
    assert (drafts, accepted) == (saved["drafts"], saved["accepted"]) and sum(saved["accepted_per_pos"]) == accepted
    table = _data(nb, 'r, p = spec_run["per_prompt"][0]', "text/plain")
    assert table and "draft position" in table[0] and "accepted" in table[0], table

    assert _data(nb, "serving_table(res.out_dir)", "text/html")
    assert _data(nb, 'ax.set(xlabel="draft position"', "image/png"), "no per-position plot"
    load = _data(nb, "load_table(res.out_dir)", "text/plain")
    assert load and "clients" in load[0] and "p50_s" in load[0], load
    assert "400" in load[1] and "still_serving_after_faults" in load[1], load
    _steps_cheap_and_quiet(nb, "05_serving")


def test_evaluation_notebook_shows_an_item_as_the_model_reads_it(tiny_pipeline):
    nb = _read(tiny_pipeline, "06_evaluation")
    tasks = tiny_pipeline["runs"] / "06_evaluation" / "tasks"
    item = _stdout(nb, "task.fewshot_context(doc, 0")
    row = json.loads((tasks / "mc_add.jsonl").read_text().splitlines()[0])
    head = re.search(r"local_mmlu_pro_add, item 0 \((\d+) tokens\):\n(.+?)\ntarget: '(\w)'", item, re.S)
    assert head and int(head[1]) > 0, item
    text = head[2]
    assert f"Question: {row['question']}" in text and "the answer is (X)" in text, text
    assert all(f"{'ABCDEFGHIJ'[i]}. {o}" in text for i, o in enumerate(row["options"])), text
    assert head[3] == row["answer"], item
    assert not text.startswith("The following") and text.rstrip().endswith("assistant"), text   # chat-templated
    ll = _stdout(nb, "for qname in quality:")
    for task in ("local_agreement", "local_rg_products"):
        assert re.search(rf"{task}, item 0, context:\n", ll), ll
    right = re.findall(r"choices: (\[.+\]); right: '(.+)'", ll)
    assert len(right) == 2 and all(r in c for c, r in right), ll

    assert _data(nb, "gate_table(res.out_dir)", "text/html")
    q = _data(nb, "qt = quality_table(", "text/plain")
    assert q and "x teacher 95% CI" in q[0], q
    assert _data(nb, "fraction_of_teacher", "image/png"), "no fraction-of-teacher plot"
    spec = _data(nb, 'res.metrics["speculation_check"]', "text/plain")
    assert spec and re.search(r"mismatched_outputs\s+0\b", spec[0]), spec
    _steps_cheap_and_quiet(nb, "06_evaluation")


def test_figures_notebook_shows_each_figure_family(tiny_pipeline):
    nb = _read(tiny_pipeline, "07_figures")
    for marker, n in (('show("fig-qad-kl"', 3), ('show("fig-train-pretrain"', 2), ('show("fig-tau-speedup"', 1),
                      ('show("fig-per-position"', 2)):
        assert len(_data(nb, marker, "image/png")) == n, marker
        assert not [t for t in _data(nb, marker, "text/markdown") if "not made" in t], marker
    tables = "".join(_data(nb, 'Markdown((res.fig_dir / "tables.md")', "text/markdown"))
    assert tables.count("### ") >= 5 and "vLLM" in tables, tables[:500]
    block = "".join(_data(nb, "readme_block(PRESET", "text/markdown"))
    assert "| run, stage | result | value | 95% CI |" in block and "`tiny` 01" in block, block
    cards = _stdout(nb, 'cards = res.metrics["cards"]')
    n = re.match(r"(\d+) model cards:", cards)
    assert n and int(n[1]) > 0 and cards.count("README.md") == int(n[1]), cards
    card = "".join(_data(nb, 'cards = res.metrics["cards"]', "text/markdown"))
    assert card.startswith("# ") and "---" not in card.splitlines()[0], card[:200]
    _steps_cheap_and_quiet(nb, "07_figures")
