"""What the two training loops (QAD, the drafter) share: the learning-rate schedule and the autocast dtype."""
from __future__ import annotations

import math

import torch


def lr_at(step: int, total: int, warmup_frac: float, base: float) -> float:
    """Linear warmup over ``warmup_frac`` of ``total`` steps (at least one), then cosine decay to 0 at ``total``."""
    warm = max(1, int(round(warmup_frac * total)))
    if step < warm:
        return base * (step + 1) / warm
    prog = (step - warm) / max(1, total - warm)
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))


def autocast_dtype(cfg) -> torch.dtype | None:
    """bf16 autocast when the config computes in bf16 (fp32 master weights and optimizer state either way)."""
    return torch.bfloat16 if cfg.dtype == "bfloat16" else None
