"""Stage 01: quantization-aware distillation of the INT4 W4A16 target against its full-precision teacher, with the PTQ
baselines (RTN, GPTQ) and the held-out comparison."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import distributed
from ..config import QADConfig
from ..data import load_split
from ..models import load_model, resolve_target
from ..qad import (
    bootstrap_ratio_diff,
    compare_models_to_teacher,
    names,
    save_twin,
    train_qad,
)
from ..quant import load_fake_quant_model, pack_checkpoint, quantize_ptq
from ..runio import dir_size_bytes, finish_run, library_output_to_log, start_run, thin, torch_dtype, write_json


@dataclass
class QADResult:
    out_dir: Path
    packed: Path
    twin: Path
    metrics: dict


def saved_result(out: Path, metrics: dict) -> QADResult:
    """A finished run of this stage as ``run_qad`` returned it, from its saved metrics."""
    return QADResult(out, out / metrics["names"]["qad"], out / metrics["names"]["twin"], metrics)


def run_qad(cfg: QADConfig, out_dir: str | Path, data_dir: str | Path, progress: bool = True) -> QADResult:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    # torchrun: rank 0 runs PTQ, packs and evaluates as one process; all ranks train. llmcompressor turns distributed
    # (and waits for the other ranks) while a process group exists, so rank 0 joins the group after PTQ; the other
    # ranks wait for it in the join, before they touch anything rank 0 builds.
    main = distributed.launch_rank() == 0
    if not main:
        distributed.current()
    t0 = time.time()
    out = start_run(out_dir, cfg, "01_qad") if main else Path(out_dir)
    torch.manual_seed(cfg.seed)
    base = resolve_target(cfg.target)
    tok = AutoTokenizer.from_pretrained(base)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    val = val[: cfg.eval_seqs]
    nm = names(cfg)
    timings = {}
    calib = [r["input_ids"][: cfg.seq_len] for r in train[: cfg.calib_samples]]
    for method in ("rtn", "gptq"):
        path = out / nm[method]
        if not (path / "config.json").exists() and main:
            ts = time.time()
            quantize_ptq(base, method, cfg.group_size, cfg.quant_targets, calib, path, cfg.gptq_dampening,
                    max_seq_len=cfg.seq_len)
            write_json(path / "ptq_meta.json", {"seconds": round(time.time() - ts, 2), "calib": len(calib)})
        if (path / "ptq_meta.json").exists():   # reused artifacts keep the time measured when they were made
            timings[f"ptq_{method}_s"] = json.loads((path / "ptq_meta.json").read_text())["seconds"]
    dp = distributed.current()
    dt = torch_dtype(cfg.dtype)
    teacher = load_model(base, cfg.dtype)                   # bf16 on smol: the teacher only runs forwards
    teacher.requires_grad_(False)
    student, group, bits = load_fake_quant_model(out / nm[cfg.init_from], base, torch.float32, cfg.latent_init,
                                                 cfg.seed, learn_scale="scale" in cfg.train_params,
                                                 scale_dtype=torch_dtype(cfg.scale_dtype))
    student.to(teacher.device)
    select = train[len(train) - cfg.select_seqs:] if cfg.select_seqs else []
    fit = train[: len(train) - cfg.select_seqs] if cfg.select_seqs else train
    ckpt_dir = out / "qad-ckpt"
    ckpt_dir.mkdir(exist_ok=True)
    ts = time.time()
    log, summary = train_qad(cfg, student, teacher, fit, pad, ckpt_dir, out / "train_log.jsonl", progress, select)
    timings["qad_train_s"] = round(time.time() - ts, 2)
    if dp is not None:                       # the trained tensors gathered into a plain student on rank 0
        student = dp.unsharded(student, lambda: load_fake_quant_model(
            out / nm[cfg.init_from], base, torch.float32, cfg.latent_init, cfg.seed, learn_scale="scale" in
            cfg.train_params, scale_dtype=torch_dtype(cfg.scale_dtype))[0])
        dp.close()
        if student is None:
            return QADResult(out, out / nm["qad"], out / nm["twin"], {})
    packed = pack_checkpoint(student, out / nm[cfg.init_from], out / nm["qad"])
    twin = save_twin(student, base, out / nm["twin"])
    del student
    # evaluation on held-out data: the saved artifacts, reloaded the way users load them, in the preset's dtype;
    # the teacher runs once per batch for all of them
    ts = time.time()
    models = {"teacher": teacher}
    for key in ("rtn", "gptq", "qad"):
        with library_output_to_log():            # compressed-tensors' bars of every packed load
            models[key] = AutoModelForCausalLM.from_pretrained(out / nm[key], dtype=dt).to(teacher.device).eval()
    evals = compare_models_to_teacher(models, teacher, val, cfg.seq_len, pad, per_row=True)
    timings["eval_s"] = round(time.time() - ts, 2)
    ci = bootstrap_ratio_diff(evals["qad"]["row_kl_sum"], evals["gptq"]["row_kl_sum"], evals["qad"]["row_tokens"],
                              seed=cfg.seed)
    # per held-out conversation (the same ones in every run on this stage-00 data): runs of other seeds pool on them
    per_conv = {"tokens": evals["qad"]["row_tokens"],
                "kl_sum": {k: evals[k]["row_kl_sum"] for k in ("rtn", "gptq", "qad")}}
    for v in evals.values():
        v.pop("row_kl_sum"), v.pop("row_tokens")
    evals["teacher"]["file_mb"] = dir_size_bytes(base) / 2**20
    for key in ("rtn", "gptq", "qad"):
        evals[key]["file_mb"] = dir_size_bytes(out / nm[key]) / 2**20
    del models
    n_params = sum(p.numel() for p in teacher.parameters())
    evals["teacher"]["bf16_mb"] = n_params * 2 / 2**20
    train_tokens = sum(r["tokens"] for r in log)
    metrics = {"eval": evals, "names": nm, "group_size": group, "bits": bits, "steps": len(log),
               "train_tokens": train_tokens, "final_train_kl": log[-1]["kl"] if log else None,
               "initial_train_kl": log[0]["kl"] if log else None, "timings": timings,
               "curve": thin(log, ("step", "kl")), "qad_training": summary,
               "codes_curve": [{"step": r["step"], "codes_changed": r["codes_changed"]} for r in log
                               if "codes_changed" in r],
               "qad_vs_gptq_kl": ci, "per_conversation": per_conv, "compute_dtype": cfg.dtype,
               "train_tok_per_s": train_tokens / max(timings["qad_train_s"], 1e-9),
               "qad_kl_reduction_vs_best_ptq": 1 - evals["qad"]["kl_to_teacher"] / min(
                   evals["rtn"]["kl_to_teacher"], evals["gptq"]["kl_to_teacher"])}
    metrics = finish_run(out, metrics, t0)
    return QADResult(out, packed, twin, metrics)
