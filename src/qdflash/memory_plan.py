"""Expected memory per GPU of data-parallel QAD and drafter training (``distributed``: FSDP2, ZeRO-3), computed from
a preset's config and its target's shapes. No weights are loaded and nothing is downloaded.

``python -m qdflash.memory_plan --preset full --gpus 1 2 8`` prints the table the README quotes.

The models are built on the meta device, so the parameter counts are exact. For the full preset the target comes
from the published Qwen3.5-4B text config (``models.QWEN35_4B``), and the drafter from
``drafter.build_drafter_config``. States are exact byte counts. Sharded (1/N): the trainable fp32 master weights,
their gradients and AdamW's two moments, QAD's best-step snapshot and initial codes. Replicated: the frozen
teacher/target, the frozen student tensors, the scale buffers, and FSDP's unsharded copy of the units in flight.

Activations are an *estimate* (without activation checkpointing; QAD's total with it is reported too). Per token, every
Linear keeps its bf16 input and output for backward; each decoder layer keeps two RMSNorms' fp32 input and output, the
attention core keeps q, k, v and the output (bf16), and a Gated DeltaNet layer keeps its conv input/output and one
fp32 recurrent state per 64-token chunk. The QAD student also holds the bf16 cast of every on-grid weight until
backward (autocast casts the fake-quantized weight in each Linear call), which is 2 bytes per quantized weight and does
not shrink with N. The logits terms are the transient peak of the loss. QAD recomputes one ``kl_chunk_tokens``
chunk of student and teacher logits; the drafter computes every supervised position of a micro-batch at once.
The 1-GPU benchmark (``benchmarks/gpu_fsdp.sh``) prints this estimate next to the measured peak, to check it.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

GiB = 2 ** 30
GDN_CHUNK = 64


def _meta_model(cfg) -> nn.Module:
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def _layer_act_bytes(layer: nn.Module, cfg) -> float:
    """Estimated bytes one decoder layer keeps for backward per token (module docstring)."""
    h = cfg.hidden_size
    lin = sum(m.in_features + m.out_features for m in layer.modules() if isinstance(m, nn.Linear))
    b = 2 * lin + 2 * 2 * 4 * h                    # Linear inputs/outputs (bf16), 2 RMSNorms in/out (fp32)
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    if hasattr(layer, "self_attn"):
        b += 2 * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    for m in layer.modules():
        if isinstance(m, nn.Conv1d):               # Gated DeltaNet: conv in/out, chunked recurrent states
            b += 2 * 2 * m.in_channels
            b += 4 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim / GDN_CHUNK
    return b


def qad_plan(cfg, world: int) -> dict[str, Any]:
    """GiB per GPU of ``train_qad`` on ``world`` GPUs, one micro-batch of ``cfg.micro_batch_size`` rows (0: the
    batch over the GPUs)."""
    from .models import target_config
    from .quant import module_matches
    tcfg, source = target_config(cfg.target)
    model = _meta_model(tcfg)
    quant = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"
             and module_matches(n, cfg.quant_targets)}
    n_all = sum(p.numel() for p in model.parameters())            # tied embeddings counted once
    n_q = sum(m.weight.numel() for m in quant.values())
    n_scale = n_q // cfg.group_size
    trained = n_q * ("latent" in cfg.train_params) + n_scale * ("scale" in cfg.train_params)
    per_layer = max(sum(m.weight.numel() for n, m in quant.items() if n.startswith(f"model.layers.{i}."))
                    for i in range(tcfg.num_hidden_layers))
    micro = cfg.micro_batch_size or max(1, cfg.batch_size // world)
    tokens = micro * cfg.seq_len
    layer_act = [_layer_act_bytes(layer, tcfg) for layer in model.model.layers]
    act = tokens * sum(layer_act)
    tdt = 2 if cfg.dtype in ("bfloat16", "float16") else 4
    items = {
        "teacher (replicated)": tdt * n_all,
        "student frozen tensors, fp32 (replicated)": 4 * (n_all - n_q),
        "scales, fp32 (replicated)": 4 * n_scale,
        "trainable master weights, fp32 (1/N)": 4 * trained / world,
        "gradients, fp32 (1/N)": 4 * trained / world,
        "AdamW moments, fp32 (1/N)": 8 * trained / world,
        "best-step snapshot + initial codes (1/N)": (4 * trained * bool(cfg.select_seqs) + n_q) / world,
        "FSDP units in flight: 2 layers fp32 + 1 layer of gradients": 3 * 4 * per_layer,
        "bf16 on-grid weights kept for backward": 2 * n_q,
        f"activations ({micro} x {cfg.seq_len} tokens, estimate)": act,
        f"logits of one {cfg.kl_chunk_tokens}-token KL chunk (transient)":
            4 * 4 * min(cfg.kl_chunk_tokens, tokens) * tcfg.vocab_size,
    }
    # per-layer activation checkpointing (QADConfig.activation_checkpointing): each layer keeps only its fp32 input;
    # one layer's activations and on-grid weights exist at a time, during its recomputation
    ckpt = sum(items.values()) - act - 2 * n_q + tokens * (4 * tcfg.hidden_size * len(layer_act) + max(layer_act)) \
        + 2 * per_layer
    return _result(items, world, source, {"params": n_all, "quantized_params": n_q, "micro_batch": micro,
                                          "total_gib_with_layer_checkpointing": ckpt / GiB,
                                          "activation_checkpointing": cfg.activation_checkpointing})


def drafter_plan(cfg, world: int, target: str) -> dict[str, Any]:
    """GiB per GPU of ``train_drafter`` on ``world`` GPUs against ``target`` (the data stage's target)."""
    from .drafter import DFlashDraftModel, build_drafter_config
    from .models import target_config
    tcfg, source = target_config(target)
    n_target = sum(p.numel() for p in _meta_model(tcfg).parameters())
    dcfg = build_drafter_config(tcfg, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, cfg.mask_token_id or 0,
                                cfg.intermediate_size)
    with torch.device("meta"):
        d = DFlashDraftModel(dcfg)
    n_d = sum(p.numel() for p in d.parameters())
    unit = max(sum(p.numel() for p in layer.parameters()) for layer in d.layers)
    micro = cfg.micro_batch_size or max(1, cfg.batch_size // world)
    h, n_t = tcfg.hidden_size, len(cfg.target_layer_ids)
    q, c = cfg.num_anchors * cfg.block_size, cfg.max_len           # query positions, context tokens per row
    hd = dcfg.head_dim
    kv = 2 * dcfg.num_key_value_heads * hd
    per_layer = q * _layer_act_bytes(d.layers[0], dcfg) + c * 2 * 2 * (h + kv)   # queries; context k/v projections
    mp = 2 if cfg.dtype == "bfloat16" else 4
    items = {
        "target (replicated)": mp * n_target,
        "drafter master weights, fp32 (1/N)": 4 * n_d / world,
        "gradients, fp32 (1/N)": 4 * n_d / world,
        "AdamW moments, fp32 (1/N)": 8 * n_d / world,
        "FSDP units in flight: 2 layers + 1 layer of fp32 gradients": (2 * mp + 4) * unit,
        f"activations ({micro} row(s): {q} queries over {c} context tokens, estimate)": micro * (
            c * n_t * h * 2 + c * h * 10 + cfg.num_layers * per_layer + q * (q + c)),
        "logits of the supervised positions (transient)":
            micro * q * (cfg.block_size - 1) / cfg.block_size * tcfg.vocab_size * (mp + 4 + 4),
    }
    return _result(items, world, source, {"drafter_params": n_d, "target_params": n_target, "micro_batch": micro})


def _result(items: dict[str, float], world: int, source: str, extra: dict) -> dict[str, Any]:
    gib = {k: v / GiB for k, v in items.items()}
    return {"world": world, "gib": gib, "total_gib": sum(gib.values()), "shapes": source, **extra}


def table(preset: str, worlds: tuple[int, ...], micro: int = 1) -> str:
    """Markdown: the per-GPU terms of QAD and drafter training for each GPU count, one micro-batch of ``micro``."""
    from .config import DataConfig, DrafterConfig, QADConfig, load_config
    qcfg = load_config(QADConfig, preset, micro_batch_size=micro)
    dcfg = load_config(DrafterConfig, preset, micro_batch_size=micro)
    target = load_config(DataConfig, preset).target
    lines = []
    for name, plans in (("QAD (stage 01)", [qad_plan(qcfg, w) for w in worlds]),
                        ("drafter (stages 02/03)", [drafter_plan(dcfg, w, target) for w in worlds])):
        lines += [f"| {name}, GiB per GPU | " + " | ".join(f"{w} GPU" + "s" * (w > 1) for w in worlds) + " |",
                  "|---" * (len(worlds) + 1) + "|"]
        for k in plans[0]["gib"]:
            lines.append(f"| {k} | " + " | ".join(f"{p['gib'][k]:.1f}" for p in plans) + " |")
        lines += ["| **total** | " + " | ".join(f"**{p['total_gib']:.1f}**" for p in plans) + " |"]
        if "total_gib_with_layer_checkpointing" in plans[0]:
            lines.append("| total with per-layer activation checkpointing (`activation_checkpointing`) | " + " | ".join(
                f"{p['total_gib_with_layer_checkpointing']:.1f}" for p in plans) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="full")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--micro-batch", type=int, default=1, help="rows per forward (micro_batch_size)")
    a = ap.parse_args(argv)
    print(table(a.preset, tuple(a.gpus), a.micro_batch))


if __name__ == "__main__":
    main()
