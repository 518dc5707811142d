"""Random drafters of the ``smol-gpu-xl`` shape for vLLM step costs on the CPU (``benchmarks/cpu-vllm-regime/``):
weights that no target accepts, so every speculative step drafts k tokens and verifies k + 1, and the step time is
the cost of that shape alone.

Writes under OUT: ``drafter-random-L4-b8`` (bf16, ``drafter.new_drafter`` with the preset's layers, block, target
layers, mask token and init), ``-w4a16-g32`` (the same weights on a W4A16 RTN grid, group 32, ``fc`` included,
pack-quantized by ``drafter_quant.save_packed_drafter`` as stage 04 saves its GPTQ drafter) and
``-w4a16-g32-v8k-vllm`` (that one with a draft vocabulary of 8,192 tokens: those the smol training answers of
RUNS/00_data use, filled with the lowest other ids, since the cost depends on the size; exported in vLLM's form by
``drafter.export_draft_vocab_for_vllm``).

    .venv/bin/python benchmarks/regime_shaped_drafters.py --runs runs/smol --out /tmp/xld
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/smol", help="a run with 00_data (the draft vocabulary's token counts)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    from qdflash.config import DrafterConfig, load_config
    from qdflash.data import load_split
    from qdflash.drafter import (export_draft_vocab_for_vllm, load_drafter, most_frequent_tokens, new_drafter,
                                 save_drafter, set_draft_vocab)
    from qdflash.drafter_quant import _linears, observer_scales, quant_args, save_packed_drafter
    from qdflash.models import load_model, load_tokenizer, mask_token_id
    from qdflash.quant import dequantize, quantize_ints
    out = Path(a.out)
    cfg = load_config(DrafterConfig, "smol-gpu-xl")
    target, tok = load_model("smol", "float32", "cpu"), load_tokenizer("smol")
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok, cfg.mask_token_id),
                    init=cfg.init).to(torch.bfloat16)
    bf16 = save_drafter(d, out / "drafter-random-L4-b8", {"note": "random weights of the smol-gpu-xl drafter's shape"})
    d, scales = load_drafter(bf16), {}
    for name, lin in _linears(d, True).items():
        s = observer_scales(lin.weight.data, quant_args(4, 32))[0].to(torch.float32)
        lin.weight.data.copy_(dequantize(quantize_ints(lin.weight.data.float(), s, 32, 4), s, 32).to(lin.weight.dtype))
        scales[name] = s
    w4 = save_packed_drafter(d, scales, 4, 32, out / "drafter-random-L4-b8-w4a16-g32",
                             {"note": "random weights on a W4A16 RTN grid (group 32)"})
    used, _ = most_frequent_tokens(load_split(Path(a.runs) / "00_data", "train"), a.vocab)
    used = set(used)
    ids = sorted(used | set([t for t in range(target.config.vocab_size) if t not in used][: a.vocab - len(used)]))
    # this package's form (d2t = the token ids), packed as the W4A16 one, then vLLM's form
    v8 = save_packed_drafter(set_draft_vocab(d, ids), scales, 4, 32, out / "drafter-random-L4-b8-w4a16-g32-v8k",
                             {"note": "random weights on a W4A16 RTN grid (group 32), an 8K draft vocabulary"})
    vllm = export_draft_vocab_for_vllm(v8, target.get_output_embeddings().weight, v8.with_name(v8.name + "-vllm"))
    print(json.dumps({"bf16": str(bf16), "w4a16": str(w4), "w4a16_v8k_vllm": str(vllm), "answer_tokens": len(used),
                      "draft_vocab": len(ids)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
