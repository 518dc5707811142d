"""Stage 06: lm-eval gates and the log-likelihood quality tasks for the teacher, PTQ and QAD targets, and the
speculative-decoding check."""
from __future__ import annotations

import json
import os
import time
from contextlib import redirect_stderr
from dataclasses import dataclass
from pathlib import Path

from ..config import EvalConfig
from ..evaluation import (
    TASKS_FULL,
    THINKING_FULL,
    bootstrap_mean_ci,
    ensure_punkt_tab,
    evaluate_model,
    gate_scores,
    item_scores,
    spec_lm_class,
    write_local_tasks,
)
from ..runio import finish_run, read_json, start_run


@dataclass
class EvalResult:
    out_dir: Path
    metrics: dict


def saved_result(out: Path, metrics: dict) -> EvalResult:
    """A finished run of this stage as ``run_evaluation`` returned it."""
    return EvalResult(out, metrics)


def run_evaluation(cfg: EvalConfig, out_dir, data_dir, qad_dir, finetune_dir, progress=True) -> EvalResult:
    t0 = time.time()
    out = start_run(out_dir, cfg, "06_evaluation")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    ensure_punkt_tab()
    from ..models import resolve_target
    qm = read_json(Path(qad_dir) / "metrics.json")
    fp_spec = read_json(Path(data_dir) / "config.json")["target"]
    models = {"teacher": resolve_target(fp_spec)}
    models.update({k: str(Path(qad_dir) / qm["names"][k]) for k in ("rtn", "gptq", "qad")})
    if cfg.preset == "full":
        tasks, task_dir = dict(TASKS_FULL), None
    else:
        task_dir = out / "tasks"
        tasks = write_local_tasks(task_dir, cfg)
    qtasks = {}
    if cfg.n_quality and task_dir is not None:       # log-likelihood tasks the small teacher solves (quality_tasks)
        from ..quality_tasks import write_quality_tasks
        qtasks = write_quality_tasks(task_dir, cfg.n_quality, tasks=cfg.quality_tasks)
    results, raw, q_items = {}, {}, {}
    # lm-eval writes its own text bars (plain tqdm, several per model), its warnings and transformers' to stderr: a
    # wall of lines in a notebook. They go to the run directory's lm_eval.log; the stage shows one bar, one step a run
    from tqdm.auto import tqdm
    runs = len(models) + (2 if cfg.with_speculation and cfg.preset != "full" else 0)
    bar = tqdm(total=runs, desc="lm-eval runs", unit="run", disable=not progress)
    log = open(out / "lm_eval.log", "w")
    for name, path in models.items():
        bar.set_postfix_str(name)
        with redirect_stderr(log):
            res, n, samples = evaluate_model("hf", {**tasks, **qtasks}, task_dir, cfg, path)
        bar.update(1)
        raw[name] = res
        results[name] = gate_scores(res, n, tasks, cfg.thresholds, samples)
        if qtasks:
            q_items[name] = {t: item_scores(samples, t, m) for t, m in qtasks.items()}
            results[name]["quality"] = {t: {"score": res[t][m], "score_ci95": bootstrap_mean_ci([q_items[name][t]]),
                                            "items": len(q_items[name][t])} for t, m in qtasks.items()}
    spec = {}
    if cfg.with_speculation and cfg.preset != "full":
        from ..decode_stats import acceptance_stats
        fm = read_json(Path(finetune_dir) / "metrics.json")
        drafter_dir = str(Path(finetune_dir) / fm["drafters"]["two_stage"])
        SpecLM = spec_lm_class()
        bar.set_postfix_str("qad, our loop")
        with redirect_stderr(log):
            plain = SpecLM(models["qad"], None, cfg.max_gen_toks, cfg.dtype)
            withd = SpecLM(models["qad"], drafter_dir, cfg.max_gen_toks, cfg.dtype)
            rp, n_p, s_p = evaluate_model(plain, tasks, task_dir, cfg)
        bar.update(1)
        with redirect_stderr(log):
            rs, n_s, s_s = evaluate_model(withd, tasks, task_dir, cfg)
        bar.update(1)
        results["qad (our loop, plain)"] = gate_scores(rp, n_p, tasks, cfg.thresholds, s_p)
        results["qad (our loop, speculative)"] = gate_scores(rs, n_s, tasks, cfg.thresholds, s_s)
        st = acceptance_stats(withd.results)
        # every speculative output whose tokens differ from plain greedy, with its first differing position and the
        # target's fp32 top-2 margin there: a near-tie that the bf16 verify flips, or (a large margin) a bug
        from ..models import load_model
        from ..decode_stats import mismatch_causes
        toks_p, toks_s = [r.tokens for r in plain.results], [r.tokens for r in withd.results]
        ref = load_model(models["qad"], "float32", "cpu") if toks_p != toks_s else None
        causes = mismatch_causes(ref, plain.prompt_ids, toks_p, toks_s) if ref is not None else []
        spec = {"outputs": len(plain.outputs), "dtype": cfg.dtype,
                "mismatched_outputs": sum(a != b for a, b in zip(plain.outputs, withd.outputs)),
                "mismatched_token_outputs": len(causes), "mismatch_causes": causes,
                "max_mismatch_margin": max((c["margin"] for c in causes), default=None),
                **{k: st[k] for k in ("tau", "tau_ci95", "per_position", "per_position_ci95", "steps", "prompts")
                   if k in st}}
    bar.close()
    log.close()
    (out / "lm_eval_results.json").write_text(json.dumps(raw, indent=1, default=str))
    quality = {}
    if qtasks:
        from ..quality_tasks import CHANCE, paired_between, relative_to_teacher
        quality = {"tasks": qtasks, "chance": {t: CHANCE[t] for t in qtasks},
                   "vs_teacher": relative_to_teacher(q_items), "paired": paired_between(q_items)}
    m = finish_run(out, {"results": results, "speculation_check": spec, "tasks": tasks, "quality": quality,
                         "thinking": {t: THINKING_FULL.get(t) for t in tasks} if cfg.preset == "full" else None,
                         "max_gen_toks": cfg.max_gen_toks, "dtype": cfg.dtype,
                         "thresholds": list(cfg.thresholds)}, t0)
    return EvalResult(out, m)
