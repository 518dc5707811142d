"""The steps of the stepped notebooks 00_data_prep, 01_qad and 04_drafter_quant (issue 36) ran in the executed tiny
notebooks (the ``tiny_pipeline`` fixture: papermill, as ``make reproduce``) and showed what they are for; their step
cells (all but the stage call) stay cheap."""
import re

import pytest
from nb_outputs import code_cell as _cell, data_of as _data, executed as _read, stdout_of as _stdout

pytestmark = pytest.mark.slow


def test_data_prep_notebook_follows_one_prompt(tiny_pipeline):
    nb = _read(tiny_pipeline, "00_data")
    src = _stdout(nb, "select_prompts(cfg, tok")
    prompt = re.search(r"first selected prompt \((\S+)\):\n(.+)", src)
    assert prompt, src
    tmpl = _stdout(nb, "ids = prompt_ids(")
    assert "(the stage's: True)" in tmpl and prompt[2] in tmpl, tmpl               # the template wraps the prompt
    assert "the prompt appears verbatim inside the template: True" in tmpl
    assert re.search(r"\d+ answer tokens \((hit the cap|ended with end-of-sequence)", _stdout(nb, "generate_batch("))
    mask = _stdout(nb, "ex = to_example(")
    m = re.search(r"(\d+) tokens, prompt_len (\d+), (\d+) supervised", mask)
    assert m and int(m[1]) == int(m[2]) + int(m[3]) and int(m[3]) > 0, mask      # the answer only, all of it
    assert _data(nb, "ex = to_example(", "image/png"), "no loss mask drawn"
    table = _data(nb, "ex = to_example(", "text/html")
    assert table and "loss_mask" in table[0] and "0" in table[0] and "1" in table[0], table
    assert f"{prompt[1]} is in " in _stdout(nb, "load_split(res.out_dir")
    assert re.search(r"\d+ train and \d+ val conversations", _stdout(nb, "load_split(res.out_dir"))
    files = _data(nb, 'read_json(res.out_dir / "manifest.json")', "text/html")
    assert files and all(k in files[0] for k in ("train", "val", "assistant_tokens", "sha256")), files
    cap = re.search(r"(\d+) of (\d+) answers \(\d+%\) hit the cap of (\d+) tokens", _stdout(nb, "answers = ["))
    assert cap and int(cap[1]) <= int(cap[2]), cap
    assert _data(nb, "answers = [", "image/png"), "no length histograms"


def test_qad_notebook_shows_baselines_fake_quant_step_and_interval(tiny_pipeline):
    nb = _read(tiny_pipeline, "01_qad")
    base = _data(nb, "register_forward_pre_hook(", "text/html")
    assert base and "RTN" in base[0] and "GPTQ" in base[0] and "output error" in base[0], base
    plain = _data(nb, "register_forward_pre_hook(", "text/plain")[-1]          # the table, after any progress bar
    err = {r[1]: float(r[3]) for r in re.finditer(r"^(RTN|GPTQ)\s+(\S+)\s+(\S+)", plain, re.MULTILINE)}
    assert err["GPTQ"] < err["RTN"], plain                                         # what GPTQ is for
    assert "same scales in both: True" in _stdout(nb, "register_forward_pre_hook(")
    fq = _stdout(nb, "load_fake_quant_model(")
    assert re.search(r"\d+ FakeQuantLinear layers", fq) and "its codes equal the GPTQ checkpoint's: True" in fq, fq
    grid = _data(nb, "load_fake_quant_model(", "text/html")
    assert grid and all(k in grid[0] for k in ("latent", "code", "served weight")), grid
    step = _stdout(nb, "kl_loss(student, teacher")
    kl = re.search(r"KL (\d+\.\d+) per token \((\d+) tokens\); the stage's first step logged (\d+\.\d+)", step)
    assert kl and float(kl[1]) > 0 and kl[1] == kl[3], step                         # the stage's first step, replayed
    assert _data(nb, "kl_loss(student, teacher", "image/png"), "no per-token KL drawn"
    top = _data(nb, "lt[p].exp().topk(", "text/html")
    assert top and "teacher token" in top[0] and "student p" in top[0], top
    assert re.search(r"gradient norm over \d+ latent tensors: \d", _stdout(nb, "loss.backward()"))
    assert _data(nb, "training_curves(res.out_dir)", "image/png")
    assert _data(nb, "qad_training_plot(res.out_dir)", "image/png")
    codes = _stdout(nb, "qad_ints = read_grid(")
    assert re.search(r"all layers: \d+\.\d+% of codes changed \(kept step \d+ of \d+\)", codes), codes
    ci = re.search(r"QAD / GPTQ KL ratio (\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+), \d+ conversations\)",
                   _stdout(nb, 'ci = res.metrics["qad_vs_gptq_kl"]'))
    assert ci and float(ci[2]) <= float(ci[1]) <= float(ci[3]), ci
    assert _data(nb, 'ci = res.metrics["qad_vs_gptq_kl"]', "image/png")
    assert "QAD W4A16" in _data(nb, "qad_table(res.out_dir)", "text/html")[0]


def test_drafter_quant_notebook_shows_gptq_layer_window_mask_and_table(tiny_pipeline):
    nb = _read(tiny_pipeline, "04_drafter_quant")
    assert re.search(r"\d+ Hessians; \S+: \(\d+, \d+\)", _stdout(nb, "H = collect_hessians("))
    g = re.search(r"output error before \(round-to-nearest\) (\S+), after GPTQ (\S+) ",
                  _stdout(nb, "gptq_drafter(drafter"))
    assert g and float(g[2]) < float(g[1]), g                                      # GPTQ lowers the layer's error
    assert "weights on the INT4 grid: True" in _stdout(nb, "gptq_drafter(drafter")
    assert _data(nb, "block_mask(anchors", "image/png"), "no window mask drawn"
    seen = re.search(r"without a window \[([\d, ]+)\], with window (\d+) \[([\d, ]+)\]", _stdout(nb, "block_mask(anchors"))
    assert seen, _stdout(nb, "block_mask(anchors")
    full, win = [int(x) for x in seen[1].split(",")], [int(x) for x in seen[3].split(",")]
    assert all(w <= min(f, int(seen[2]) - 1) for f, w in zip(full, win)), seen[0]  # the window only hides context
    same = re.search(r"the stage's GPTQ error (\S+), section 3's (\S+)", _stdout(nb, "drafter_meta.json"))
    assert same and same[1] == same[2], same                                        # the step is the stage's step
    assert _data(nb, "per_position_plot(res.out_dir)", "image/png")
    table = _data(nb, "drafter_quant_table(res.out_dir)", "text/html")
    assert table and "w4a16" in table[0] and "mean acceptance length" in table[0], table


def test_prep_qad_quant_step_cells_stay_cheap(tiny_pipeline):
    for stage in ("00_data", "01_qad", "04_drafter_quant"):
        nb = _read(tiny_pipeline, stage)
        steps_s = sum(c.metadata.get("papermill", {}).get("duration") or 0 for c in nb.cells
                      if c.cell_type == "code" and "run_stage(" not in c.source)
        assert 0 < steps_s < 60, (stage, steps_s)
