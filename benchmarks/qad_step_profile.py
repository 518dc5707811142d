"""Where one smol QAD step spends its time on this CPU (issue 13: QAD training is the DAG's largest item).

    python benchmarks/qad_step_profile.py --runs runs/smol --out benchmarks/cpu-qad-step-profile/qad-step-profile.txt

Builds the student as stage 01 does (GPTQ grid, jittered latents, only the latents trainable, bf16 autocast over
fp32 latents, fused AdamW) and times one preset-sized batch (4 x 256 tokens): the bf16 teacher forward, the student
forward with the chunked KL, the backward and the optimizer step, then profiles one step with torch.profiler.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs/smol")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from qdflash.config import QADConfig, load_config
    from qdflash.data import load_split
    from qdflash.models import load_model, resolve_target
    from qdflash.qad import collate, kl_loss
    from qdflash.quant import FakeQuantLinear, load_fake_quant_model
    from qdflash.runio import cpu_info, git_sha
    cfg = load_config(QADConfig, "smol")
    runs = Path(a.runs)
    base = resolve_target(cfg.target)
    teacher = load_model(base, cfg.dtype)
    teacher.requires_grad_(False)
    student, _, _ = load_fake_quant_model(runs / "01_qad" / f"ptq-gptq-w4a16-g{cfg.group_size}", base, torch.float32,
                                          cfg.latent_init, cfg.seed, scale_dtype=torch.bfloat16)
    student.requires_grad_(False)
    params = [m.weight for m in student.modules() if isinstance(m, FakeQuantLinear)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=0.0, fused=True)
    batch = collate(load_split(runs / "00_data", "train")[: cfg.batch_size], cfg.seq_len, teacher.config.eos_token_id)
    valid = int(batch["attention_mask"].sum())
    lines = [f"command: python {' '.join(sys.argv)}", f"git: {git_sha()}  torch threads: {torch.get_num_threads()}  cpu: {cpu_info()}",
             f"batch {tuple(batch['input_ids'].shape)}: {valid} valid tokens of {batch['input_ids'].numel()}; "
             f"trainable latents {sum(p.numel() for p in params)}"]

    def timed(f):
        t = time.perf_counter()
        r = f()
        return r, time.perf_counter() - t
    student.train()
    for _ in range(a.reps):
        with torch.no_grad():
            _, tt = timed(lambda: teacher.model(input_ids=batch["input_ids"],
                                                attention_mask=batch["attention_mask"]).last_hidden_state)
        (loss, _), tf = timed(lambda: kl_loss(student, teacher, batch, cfg.kl_chunk_tokens, torch.bfloat16))
        _, tb = timed(loss.backward)
        _, to = timed(lambda: (opt.step(), opt.zero_grad(set_to_none=True)))
        lines.append(f"teacher forward {tt:.2f} s | kl_loss (teacher + student forward + KL) {tf:.2f} s | "
                     f"backward {tb:.2f} s | AdamW {to:.2f} s | step {tf + tb + to:.2f} s")
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        loss, _ = kl_loss(student, teacher, batch, cfg.kl_chunk_tokens, torch.bfloat16)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ev = prof.key_averages()
    mm = [e for e in ev if e.key in ("aten::mm", "aten::addmm", "aten::bmm")]
    flops, secs = sum(e.flops for e in mm), sum(e.self_cpu_time_total for e in mm) / 1e6
    total = sum(e.self_cpu_time_total for e in ev) / 1e6
    lines.append(f"matmuls (aten::mm/addmm/bmm): {flops / 1e12:.2f} TFLOP in {secs:.2f} s = {flops / secs / 1e9:.0f} "
                 f"GFLOP/s achieved; {secs / total:.0%} of the step's self CPU time ({total:.2f} s)")
    lines.append(ev.table(sort_by="self_cpu_time_total", row_limit=15))
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
