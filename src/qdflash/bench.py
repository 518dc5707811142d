"""GPU benchmark (issue: performance on one H200). Every number is a ratio or rate measured in the same run.

``python -m qdflash.bench hw|train|decode|shapes --runs runs/smol --out benchmarks/bench-h200/results-h200.json``

* ``hw``: measured bf16 matmul rate (8192^3) and device copy bandwidth: the denominators for MFU and the
  memory-bandwidth floor.
* ``train``: throughput (tokens/s) and MFU of the smol pipeline's compute kernels on the device: target
  regeneration (batched greedy decode), one QAD step (teacher forward + fake-quant student forward/backward with
  chunked KL) and one drafter training step (block forward/backward over anchors), in bf16.
* ``decode``: batch-1 reference decoder, plain vs speculative with the fp32, W8A16 and W4A16 drafters of a run
  (tokens/s, speedup, tau, drafter share), with the plain rate set against the weight-bytes / bandwidth floor.
* ``shapes``: random weights at the real shapes (a Qwen3.5-4B-shaped target and a 5-layer, B=16 DFlash drafter):
  verifier cost for 16 tokens vs 1, drafter cost per step, and the projected speedup at tau = 3.6 and 6.5
  (an on-paper projection at full scale, stated as such).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .runio import read_json, write_json


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timeit(fn, warmup=3, iters=10) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - t) / iters


def hw() -> dict:
    dev = "cuda"
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = timeit(lambda: a @ b)
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    tc = timeit(lambda: y.copy_(x), 2, 10)
    return {"device": torch.cuda.get_device_name(), "bf16_matmul_tflops": 2 * 8192**3 / t / 1e12,
            "copy_bandwidth_gbs": 2 * x.numel() * 2 / tc / 1e9, "torch": torch.__version__}


def _matmul_params(model) -> int:
    """Parameters that take part in matmuls per token (embedding lookup excluded, lm_head included)."""
    n = sum(p.numel() for n_, p in model.named_parameters() if "embed_tokens" not in n_)
    if getattr(model.config, "tie_word_embeddings", False):
        n += model.get_input_embeddings().weight.numel()
    return n


def train_throughput(runs: Path, peak_tflops: float, dtype=torch.bfloat16) -> dict:
    from .config import DrafterConfig, load_config
    from .data import load_split
    from .drafter import new_drafter
    from .drafter_train import drafter_loss, make_batch, precompute_features
    from .models import load_model, load_tokenizer, mask_token_id, resolve_target
    from .qad import collate, kl_loss
    from .quant import FakeQuantLinear, absmax_scale, apply_fake_quant
    out = {}
    spec = read_json(runs / "00_data" / "config.json")["target"]
    tok = load_tokenizer(spec)
    target = load_model(resolve_target(spec), "bfloat16", "cuda")
    N = _matmul_params(target)
    rows = load_split(runs / "00_data", "train")
    # 1) regeneration: batched greedy decode, fixed length (no EOS) so the token count is exact
    from .config import DataConfig
    dcfg = load_config(DataConfig, "smol", batch_size=64, max_new_tokens=128)
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows[:64]]
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(p[::-1]) for p in prompts], batch_first=True,
                                          padding_value=tok.pad_token_id).flip(1).cuda()
    att = (ids != tok.pad_token_id).long()
    gen = lambda: target.generate(input_ids=ids, attention_mask=att, max_new_tokens=dcfg.max_new_tokens,  # noqa
                                  min_new_tokens=dcfg.max_new_tokens, do_sample=False,
                                  pad_token_id=tok.pad_token_id)
    t = timeit(gen, 1, 2)
    toks = 64 * 128
    out["regeneration"] = {"batch": 64, "new_tokens": 128, "tokens_per_s": toks / t,
                           "mfu": 2 * N * toks / t / (peak_tflops * 1e12)}
    # 2) QAD step (bf16, batch 8 x 512)
    teacher = target
    student = load_model(resolve_target(spec), "bfloat16", "cuda")
    names = {n: m for n, m in student.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    apply_fake_quant(student, {n: absmax_scale(m.weight, 32, 4) for n, m in names.items()}, 32)
    params = [m.weight for m in student.modules() if isinstance(m, FakeQuantLinear)]
    for p in student.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-5)
    long_rows = sorted(rows, key=lambda r: -len(r["input_ids"]))[:8]
    batch = collate([{**r, "input_ids": (r["input_ids"] * 4)[:512], "loss_mask": (r["loss_mask"] * 4)[:512]}
                     for r in long_rows], 512, tok.pad_token_id)
    n_tok = int(batch["attention_mask"].sum())

    def qad_step():
        loss, _ = kl_loss(student, teacher, batch, 2048)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    t = timeit(qad_step, 2, 5)
    flops = (2 * N + 6 * N) * n_tok          # teacher forward + student forward/backward
    out["qad_step"] = {"batch_tokens": n_tok, "tokens_per_s": n_tok / t, "step_s": t,
                       "mfu": flops / t / (peak_tflops * 1e12)}
    del student, opt
    torch.cuda.empty_cache()
    # 3) drafter step (bf16): features precomputed once (frozen target), as in training
    cfg = load_config(DrafterConfig, "smol", batch_size=8, max_len=512)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids,
                    mask_token_id(tok, cfg.mask_token_id)).cuda().to(dtype)
    drows = [{**r, "input_ids": (r["input_ids"] * 4)[:512], "loss_mask": (r["loss_mask"] * 4)[:512]}
             for r in long_rows]
    feats = precompute_features(target, drows, cfg.target_layer_ids, 512)
    g = torch.Generator().manual_seed(0)
    b = make_batch(drows, feats, list(range(8)), cfg, d.mask_token_id, g, 4.0)
    opt = torch.optim.AdamW(d.parameters(), lr=1e-4)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()

    def dstep():
        loss, _ = drafter_loss(d, embed, head, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    t = timeit(dstep, 2, 5)
    n_q = int(b["noise_ids"].numel())
    n_sup = int((b["weights"] > 0).sum())
    nd = sum(p.numel() for p in d.parameters())
    n_ctx = int(sum(len(r["input_ids"]) for r in drows))
    V, H = head.weight.shape
    # context tokens go through fc and every layer's k_proj/v_proj only (their K/V are injected)
    ctx_params = d.fc.weight.numel() + sum(l.self_attn.k_proj.weight.numel() + l.self_attn.v_proj.weight.numel()
                                           for l in d.layers)
    flops = 6 * nd * n_q + 6 * V * H * n_sup + 6 * ctx_params * n_ctx
    out["drafter_step"] = {"seq_tokens": n_ctx, "block_tokens": n_q, "seq_tokens_per_s": n_ctx / t, "step_s": t,
                           "mfu": flops / t / (peak_tflops * 1e12), "drafter_params": nd}
    return out


def decode_bench(runs: Path, bw_gbs: float, n_prompts: int = 6, new_tokens: int = 96) -> dict:
    from .drafter import load_drafter
    from .drafter_train import eval_prompts
    from .models import load_model, load_tokenizer
    from .speculative import compare_with_plain
    qm = read_json(runs / "01_qad" / "metrics.json")
    fm = read_json(runs / "03_drafter_finetune" / "metrics.json")
    tdir = str(runs / "01_qad" / qm["names"]["qad"])
    tok = load_tokenizer(tdir)
    target = load_model(tdir, "bfloat16", "cuda")
    paths = {"fp32": runs / "03_drafter_finetune" / fm["drafters"]["two_stage"]}
    for k in ("w8a16", "w4a16"):   # the stage-04 checkpoints (their metrics are not needed here)
        paths[k] = next(iter(sorted((runs / "04_drafter_quant").glob(f"drafter-{k}-*[!p]"))))
    drafters = {k: load_drafter(p).cuda().to(torch.bfloat16) for k, p in paths.items()}
    prompts = eval_prompts(runs / "00_data", n_prompts)
    compare_with_plain(target, prompts[:1], 16, drafters, 0.0, tok.eos_token_id)     # warm-up
    res = compare_with_plain(target, prompts, new_tokens, drafters, 0.0, tok.eos_token_id)
    wbytes = sum(p.numel() * p.element_size() for p in target.parameters())
    floor_tok_s = bw_gbs * 1e9 / wbytes
    res["plain"]["bandwidth_floor_tokens_per_s"] = floor_tok_s
    res["plain"]["fraction_of_floor"] = res["plain"]["tokens_per_s"] / floor_tok_s
    res["note"] = ("reference decoder, eager PyTorch, bf16, batch 1; the QAD W4A16 target and the W8A16/W4A16 "
                   "drafters run de-quantized to bf16 (models.load_model; since 2026-12-03, before which the target "
                   "ran transformers' compressed modules), so the floor counts the bf16 bytes the decoder reads; "
                   "the drafters' tau shows the quantization effect, not their speed")
    return res


def shapes_bench(ctx_len: int = 1024) -> dict:
    from transformers import Qwen3Config
    from .drafter import DraftCache, DFlashDraftModel, build_drafter_config
    dev, dt = "cuda", torch.bfloat16
    out = {}
    try:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        from .models import QWEN35_4B
        tcfg = Qwen3_5TextConfig(**{**QWEN35_4B, "max_position_embeddings": 32768})
        target = Qwen3_5ForCausalLM(tcfg).to(dev, dt).eval()
        name = "Qwen3.5-4B-shaped (GDN hybrid)"
    except Exception as e:  # pragma: no cover
        out["qwen3_5_error"] = repr(e)
        tcfg = Qwen3Config(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
        from transformers import Qwen3ForCausalLM
        target = Qwen3ForCausalLM(tcfg).to(dev, dt).eval()
        name = "Qwen3-4B-shaped (dense)"
    dcfg = build_drafter_config(Qwen3Config(hidden_size=2560, intermediate_size=9728, num_hidden_layers=32,
                                            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                            vocab_size=248320, max_position_embeddings=262144),
                                5, 16, [1, 8, 15, 22, 29], 248070)
    drafter = DFlashDraftModel(dcfg).to(dev, dt).eval()
    from transformers import DynamicCache
    with torch.no_grad():
        ids = torch.randint(0, 1000, (1, ctx_len), device=dev)
        cache = DynamicCache(config=target.config)
        target(input_ids=ids, past_key_values=cache, use_cache=True)

        from .decode_steps import rollback_block, snapshot_recurrent
        snapshot = snapshot_recurrent(cache)   # the decoder's own rollback: GDN states restored, attention KV cropped

        def verify(n):
            def f():
                pos = torch.arange(ctx_len, ctx_len + n, device=dev)[None]
                target(input_ids=ids[:, :n], position_ids=pos, past_key_values=cache, use_cache=True,
                       output_hidden_states=True)
                if snapshot is not None:
                    rollback_block(cache, snapshot, n)
                else:
                    cache.crop(-n)
            return f
        t1 = timeit(verify(1), 3, 20)       # includes the rollback, as one step of the reference decoder does
        t16 = timeit(verify(16), 3, 20)
        dc = DraftCache()
        ctx = torch.randn(1, ctx_len, 5 * 2560, device=dev, dtype=dt)
        emb = torch.randn(1, 16, 2560, device=dev, dtype=dt)
        drafter(emb, ctx, torch.arange(ctx_len, ctx_len + 16, device=dev)[None],
                torch.arange(ctx_len, device=dev)[None], dc)
        new_ctx = torch.randn(1, 4, 5 * 2560, device=dev, dtype=dt)
        lm_head = target.get_output_embeddings()

        def draft():
            h = drafter(emb, new_ctx, torch.arange(ctx_len, ctx_len + 16, device=dev)[None],
                        torch.arange(ctx_len - 4, ctx_len, device=dev)[None], DraftCache(
                            [k[:, :, :ctx_len - 4] for k in dc.keys], [v[:, :, :ctx_len - 4] for v in dc.values]))
            lm_head(h[:, 1:]).argmax(-1)
        td = timeit(draft, 3, 20)
    out.update({"target": name, "context_tokens": ctx_len, "verify_1_ms": t1 * 1e3, "verify_16_ms": t16 * 1e3,
                "verify_16_over_1": t16 / t1, "draft_step_ms": td * 1e3,
                "drafter_params": sum(p.numel() for p in drafter.parameters()),
                "note": "random weights, eager bf16, batch 1; an on-paper projection of the method at full scale"})
    for tau in (3.6, 6.5):
        out[f"projected_speedup_tau_{tau}"] = tau * t1 / (td + t16)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="+", choices=["hw", "train", "decode", "shapes"])
    ap.add_argument("--runs", default="runs/smol")
    ap.add_argument("--out", default="benchmarks/bench-h200/results-h200.json")
    a = ap.parse_args(argv)
    out_path = Path(a.out)
    res = json.loads(out_path.read_text()) if out_path.exists() else {}
    res["hw"] = res.get("hw") or hw()
    for w in a.what:
        t0 = time.time()
        try:
            if w == "train":
                res["train"] = train_throughput(Path(a.runs), res["hw"]["bf16_matmul_tflops"])
            elif w == "decode":
                res["decode"] = decode_bench(Path(a.runs), res["hw"]["copy_bandwidth_gbs"])
            elif w == "shapes":
                res["shapes"] = shapes_bench()
        except Exception as e:
            import traceback
            res[w + "_error"] = traceback.format_exc()[-3000:]
            print(res[w + "_error"])
        res.setdefault("wall_s", {})[w] = round(time.time() - t0, 1)
        write_json(out_path, res)
    print(json.dumps(res, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
