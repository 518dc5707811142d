"""Stage 06's gate arithmetic (the paper's harness) and its lm-eval plumbing, without the tiny pipeline."""
import pytest

from qdflash.config import EvalConfig, load_config
from qdflash.evaluation import (GPQA_METRIC, IF_METRIC, MC_METRIC, TASKS_FULL, bootstrap_mean_ci, gate_scores,
                                hf_model_args, item_scores, task_groups)

TASKS = {"local_mmlu_pro_add": MC_METRIC, "local_mmlu_pro_mul": MC_METRIC, "local_ifeval": IF_METRIC,
         "local_gpqa": GPQA_METRIC}


def _results(add=0.2, mul=0.6):
    return {"local_mmlu_pro_add": {MC_METRIC: add}, "local_mmlu_pro_mul": {MC_METRIC: mul},
            "local_ifeval": {IF_METRIC: 0.5, "inst_level_strict_acc,none": 0.7},
            "local_gpqa": {GPQA_METRIC: 0.25}}


def test_gates_are_the_paper_harness_aggregates():
    n = {"local_mmlu_pro_add": 10, "local_mmlu_pro_mul": 30, "local_ifeval": 4, "local_gpqa": 4}
    g = gate_scores(_results(), n, TASKS, (0.39, 0.5, 0.3))
    assert g["mc"]["score"] == pytest.approx(0.4)              # unweighted over subjects (10 vs 30 items)
    assert g["mc"]["size_weighted"] == pytest.approx(0.5)      # lm-eval's group score, kept for reference
    assert g["mc"]["pass"] is True
    assert g["ifeval"]["score"] == 0.5 and g["ifeval"]["inst_level_strict_acc"] == 0.7   # prompt-level strict
    assert g["ifeval"]["pass"] is True and g["gpqa"]["pass"] is False
    assert TASKS_FULL["ifeval"] == "prompt_level_strict_acc,none"


def test_gate_intervals_over_items():
    # one stratum of items {0, 1}: resampled means 0, 1/2, 1 with P(0) = P(1) = 1/4 -> the 95% interval is [0, 1]
    assert bootstrap_mean_ci([[0.0, 1.0]]) == [0.0, 1.0]
    # stratified: subject A always right, B always wrong -> the unweighted mean is 1/2 in every resample (pooling
    # the five items and resampling them together would spread it)
    assert bootstrap_mean_ci([[1.0, 1.0, 1.0], [0.0, 0.0]]) == [0.5, 0.5]
    samples = {"local_mmlu_pro_add": [{"doc_id": i, "filter": "custom-extract", "exact_match": 1.0} for i in range(3)]
               + [{"doc_id": 0, "filter": "strict", "exact_match": 0.0}],
               "local_mmlu_pro_mul": [{"doc_id": i, "filter": "custom-extract", "exact_match": 0.0} for i in range(2)],
               "local_ifeval": [{"doc_id": i, "filter": "none", "prompt_level_strict_acc": b}
                                for i, b in enumerate([True, False])],
               "local_gpqa": [{"doc_id": 0, "filter": "flexible-extract", "exact_match": 1.0}]}
    assert item_scores(samples, "local_mmlu_pro_add", MC_METRIC) == [1.0, 1.0, 1.0]    # other filters ignored
    g = gate_scores(_results(1.0, 0.0), {}, TASKS, (0.6, 0.8, 0.6), samples)
    assert g["mc"]["score_ci95"] == [0.5, 0.5]
    assert g["ifeval"]["score_ci95"] == [0.0, 1.0] and g["ifeval"]["items"] == 2
    assert g["gpqa"]["score_ci95"] == [1.0, 1.0]


def test_thinking_per_task_and_dtype_follow_the_preset():
    full = load_config(EvalConfig, "full")
    groups = task_groups(full, TASKS_FULL)
    assert groups == [(False, {"mmlu_pro": MC_METRIC, "ifeval": IF_METRIC}),
                      (True, {"gpqa_diamond_cot_zeroshot": GPQA_METRIC})]
    assert hf_model_args("m", full, False) == "pretrained=m,dtype=bfloat16,enable_thinking=False"
    assert hf_model_args("m", full, True) == "pretrained=m,dtype=bfloat16,enable_thinking=True,think_end_token=</think>"
    tiny = load_config(EvalConfig, "tiny")
    assert task_groups(tiny, TASKS) == [(None, TASKS)]
    assert hf_model_args("m", tiny, None) == "pretrained=m,dtype=float32"
    assert load_config(EvalConfig, "smol").dtype == "bfloat16" and tiny.dtype == "float32"
    with pytest.raises(ValueError, match="no thinking setting"):
        task_groups(full, {"bogus_task": MC_METRIC})


def test_max_gen_toks_overrides_the_tasks_and_items_are_logged(tmp_path):
    """Tasks written with max_gen_toks 16, evaluated with a config of 3: lm-eval hands every request the config's
    cap (our decoder then stops there); the logged samples give one score per item."""
    import torch

    from qdflash.evaluation import _evaluate, spec_lm_class, ensure_punkt_tab, write_local_tasks
    from qdflash.models import resolve_target
    ensure_punkt_tab()
    cfg16 = load_config(EvalConfig, "tiny", n_mc=2, n_ifeval=2, n_gpqa=2, max_gen_toks=16)
    cfg3 = load_config(EvalConfig, "tiny", n_mc=2, n_ifeval=2, n_gpqa=2, max_gen_toks=3)
    tasks = write_local_tasks(tmp_path / "tasks", cfg16)
    lm = spec_lm_class()(resolve_target("tiny"), None, 999, "bfloat16")
    assert lm.model.dtype == torch.bfloat16
    results, n, samples = _evaluate(lm, tasks, tmp_path / "tasks", cfg3)
    assert len(lm.results) == 6 and all(len(r.tokens) <= 3 for r in lm.results)
    assert max(len(r.tokens) for r in lm.results) == 3
    for t, key in tasks.items():
        items = item_scores(samples, t, key)
        assert len(items) == n[t] and sum(items) / len(items) == pytest.approx(results[t][key])


def test_compressed_checkpoints_are_evaluated_dense_with_the_same_scores(tiny_pipeline, tmp_path):
    """Stage 06 hands lm-eval the QAD W4A16 checkpoint de-quantized once instead of transformers' compressed modules:
    the same model, so every logged response and score must be identical to the compressed path's (a wrong scale
    layout or a missed layer in the de-quantization would change the greedy answers and log-likelihoods)."""
    from qdflash.evaluation import _compressed, _dense_hflm, _evaluate, ensure_punkt_tab, write_local_tasks
    from qdflash.runio import read_json
    ensure_punkt_tab()
    qad = tiny_pipeline["runs"] / "01_qad"
    path = str(qad / read_json(qad / "metrics.json")["names"]["qad"])
    assert _compressed(path) and not _compressed(str(tmp_path))
    cfg = load_config(EvalConfig, "tiny", n_mc=3, n_ifeval=2, n_gpqa=2, max_gen_toks=8)
    tasks = write_local_tasks(tmp_path / "tasks", cfg)
    dense = _evaluate(_dense_hflm(path, cfg, None), tasks, tmp_path / "tasks", cfg)
    comp = _evaluate("hf", tasks, tmp_path / "tasks", cfg, hf_model_args(path, cfg, None))
    assert dense[0] == comp[0] and dense[1] == comp[1]
    for t in tasks:
        resp = [[s["doc_id"], s["filter"], s["resps"]] for s in dense[2][t]]
        assert resp == [[s["doc_id"], s["filter"], s["resps"]] for s in comp[2][t]] and resp


def test_a_gate_the_teacher_fails_is_not_applicable(tmp_path):
    """The gate table says pass/fail only where the teacher passes; where the teacher fails every verdict is n/a."""
    import json

    from qdflash.figures import gate_table
    res = {"teacher": {"mc": {"score": 0.5, "pass": True}, "gpqa": {"score": 0.2, "pass": False}},
           "qad": {"mc": {"score": 0.4, "pass": False}, "gpqa": {"score": 0.3, "pass": True}}}
    (tmp_path / "metrics.json").write_text(json.dumps({"results": res}))
    t = gate_table(tmp_path)
    assert t.loc["qad", "mc gate"] == "fail" and t.loc["teacher", "mc gate"] == "pass"
    assert set(t["gpqa gate"]) == {"n/a (teacher fails)"}
