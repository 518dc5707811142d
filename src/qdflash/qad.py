"""Stage 01: PTQ baselines (RTN, GPTQ W4A16 via llmcompressor) and quantization-aware distillation (QAD).

QAD: the student starts on a fixed INT4 grid (a PTQ result), trains the latent full-precision weights of the
quantized Linears through fake quantization (straight-through estimator) with per-token forward
KL(teacher || student) over the full vocabulary at temperature 1, chunked over tokens (each chunk's logits are
recomputed in backward, so memory is bounded by ``kl_chunk_tokens``). The grid (scales) never moves.
Embeddings, norms and lm_head stay full precision and frozen.

Artifacts (names encode the config): ``ptq-rtn-w4a16-g{G}/``, ``ptq-gptq-w4a16-g{G}/``, ``qad-w4a16-g{G}/``
(compressed-tensors pack-quantized) and ``qad-w4a16-g{G}-twin/`` (dense weights equal to the de-quantized student,
the target for drafter fine-tuning); ``train_log.jsonl``; ``metrics.json``.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import distributed
from .config import QADConfig
from .quant import FakeQuantLinear, quantize_ints
from .decode_stats import BOOTSTRAP_RESAMPLES
from .training import autocast_dtype, lr_at
from .runio import atomic_write_text, library_output_to_log


def names(cfg: QADConfig) -> dict[str, str]:
    g = cfg.group_size
    return {"rtn": f"ptq-rtn-w4a16-g{g}", "gptq": f"ptq-gptq-w4a16-g{g}", "qad": f"qad-w4a16-g{g}",
            "twin": f"qad-w4a16-g{g}-twin"}


# ----------------------------------------------------------------------------------------------- batching
def make_batches(rows: list[dict], batch_size: int, seq_len: int, pad_id: int, seed: int, epoch: int):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(rows), generator=g).tolist()
    for b in range(0, len(order) - batch_size + 1, batch_size):
        yield collate([rows[i] for i in order[b: b + batch_size]], seq_len, pad_id)


def collate(rows: list[dict], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    seqs = [r["input_ids"][:seq_len] for r in rows]
    masks = [r["loss_mask"][:seq_len] for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    lm = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        lm[i, : len(m)] = torch.tensor(m)
    return {"input_ids": ids, "attention_mask": att, "loss_mask": lm}


# ----------------------------------------------------------------------------------------------- loss
def _chunk_kl(h_s: torch.Tensor, h_t: torch.Tensor, w_s: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
    s = F.log_softmax(F.linear(h_s, w_s).float(), -1)
    t = F.log_softmax(F.linear(h_t, w_t).float(), -1)
    return (t.exp() * (t - s)).sum()


def chunked_kl(h_s: torch.Tensor, h_t: torch.Tensor, head_s: torch.nn.Linear, head_t: torch.nn.Linear,
               chunk: int) -> torch.Tensor:
    """Sum over tokens of KL(teacher || student) from final hidden states [N, H]; logits live one chunk at a time."""
    total = h_s.new_zeros((), dtype=torch.float32)
    for i in range(0, h_s.shape[0], chunk):
        total = total + checkpoint(_chunk_kl, h_s[i: i + chunk], h_t[i: i + chunk], head_s.weight,
                                   head_t.weight, use_reentrant=False)
    return total


def kl_loss(student, teacher, batch: dict, chunk: int, compute_dtype: torch.dtype | None = None,
            norm: int | None = None) -> tuple[torch.Tensor, int]:
    """Mean per-token KL(teacher || student) over the valid tokens of ``batch`` (the KL sum over ``norm`` tokens when
    given: a data-parallel micro-batch's share of the global mean). ``compute_dtype`` bfloat16 runs the
    student under autocast (bf16 matmuls over fp32 latents; logits, softmax and KL in fp32)."""
    batch = {k: v.to(student.device) for k, v in batch.items()}
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        h_t = teacher.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    with torch.autocast(student.device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
        h_s = student.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        n = int(valid.sum())
        return chunked_kl(h_s[valid], h_t[valid].to(h_s.dtype), student.lm_head, teacher.lm_head, chunk) / (
            n if norm is None else norm), n


# ----------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def compare_models_to_teacher(models: dict, teacher, rows: list[dict], seq_len: int, pad_id: int, bs: int = 4,
                              per_row: bool = False) -> dict:
    """For each model: token-weighted KL(teacher||model), top-1 agreement with the teacher (all tokens) and the
    model's perplexity on the assistant tokens (next-token). The teacher runs once per batch for all models.
    ``per_row`` adds per-conversation KL sums and token counts (for bootstrap intervals over conversations)."""
    acc = {k: {"kl": 0.0, "agree": 0.0, "n": 0, "nll": 0.0, "n_resp": 0, "row_kl": [], "row_n": []} for k in models}
    for b in range(0, len(rows), bs):
        batch = {k: v.to(teacher.device) for k, v in collate(rows[b: b + bs], seq_len, pad_id).items()}
        valid = batch["attention_mask"].bool()
        pt = F.log_softmax(teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                                   ).logits.float(), -1)
        tgt = batch["input_ids"][:, 1:]
        m = (batch["loss_mask"][:, 1:] * batch["attention_mask"][:, 1:]).bool()
        for name, model in models.items():
            a = acc[name]
            with library_output_to_log():       # a packed model decompresses on its first forward, with bars
                pm = F.log_softmax(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                                         ).logits.float(), -1)
            kl_tok = (pt.exp() * (pt - pm)).sum(-1) * valid
            a["kl"] += float(kl_tok.sum())
            a["agree"] += float(((pt.argmax(-1) == pm.argmax(-1)) & valid).sum())
            a["n"] += int(valid.sum())
            a["row_kl"] += kl_tok.sum(-1).tolist()
            a["row_n"] += valid.sum(-1).tolist()
            lp = pm[:, :-1].gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            a["nll"] -= float(lp[m].sum())
            a["n_resp"] += int(m.sum())
            del pm
    out = {}
    for name, a in acc.items():
        out[name] = {"kl_to_teacher": a["kl"] / a["n"], "top1_agreement": a["agree"] / a["n"],
                     "ppl_assistant": math.exp(a["nll"] / max(1, a["n_resp"])), "eval_tokens": int(a["n"])}
        if per_row:
            out[name].update({"row_kl_sum": a["row_kl"], "row_tokens": a["row_n"]})
    return out


def compare_to_teacher(model, teacher, rows: list[dict], seq_len: int, pad_id: int, bs: int = 4) -> dict:
    return compare_models_to_teacher({"m": model}, teacher, rows, seq_len, pad_id, bs)["m"]


def bootstrap_ratio_diff(a_kl: list[float], b_kl: list[float], n_tok: list[int], n_boot: int = BOOTSTRAP_RESAMPLES,
                         seed: int = 0) -> dict:
    """Paired bootstrap over conversations of the token-weighted KL difference a - b and the ratio a / b
    (same conversations, same tokens for both models)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    a, b, n = np.asarray(a_kl), np.asarray(b_kl), np.asarray(n_tok, dtype=float)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    sa, sb, sn = a[idx].sum(1), b[idx].sum(1), n[idx].sum(1)
    diff = (sa - sb) / sn
    with np.errstate(divide="ignore", invalid="ignore"):   # b summing to 0 (tiny item counts): no ratio, no warning
        ratio, point = sa / sb, a.sum() / b.sum()
    ratio = ratio[np.isfinite(ratio)]           # a resample whose b sums to 0 has no ratio (tiny item counts only)
    return {"diff": float((a.sum() - b.sum()) / n.sum()), "diff_ci95": np.percentile(diff, [2.5, 97.5]).tolist(),
            "ratio": float(point),              # b never above 0 (e.g. no item right): no ratio, no interval
            "ratio_ci95": np.percentile(ratio, [2.5, 97.5]).tolist() if len(ratio) else [float("nan")] * 2,
            "n_conversations": int(len(a)), "n_boot": n_boot}


# ----------------------------------------------------------------------------------------------- training
def local_codes(m: FakeQuantLinear) -> torch.Tensor:
    """``m.codes()``; under FSDP, the codes of this rank's rows of the sharded latents (no gather)."""
    if not distributed.is_sharded(m.weight):
        return m.codes()
    w, rows = distributed.local_rows(m.weight.detach())
    return quantize_ints(w.float(), distributed.local_rows(m.grid_scale().detach(), rows)[0], m.group, m.bits)


def codes_changed(fq: dict, init_codes: dict) -> tuple[float, dict[str, float]]:
    """Fraction of INT4 codes that differ from the initial grid, overall and per layer (over all ranks' shards)."""
    counts = {n: (int((local_codes(m).to(torch.int8) != init_codes[n]).sum()), init_codes[n].numel())
              for n, m in fq.items()}
    dp = distributed.current()
    if dp is not None:
        flat = [int(x) for x in dp.all_sum([x for c in counts.values() for x in c])]
        counts = dict(zip(counts, zip(flat[::2], flat[1::2])))
    per, changed, total = {}, 0, 0
    for n, (c, size) in counts.items():
        per[n] = c / size
        changed, total = changed + c, total + size
    return changed / max(1, total), per


def train_qad(cfg: QADConfig, student, teacher, rows: list[dict], pad_id: int, ckpt_dir: Path,
              log_path: Path, progress: bool = True, select_rows: list[dict] | None = None) -> tuple[list, dict]:
    """Train the student in place; returns (per-step log, summary). Resumable from ``ckpt_dir/last.pt``.

    Logged per step: KL, lr, grad norm, tokens/s; every ``eval_every // 5`` steps the fraction of INT4 codes changed
    from the initial grid (a full pass over the codes costs about as much as an optimizer step).
    Every ``eval_every`` steps (and at step 0) the KL on ``select_rows`` (held out from training) is measured and
    the best latents/scales are kept; at the end the student is restored to the best ones. Under torchrun
    (``distributed``) the student is FSDP-sharded in place and stays so; the checkpoint is ``ckpt_dir/last.dcp``."""
    from tqdm.auto import tqdm
    dp = distributed.current()
    fq = {n: m for n, m in student.named_modules() if isinstance(m, FakeQuantLinear)}
    latents = [m.weight for m in fq.values()] if "latent" in cfg.train_params else []
    scales = [m.weight_scale for m in fq.values() if m.learn_scale]
    student.requires_grad_(False)
    params = latents + scales
    for p in params:
        p.requires_grad_(True)
    half_steps = torch.cat([(m.weight_scale.detach().float() / 2).flatten() for m in fq.values()])
    median_half = float(half_steps.median())
    if cfg.activation_checkpointing:     # transformers' per-decoder-layer checkpointing (non-reentrant: FSDP2-safe)
        student.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if dp is not None:                   # FSDP2: the trainable tensors sharded, one unit per decoder layer
        dp.shard(student, student.model.layers, root=student.model)
        latents = [m.weight for m in fq.values()] if "latent" in cfg.train_params else []
        scales = [m.weight_scale for m in fq.values() if m.learn_scale]
        params = latents + scales
    else:
        distributed.check_one_process_batch(cfg.batch_size, cfg.micro_batch_size)
    groups = ([{"params": latents, "base_lr": cfg.lr}] if latents else []) + \
        ([{"params": scales, "base_lr": cfg.scale_lr or cfg.lr}] if scales else [])
    opt = torch.optim.AdamW([{**g, "lr": g["base_lr"]} for g in groups], betas=tuple(cfg.betas), weight_decay=0.0,
                            fused=True)           # one fused kernel over the 100M+ latents (CPU and CUDA)
    cdt = autocast_dtype(cfg)
    init_codes = {n: local_codes(m).to(torch.int8) for n, m in fq.items()}
    eval_every = cfg.eval_every or max(1, cfg.steps // 10)
    step, log, evals, best = 0, [], [], None
    state_file = ckpt_dir / "last.pt"
    if dp is not None:
        got = dp.load(ckpt_dir / "last.dcp", student, opt, state_file, lambda meta: {
            f"best.{i}": p.detach().clone() for i, p in enumerate(params)} if meta.get("best") else {})
        if got is not None:
            meta, extra = got
            step, log, evals, best = meta["step"], meta["log"], meta["evals"], meta["best"]
            if best is not None:
                best["params"] = [extra[f"best.{i}"] for i in range(len(params))]
            torch.set_rng_state(meta["rng"])
    elif state_file.exists():  # resume
        try:
            st = torch.load(state_file, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"QAD checkpoint {state_file} is corrupt; delete it to restart: {e}") from e
        if [tuple(v.shape) for v in st["params"]] != [tuple(p.shape) for p in params]:
            raise ValueError(f"QAD checkpoint {state_file} holds other trainable tensors (train_params changed?); "
                             "delete it to restart")
        with torch.no_grad():
            for p, v in zip(params, st["params"]):
                p.copy_(v)
        opt.load_state_dict(st["opt"])
        step, log, evals, best = st["step"], st["log"], st.get("evals", []), st.get("best")
        torch.set_rng_state(st["rng"])

    def select_kl() -> float:
        with torch.autocast(student.device.type, dtype=cdt or torch.float32, enabled=cdt is not None):
            kl = compare_models_to_teacher({"s": student}, teacher, select_rows, cfg.seq_len, pad_id)["s"][
                "kl_to_teacher"]
        return kl if dp is None else dp.broadcast(kl)     # every rank keeps the same best step

    def keep_if_best(kl: float) -> None:
        nonlocal best
        evals.append({"step": step, "select_kl": kl})
        if best is None or kl < best["kl"]:
            # sharded tensors stay on their device (one more 1/N copy of the latents)
            best = {"kl": kl, "step": step, "params": [p.detach().float().clone() if dp else
                                                       p.detach().float().cpu().clone() for p in params]}

    if select_rows and not evals:
        student.eval()
        keep_if_best(select_kl())          # step 0: the PTQ start (the paper's step-0 gate)
    student.train()
    if len(rows) < cfg.batch_size:
        raise ValueError(f"QAD has {len(rows)} training conversations for batch_size {cfg.batch_size}: "
                         "lower batch_size or select_seqs, or regenerate more data")
    epoch, skip = divmod(step, len(rows) // cfg.batch_size)     # make_batches drops the last partial batch
    batches = make_batches(rows, cfg.batch_size, cfg.seq_len, pad_id, cfg.seed, epoch)
    for _ in range(max(0, skip)):
        next(batches, None)
    bar = tqdm(total=cfg.steps, initial=step, desc="QAD", disable=not progress or not distributed.is_main())
    while step < cfg.steps:
        batch = next(batches, None)
        if batch is None:
            epoch += 1
            batches = make_batches(rows, cfg.batch_size, cfg.seq_len, pad_id, cfg.seed, epoch)
            continue
        frac = lr_at(step, cfg.steps, cfg.warmup_frac, 1.0)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * frac
        t0 = time.time()
        if dp is None:
            loss, ntok = kl_loss(student, teacher, batch, cfg.kl_chunk_tokens, cdt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            kl, gnorm = float(loss.detach()), float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        else:                            # this rank's micro-batches, each KL sum over the global token count
            opt.zero_grad(set_to_none=True)
            ntok = int(batch["attention_mask"].sum())
            kl = dp.accumulate(dp.micro_batches(batch, cfg.micro_batch_size),
                               lambda b: kl_loss(student, teacher, b, cfg.kl_chunk_tokens, cdt, ntok)[0])
            gnorm = dp.clip_grad_norm(params, cfg.grad_clip)
        opt.step()
        if scales:
            with torch.no_grad():
                for sc in scales:
                    sc.clamp_(min=1e-8)
        step += 1
        rec = {"step": step, "kl": kl, "lr": cfg.lr * frac, "grad_norm": gnorm, "tokens": ntok,
               "tok_per_s": ntok / (time.time() - t0)}
        if step % max(1, eval_every // 5) == 0 or step == cfg.steps:     # a full pass over the codes: not every step
            rec["codes_changed"] = codes_changed(fq, init_codes)[0]
        log.append(rec)
        if select_rows and (step % eval_every == 0 or step == cfg.steps):
            student.eval()
            keep_if_best(select_kl())
            student.train()
        bar.set_postfix(kl=f"{rec['kl']:.4f}", changed=f"{rec.get('codes_changed', float('nan')):.4f}")
        bar.update(1)
        if (step % cfg.save_every == 0 or step == cfg.steps) and dp is not None:
            dp.save(ckpt_dir / "last.dcp", student, opt, {
                "step": step, "log": log, "evals": evals, "rng": torch.get_rng_state(),
                "best": best and {k: v for k, v in best.items() if k != "params"}},
                best and {f"best.{i}": v for i, v in enumerate(best["params"])}, log_path)
        elif step % cfg.save_every == 0 or step == cfg.steps:
            tmp = state_file.with_suffix(".tmp")
            torch.save({"params": [p.detach() for p in params], "opt": opt.state_dict(), "step": step,
                        "log": log, "evals": evals, "best": best, "rng": torch.get_rng_state()}, tmp)
            tmp.replace(state_file)
            atomic_write_text(log_path, "".join(json.dumps(r) + "\n" for r in log))
    bar.close()
    if best is not None and best["step"] != step:
        with torch.no_grad():
            for p, v in zip(params, best["params"]):
                p.copy_(v.to(p.device, p.dtype))
    student.eval()
    changed, per_layer = codes_changed(fq, init_codes)
    lr_sum = sum(r["lr"] for r in log)
    summary = {"select_curve": evals, "best_step": best["step"] if best else step,
               "best_select_kl": best["kl"] if best else None, "codes_changed_final": changed,
               "codes_changed_per_layer": per_layer, "median_half_step": median_half,
               "lr_sum": lr_sum, "lr_sum_over_median_half_step": lr_sum / median_half,
               "train_params": cfg.train_params, "eval_every": eval_every}
    return log, summary


def save_twin(student, base_dir: str, out_dir: Path) -> Path:
    """Dense checkpoint whose Linear weights are the student's de-quantized INT4 weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    twin = AutoModelForCausalLM.from_pretrained(base_dir, dtype=student.dtype)
    with torch.no_grad():
        for n, m in student.named_modules():
            if isinstance(m, FakeQuantLinear):
                twin.get_submodule(n).weight.copy_(m.quantized_weight().cpu())
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    twin.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


# ----------------------------------------------------------------------------------------------- stage
