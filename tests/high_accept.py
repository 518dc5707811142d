"""A high-acceptance fixture (issue 16): a tiny target that has learned a deterministic rule and DFlash drafters that
have learned it from the target's features, so that acceptance is high (tau >= 3 of 4) and an error in the layer
indices, the block mask or the window shows as a large drop instead of hiding at tau ~1.

The rule: tokens 200..215 (16 values v), x_t = (x_{t-1} + x_{t-2}) mod 16. Block position k of a B=4 block needs the
anchor and the last context token (x_{s+k} = F_k x_s + F_{k-1} x_{s-1} mod 16), so a drafter that sees the wrong
context (a window one token too short, the wrong target layers) loses whole positions.

``build(out)`` (~20 s on 2 CPU cores) writes the trained target (HF checkpoint with the tiny tokenizer, loadable by
vLLM) and drafters: ``fp32`` (no window), ``w4a16`` (RTN INT4, group 32, compressed-tensors pack-quantized),
``w8a16`` (llmcompressor RTN INT8, the stage-04 function), ``swa5`` (trained with the window W=5: block position k
sees the last 4-k context tokens), ``vocab64`` (the fp32 drafter restricted to a 64-token draft vocabulary: the
rule's 16 tokens and 48 others) with its vLLM export ``vocab64_vllm``, the same for the W4A16 drafter
(``w4a16_vocab64``, packed, and ``w4a16_vocab64_vllm``), and returns their paths with held-out prompts.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

BASE, VOCAB, SEQ = 200, 16, 96
B, LAYERS, SWA = 4, (0, 2), 5
STEPS, BATCH = 150, 16


def sequences(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        a, b = (int(x) for x in torch.randint(0, VOCAB, (2,), generator=g))
        s = [a, b]
        while len(s) < length:
            s.append((s[-1] + s[-2]) % VOCAB)
        out.append([BASE + x for x in s])
    return out


def _train_target(path: Path) -> float:
    """Teach the tiny random target the rule; returns its greedy next-token accuracy on held-out sequences."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qdflash.models import resolve_target
    src = resolve_target("tiny")
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    data = torch.tensor(sequences(2048, SEQ, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        idx = torch.randint(0, len(data), (BATCH,), generator=g)
        x = data[idx]
        logits = m(input_ids=x).logits[:, 1:-1]          # positions >= 2 are determined by the rule
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        x = torch.tensor(sequences(64, SEQ, 2))
        acc = float((m(input_ids=x).logits[:, 1:-1].argmax(-1) == x[:, 2:]).float().mean())
    m.save_pretrained(path)
    AutoTokenizer.from_pretrained(src).save_pretrained(path)
    return acc


def _train_drafter(target, window: int | None, seed: int):
    from qdflash.config import DrafterConfig, load_config
    from qdflash.drafter import new_drafter, target_features
    from qdflash.drafter_train import drafter_loss, make_batch
    cfg = load_config(DrafterConfig, "tiny", block_size=B, target_layer_ids=LAYERS, num_anchors=16, max_len=SEQ,
                      train_window=window)
    seqs = sequences(256, SEQ, 3)
    rows = [{"input_ids": s, "loss_mask": [0, 0] + [1] * (SEQ - 2)} for s in seqs]
    with torch.no_grad():
        hs = target(input_ids=torch.tensor(seqs), output_hidden_states=True).hidden_states
        feats = list(target_features(hs, LAYERS))
    d = new_drafter(target, 1, B, LAYERS, 0, seed=seed, init="target_norm", sliding_window=window)
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    for _ in range(12):
        order = torch.randperm(len(rows), generator=gen).tolist()
        for i in range(0, len(order), 16):
            batch = make_batch(rows, feats, order[i:i + 16], cfg, 0, gen, gamma=4.0)
            loss, _ = drafter_loss(d, embed, head, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return d.eval()


@torch.enable_grad()                  # the fixture trains, also when called under no_grad
def build(out: str | Path) -> dict:
    """Build (or reuse, when ``out/fixture.json`` exists) the fixture under ``out``; see the module docstring."""
    from qdflash.drafter import export_draft_vocab_for_vllm, save_drafter, set_draft_vocab
    from qdflash.drafter_quant import rtn_w8_drafter, save_packed_drafter
    from qdflash.models import load_model
    from qdflash.quant import absmax_scale, fake_quant
    out = Path(out)
    meta = out / "fixture.json"
    if meta.exists():
        return json.loads(meta.read_text())
    out.mkdir(parents=True, exist_ok=True)
    acc = _train_target(out / "target")
    target = load_model(str(out / "target"), "float32", "cpu")
    for p in target.parameters():
        p.requires_grad_(False)
    paths = {"target": str(out / "target")}
    full = _train_drafter(target, None, 0)
    paths["fp32"] = str(save_drafter(full, out / "drafter-fp32"))
    d4, scales = copy.deepcopy(full), {}          # RTN INT4, group 32: every Linear on its grid
    with torch.no_grad():
        for n, m in d4.named_modules():
            if isinstance(m, torch.nn.Linear):
                scales[n] = absmax_scale(m.weight, 32, 4)
                m.weight.copy_(fake_quant(m.weight, scales[n], 32, 4))
    paths["w4a16"] = str(save_packed_drafter(d4, scales, 4, 32, out / "drafter-w4a16"))
    paths["w8a16"] = str(rtn_w8_drafter(paths["fp32"], 32, out / "drafter-w8a16"))
    paths["swa5"] = str(save_drafter(_train_drafter(target, SWA, 1), out / "drafter-swa5"))
    vocab = list(range(48)) + list(range(BASE, BASE + VOCAB))        # draft index != token id: d2t offsets matter
    paths["vocab64"] = str(save_drafter(set_draft_vocab(copy.deepcopy(full), vocab), out / "drafter-vocab64"))
    head = target.get_output_embeddings().weight
    paths["vocab64_vllm"] = str(export_draft_vocab_for_vllm(paths["vocab64"], head, out / "drafter-vocab64-vllm"))
    paths["w4a16_vocab64"] = str(save_packed_drafter(set_draft_vocab(copy.deepcopy(d4), vocab), scales, 4, 32,
                                                     out / "drafter-w4a16-vocab64"))
    paths["w4a16_vocab64_vllm"] = str(export_draft_vocab_for_vllm(paths["w4a16_vocab64"], head,
                                                                  out / "drafter-w4a16-vocab64-vllm"))
    prompts = [s[:40] for s in sequences(8, 40, 4)]
    res = {"paths": paths, "prompts": prompts, "target_accuracy": acc, "window": SWA, "block_size": B}
    meta.write_text(json.dumps(res))
    return res
