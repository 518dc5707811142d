"""QAD recipe sweep on the smol data (issue: QAD that beats PTQ, measured so that a null result would show).

    python benchmarks/qad_sweep.py --data runs/smol/00_data --out benchmarks/qad_sweep.json \
        --variants 'latent:lr=1e-4' 'scale:scale_lr=2e-5' ...

One GPTQ W4A16 g32 start (llmcompressor, the stage's own `quantize_ptq`), then for each variant the stage's own
`train_qad` (same batches, same held-out selection split, best checkpoint kept) and the stage's evaluation
(`compare_models_to_teacher`) on the same held-out conversations: KL to the teacher, top-1 agreement, assistant
perplexity, and the paired bootstrap interval over conversations of KL(QAD) / KL(GPTQ). A variant is
`train_params:key=value,key=value` with QADConfig keys.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from qdflash.config import QADConfig, load_config
from qdflash.data import load_split
from qdflash.models import load_model, load_tokenizer, resolve_target
from qdflash.qad import bootstrap_ratio_diff, compare_models_to_teacher, train_qad
from qdflash.quant import load_fake_quant_model, quantize_ptq
from qdflash.runio import git_sha, torch_dtype, write_json


def parse_variant(v: str) -> tuple[str, dict]:
    tp, _, kv = v.partition(":")
    ov = {"train_params": tp}
    for item in filter(None, kv.split(",")):
        k, _, val = item.partition("=")
        try:
            ov[k] = json.loads(val)
        except json.JSONDecodeError:
            ov[k] = val
    return v, ov


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="smol")
    ap.add_argument("--work", default=None)
    ap.add_argument("--common", default="", help="overrides for every variant, key=value,key=value")
    ap.add_argument("--variants", nargs="+", required=True)
    a = ap.parse_args()
    _, common = parse_variant("latent:" + a.common)
    common.pop("train_params")
    base_cfg = load_config(QADConfig, a.preset, **common)
    base = resolve_target(base_cfg.target)
    tok = load_tokenizer(base_cfg.target)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train, val = load_split(a.data, "train"), load_split(a.data, "val")[: base_cfg.eval_seqs]
    select = train[len(train) - base_cfg.select_seqs:]
    fit = train[: len(train) - base_cfg.select_seqs]
    work = Path(a.work or tempfile.mkdtemp(prefix="qad_sweep_"))
    gptq = work / "ptq-gptq"
    t = time.time()
    if not (gptq / "config.json").exists():
        quantize_ptq(base, "gptq", base_cfg.group_size, base_cfg.quant_targets,
                [r["input_ids"][: base_cfg.seq_len] for r in train[: base_cfg.calib_samples]], gptq,
                base_cfg.gptq_dampening, max_seq_len=base_cfg.seq_len)
    teacher = load_model(base, base_cfg.dtype)
    teacher.requires_grad_(False)
    out = {"command": " ".join(sys.argv), "git_sha": git_sha(), "device": str(teacher.device),
           "data": {"fit": len(fit), "select": len(select), "val": len(val)}, "ptq_s": round(time.time() - t, 1),
           "common": common, "variants": {}}
    gptq_model = load_fake_quant_model(gptq, base, torch.float32,
                                       scale_dtype=torch_dtype(base_cfg.scale_dtype))[0].to(teacher.device).eval()
    with torch.autocast(teacher.device.type, dtype=torch.bfloat16, enabled=base_cfg.dtype == "bfloat16"):
        ref = compare_models_to_teacher({"gptq": gptq_model}, teacher, val, base_cfg.seq_len, pad, per_row=True)["gptq"]
    del gptq_model
    out["gptq"] = {k: v for k, v in ref.items() if not k.startswith("row_")}
    print("gptq", out["gptq"], flush=True)
    for name, ov in map(parse_variant, a.variants):
        cfg = load_config(QADConfig, a.preset, **{**common, **ov})
        student = load_fake_quant_model(gptq, base, torch.float32, cfg.latent_init, cfg.seed,
                                        learn_scale="scale" in cfg.train_params,
                                        scale_dtype=torch_dtype(cfg.scale_dtype))[0].to(teacher.device)
        d = work / name.replace(":", "_").replace(",", "_").replace("=", "")
        d.mkdir(parents=True, exist_ok=True)
        for f in d.glob("*.pt"):
            f.unlink()
        t = time.time()
        log, summary = train_qad(cfg, student, teacher, fit, pad, d, d / "log.jsonl", False, select)
        train_s = time.time() - t
        with torch.autocast(teacher.device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
            ev = compare_models_to_teacher({"qad": student}, teacher, val, cfg.seq_len, pad, per_row=True)["qad"]
        ci = bootstrap_ratio_diff(ev["row_kl_sum"], ref["row_kl_sum"], ev["row_tokens"], seed=0)
        summary.pop("codes_changed_per_layer")
        out["variants"][name] = {"overrides": ov, "train_s": round(train_s, 1),
                                 "tokens": sum(r["tokens"] for r in log),
                                 "eval": {k: v for k, v in ev.items() if not k.startswith("row_")},
                                 "kl_ratio_vs_gptq": ci, "summary": summary,
                                 "curve": [{k: r[k] for k in ("step", "kl", "codes_changed") if k in r} for r in log[::10]]}
        print(name, f"KL {ev['kl_to_teacher']:.4f} (gptq {ref['kl_to_teacher']:.4f}) ratio {ci['ratio']:.3f} "
              f"{ci['ratio_ci95']} best@{summary['best_step']} changed {summary['codes_changed_final']:.4f} "
              f"{train_s:.0f}s", flush=True)
        write_json(a.out, out)
        del student
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
