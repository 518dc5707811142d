"""Stage-level checks on the papermill-executed tiny pipeline (every notebook must have run)."""
import json

from qdflash.runio import read_json
from conftest import NOTEBOOKS, STAGE_OF


def test_every_notebook_ran_and_wrote_metrics(tiny_pipeline):
    for nb in NOTEBOOKS:
        stage = STAGE_OF[nb.stem]
        d = tiny_pipeline["runs"] / stage
        assert (d / "executed.ipynb").exists()
        m, run = read_json(d / "metrics.json"), read_json(d / "run.json")
        # one run wrote them: the same code on both ends, and the stage's own clock inside the notebook's wall time
        assert m["git_sha"] and m["git_sha"] == run["git_sha"]
        nb_s = json.loads((d / "executed.ipynb").read_text())["metadata"]["papermill"]["duration"]
        assert 0 < m["wall_time_s"] <= nb_s, (stage, m["wall_time_s"], nb_s)
        assert read_json(d / "config.json")["preset"] == "tiny"


def test_drafter_grid(tiny_pipeline):
    from qdflash.config import DrafterConfig, load_config
    m = read_json(tiny_pipeline["runs"] / "03_drafter_finetune" / "metrics.json")
    B = load_config(DrafterConfig, "tiny").block_size
    for tgt in ("fp", "qad"):
        g = m["decoding"][tgt]
        assert set(g) == {"plain", "pretrain", "two_stage", "direct", "random"}
        plain = g["plain"]
        assert plain["steps"] == plain["decode_tokens"] > 0            # plain decoding: one token per step
        for name, st in g.items():
            if name == "plain":
                continue
            # tiny walks all but the two-stage drafter (walk.Walker); the decoded one is checked against its walk
            assert st["measured_by"] == ("decoder" if name == "two_stage" else "walk"), name
            if name == "two_stage":
                assert st["mismatched_outputs"] == 0 and st["decode_tokens"] == plain["decode_tokens"]
                assert st["walk_check"]["prompts_identical"] == st["walk_check"]["prompts"] == st["prompts"]
            # tau counts the bonus/correction token: the accepted lengths cover every decoded token, and only the
            # last step of each prompt can overshoot (cut by the token budget or EOS), by at most B - 1
            covered = round(st["tau"] * st["steps"])
            assert st["decode_tokens"] <= covered <= st["decode_tokens"] + (B - 1) * st["prompts"], (name, st)
            assert st["prompts"] == m["eval_prompts"]
            lo, hi = st["tau_ci95"]
            assert lo <= st["tau"] <= hi
            assert set(st["paired_tau_diff"]) == set(g) - {"plain", name}
    # where the stage's seconds went: every phase, adding up to no more than the process's wall time
    assert set(m["phase_s"]) == {"regenerate", "features", "train", "grid_fp", "grid_qad"}
    assert all(v >= 0 for v in m["phase_s"].values()) and sum(m["phase_s"].values()) <= m["wall_time_s"]
    assert m["phase_s"]["train"] >= m["train"]["two_stage"]["train_s"] + m["train"]["direct"]["train_s"] - 0.5
    tr = m["train"]
    # the direct ablation gets the same total budget (epochs) as pretrain + finetune
    pre = read_json(tiny_pipeline["runs"] / "02_drafter_pretrain" / "metrics.json")["train"]
    assert tr["direct"]["epochs"] == pre["epochs"] + tr["two_stage"]["epochs"]


def test_evaluation_gates(tiny_pipeline):
    """The stage's gate scores are the harness's aggregation of lm-eval's own results: MC the unweighted mean of the
    subjects, IFEval prompt-level strict, GPQA flexible-extract, each with an interval over items."""
    import json
    d = tiny_pipeline["runs"] / "06_evaluation"
    m = read_json(d / "metrics.json")
    raw = json.loads((d / "lm_eval_results.json").read_text())
    assert set(m["results"]) >= {"teacher", "rtn", "gptq", "qad"} and set(raw) == {"teacher", "rtn", "gptq", "qad"}
    for model, res in raw.items():
        g = m["results"][model]
        subj = [v["exact_match,custom-extract"] for t, v in res.items() if t.startswith("local_mmlu_pro_")]
        assert len(subj) == 2 and abs(g["mc"]["score"] - sum(subj) / 2) < 1e-12
        assert g["ifeval"]["score"] == res["local_ifeval"]["prompt_level_strict_acc,none"]
        assert g["ifeval"]["inst_level_strict_acc"] == res["local_ifeval"]["inst_level_strict_acc,none"]
        assert g["gpqa"]["score"] == res["local_gpqa"]["exact_match,flexible-extract"]
        # the log-likelihood quality tasks (quality_tasks): lm-eval's own accuracy, with an interval over items
        for task in ("local_agreement", "local_rg_products"):
            q = g["quality"][task]
            assert q["score"] == res[task]["acc,none"] and q["items"] == 8
            assert q["score_ci95"][0] <= q["score"] <= q["score_ci95"][1]
        for name, gate in g.items():
            if name == "quality":
                continue
            lo, hi = gate["score_ci95"]
            assert lo <= gate["score"] <= hi and gate["pass"] == (gate["score"] >= gate["threshold"])
    assert set(m["quality"]["vs_teacher"]) == {"rtn", "gptq", "qad"}
    assert m["max_gen_toks"] == 16 and m["dtype"] == "float32"
    # speculation must not change greedy outputs, hence not the scores
    spec = m["speculation_check"]
    assert spec["mismatched_outputs"] == 0 and spec["outputs"] > 0
    # fp32: no token differs either, so no cause to explain (bf16 runs list each one with its margin)
    assert spec["mismatched_token_outputs"] == 0 and spec["mismatch_causes"] == [] and spec["max_mismatch_margin"] is None
    assert spec["tau_ci95"][0] <= spec["tau"] <= spec["tau_ci95"][1]
    r = m["results"]
    assert r["qad (our loop, plain)"] == r["qad (our loop, speculative)"]


def _md_table(path) -> list[dict]:
    """Rows of a pandas ``to_markdown`` table as {column: cell}; a MultiIndex printed as one tuple cell
    ("('FP32', 'direct')") is split into its parts under the keys "index0", "index1", ..."""
    import ast
    lines = [x for x in path.read_text().splitlines() if x.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for x in lines[2:]:
        row = dict(zip(head, (c.strip() for c in x.strip("|").split("|"))))
        if row.get("", "").startswith("("):
            row.update({f"index{i}": str(v) for i, v in enumerate(ast.literal_eval(row[""]))})
        rows.append(row)
    return rows


def _row(rows: list[dict], **key) -> dict:
    """The one row whose index cells equal ``key`` (by column name, or by position index0, index1, ...)."""
    names = list(key)
    hit = [r for r in rows if all(r.get(k) == v for k, v in key.items())
           or all(r.get(f"index{i}") == key[k] for i, k in enumerate(names))
           or (len(key) == 1 and r.get("") == key[names[0]])]
    assert len(hit) == 1, (key, len(hit))
    return hit[0]


def _close(cell: str, value: float) -> bool:
    return abs(float(cell) - value) <= 5e-4 * max(1.0, abs(value))        # floatfmt .4g


def test_figures_and_tables_show_the_stage_metrics(tiny_pipeline):
    import matplotlib.image as mpimg
    runs, figs = tiny_pipeline["runs"], tiny_pipeline["figures"]
    m = read_json(runs / "07_figures" / "metrics.json")
    assert m["missing_stages"] == []
    names = {"fp": "FP32", "qad": "QAD W4A16"}
    rows = _md_table(figs / "table-drafters.md")
    grid = read_json(runs / "03_drafter_finetune" / "metrics.json")["decoding"]
    for tgt, res in grid.items():
        for drafter, st in res.items():
            row = _row(rows, target=names[tgt], drafter=drafter)
            assert _close(row["tau"], st["tau"]) and _close(row["steps"], st["steps"]), (tgt, drafter)
    dq = read_json(runs / "04_drafter_quant" / "metrics.json")["table"]
    rows = _md_table(figs / "table-drafter-quant.md")
    for key, st in dq.items():
        if not key.startswith("plain"):
            prec, _, swa = key.partition("-swa")
            assert _close(_row(rows, drafter=prec, SWA=swa or "off")["mean acceptance length"], st["tau"]), key
    gates = read_json(runs / "06_evaluation" / "metrics.json")["results"]
    rows = _md_table(figs / "table-gates.md")
    for model, res in gates.items():
        for task, v in res.items():
            if task != "quality":
                assert _close(_row(rows, model=model)[task], v["score"]), (model, task)
    rows = _md_table(figs / "table-quality.md")
    for model in ("teacher", "rtn", "gptq", "qad"):
        for task, v in gates[model]["quality"].items():
            assert _close(_row(rows, task=task, model=model)["acc"], v["score"]), (model, task)
    for name in ("fig-qad-kl", "fig-tau-speedup", "fig-per-position", "fig-time-split", "fig-train-qad",
                 "fig-train-drafters", "fig-train-pretrain"):
        img = mpimg.imread(figs / f"{name}.png")
        assert img.shape[0] > 200 and img.shape[1] > 200 and img[..., :3].std() > 0.01, name   # drawn, not blank
        assert (figs / f"{name}.pdf").read_bytes()[:5] == b"%PDF-", name


def test_a_notebook_reads_a_finished_run_back_unless_it_is_out_of_date(tmp_path, monkeypatch):
    """run_stage(reuse=True) (the notebooks) returns a finished run's saved result without running the stage (which
    would overwrite its timings with a resumed call's); it runs again when an upstream stage finished later, or when
    make runs that stage (QDFLASH_STAGE), and never reuses by default (the CLI)."""
    import json
    import os

    from qdflash.config import to_dict
    from qdflash.pipeline import finished_result, run_stage, stage_config
    monkeypatch.delenv("QDFLASH_STAGE", raising=False)
    for stage, metrics in (("00_data", {"n_train": 7, "n_val": 2, "wall_time_s": 99.0}),
                           ("01_qad", {"names": {"qad": "q", "twin": "t"}, "wall_time_s": 5.0})):
        d = tmp_path / stage
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"stage": stage, **to_dict(stage_config(stage, "tiny"))}))
        (d / "metrics.json").write_text(json.dumps(metrics))
    os.utime(tmp_path / "00_data" / "metrics.json", (1000, 1000))
    res = run_stage("00_data", "tiny", tmp_path, reuse=True)
    assert (res.n_train, res.n_val, res.metrics["wall_time_s"]) == (7, 2, 99.0)      # read back, not rerun
    qad = finished_result("01_qad", "tiny", tmp_path)
    assert qad.packed == tmp_path / "01_qad" / "q" and qad.twin == tmp_path / "01_qad" / "t"
    os.utime(tmp_path / "00_data" / "metrics.json")                                  # upstream newer: run again
    assert finished_result("01_qad", "tiny", tmp_path) is None
    monkeypatch.setenv("QDFLASH_STAGE", "00_data")                                   # make runs this stage
    assert finished_result("00_data", "tiny", tmp_path) is None
    monkeypatch.delenv("QDFLASH_STAGE")
    assert finished_result("00_data", "tiny", tmp_path) is not None
    assert finished_result("07_figures", "tiny", tmp_path) is None
