"""Quality kept by the INT4 targets on every log-likelihood task the 135M teacher can do (issue 35 item 5).

Stage 06 scores two tasks (``EvalConfig.quality_tasks``: subject-verb agreement pairs and reasoning-gym products);
this scores all of ``quality_tasks.QUALITY_TASKS`` (those two and four more of the same kinds) for the teacher and a
run's RTN, GPTQ and QAD W4A16 targets, the way stage 06 does (lm-eval, the hf backend, the chat template, the
preset's dtype; a compressed checkpoint de-quantized), and reports per task: each model's accuracy, its fraction of the
teacher's, and QAD minus GPTQ and QAD minus RTN paired over the same items (95% bootstrap intervals over items).
One run of stage 01, so one training seed of QAD.

    python benchmarks/quality_tasks.py --runs runs/smol --n 400 --out benchmarks/quality-tasks/quality-tasks.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import redirect_stderr
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", required=True, help="a run directory holding 00_data and 01_qad")
    ap.add_argument("--preset", default="smol", help="the EvalConfig preset (dtype, batch size)")
    ap.add_argument("--n", type=int, default=400, help="items per task")
    ap.add_argument("--tasks", default="", help="comma-separated names in quality_tasks.QUALITY_TASKS (default: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from tqdm.auto import tqdm

    from qdflash.config import EvalConfig, load_config
    from qdflash.evaluation import bootstrap_mean_ci, evaluate_model, item_scores
    from qdflash.models import resolve_target
    from qdflash.quality_tasks import (CHANCE, QUALITY_TASKS, paired_between, relative_to_teacher, task_data_file,
                                       value_rank_floor, write_quality_tasks)
    from qdflash.runio import provenance, read_json, read_jsonl, write_json
    t0 = time.time()
    runs = Path(args.runs)
    for stage in ("00_data", "01_qad"):
        if not (runs / stage / "metrics.json").exists():
            raise SystemExit(f"{runs / stage} has no metrics.json: run `qdflash run {stage} --runs {runs}` first")
    tasks = tuple(args.tasks.split(",")) if args.tasks else tuple(QUALITY_TASKS)
    cfg = load_config(EvalConfig, args.preset, n_quality=args.n, quality_tasks=tasks)
    qm = read_json(runs / "01_qad" / "metrics.json")
    models = {"teacher": resolve_target(read_json(runs / "00_data" / "config.json")["target"])}
    models.update({k: str(runs / "01_qad" / qm["names"][k]) for k in ("rtn", "gptq", "qad")})
    task_dir = Path("/tmp") / f"quality-tasks-{os.getpid()}"      # the items are rebuilt from their seed
    qtasks = write_quality_tasks(task_dir, args.n, tasks=tasks)
    # the best question-blind rule of each multiple-choice task (the minimal pairs have none: one sentence scored alone)
    floors = {t: value_rank_floor(read_jsonl(task_data_file(task_dir, t))) for t in qtasks
              if QUALITY_TASKS[t][1] == "question"}
    items, scores = {}, {}
    with open(task_dir / "lm_eval.log", "w") as log:
        for name, path in tqdm(models.items(), desc="lm-eval runs", unit="model"):
            with redirect_stderr(log):
                res, _, samples = evaluate_model("hf", qtasks, task_dir, cfg, path)
            items[name] = {t: item_scores(samples, t, m) for t, m in qtasks.items()}
            scores[name] = {t: {"acc": res[t][m], "acc_ci95": bootstrap_mean_ci([items[name][t]]),
                                "items": len(items[name][t])} for t, m in qtasks.items()}
    out = {"command": "python benchmarks/quality_tasks.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v != ""),
           "provenance": provenance(), "stage01_git_sha": qm.get("git_sha"),
           "stage01_cpu": (read_json(runs / "01_qad" / "run.json").get("cpu") or {}).get("model"),
           "dtype": cfg.dtype, "tasks": list(qtasks), "chance": {t: CHANCE[t] for t in qtasks},
           "value_rank_floor": floors,
           "stage06_tasks": list(EvalConfig.__dataclass_fields__["quality_tasks"].default),
           "scores": scores, "vs_teacher": relative_to_teacher(items), "paired": paired_between(items),
           "item_scores": items, "wall_s": round(time.time() - t0, 1)}
    write_json(args.out, out)
    for t in qtasks:
        line = ", ".join(f"{m} {scores[m][t]['acc']:.3f}" for m in models)
        d = out["paired"]["qad - gptq"][t]
        print(f"{t}: {line}; qad - gptq {d['diff']:+.3f} ({d['diff_ci95'][0]:+.3f} to {d['diff_ci95'][1]:+.3f})")
    print(json.dumps({"wall_s": out["wall_s"]}))


if __name__ == "__main__":
    main()
