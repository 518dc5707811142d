"""Stages 02/03: DFlash drafter training (pretrain on the full-precision target, finetune on the QAD target, and the
ablation trained directly on the QAD target with the same total budget), then evaluation with the reference decoder.

One training step, per sequence: sample up to ``num_anchors`` anchors p among assistant tokens (``loss_mask[p]`` and
``loss_mask[p+1]``), fresh every epoch; block n = ``[x_p, MASK x (B-1)]`` at positions p..p+B-1; its queries see
target context strictly before p and their own block only (bidirectional); labels are the same-position tokens
``x_{p+k}``, k >= 1, weighted ``exp(-(k-1)/gamma)``; loss = sum w CE / sum w. AdamW (weight decay 0), linear warmup
then cosine, grad clip. Target hidden states are computed once per target (the target is frozen).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import distributed
from .config import DrafterConfig, default_gamma
from .data import load_split
from .drafter import (DFlashDraftModel, check_window, draft_head_weight, in_window, save_drafter, target_to_draft)
from .losses import linear_cross_entropy
from .training import autocast_dtype, lr_at
from .runio import atomic_write_text, read_json, thin


# ----------------------------------------------------------------------------------------------- features
def precompute_features(target, rows: list[dict], layer_ids, max_len: int, bs: int = 8, progress=False,
                        store_dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Target features of every row, in memory (no cache): ``features.compute_features``."""
    from .features import compute_features
    return [f.to(store_dtype) for f in compute_features(target, rows, layer_ids, max_len, bs, progress)]


def stage_features(target, target_dir: str, rows: list[dict], cfg: DrafterConfig, progress: bool):
    """The drafter's context features for ``rows`` from the shared on-disk cache (computed on first use), or computed
    per batch when ``cfg.feature_cache`` is off."""
    from .features import OnlineFeatures, cached_features
    if not cfg.feature_cache:
        return OnlineFeatures(target, rows, cfg.target_layer_ids, cfg.max_len, static=cfg.compile_features)
    return distributed.main_first(lambda: cached_features(target, target_dir, rows, cfg.target_layer_ids, cfg.max_len,
                                                          cfg.dtype, progress=progress))


# ----------------------------------------------------------------------------------------------- batches
def sample_anchors(loss_mask: list[int], n_max: int, gen: torch.Generator) -> list[int]:
    """Anchor candidates: p with loss_mask[p] and loss_mask[p+1] (at least one supervised label)."""
    cand = [p for p in range(len(loss_mask) - 1) if loss_mask[p] and loss_mask[p + 1]]
    if not cand:
        return []
    k = min(n_max, len(cand))
    pick = torch.randperm(len(cand), generator=gen)[:k].tolist()
    return sorted(cand[i] for i in pick)


def block_mask(anchors: torch.Tensor, ctx_len: torch.Tensor, S: int, B: int,
               window: int | None = None) -> torch.Tensor:
    """bool [b, 1, N*B, S + N*B]: block n sees context j < anchor_n (and j < valid length) plus its own block; with a
    ``window`` W, block position k sees only j >= anchor_n - (W - 1 - k) (``drafter.window_mask``, vLLM's rule)."""
    b, N = anchors.shape
    dev = anchors.device                                                      # built where the drafter runs
    j = torch.arange(S, device=dev)
    a = anchors.repeat_interleave(B, 1)                                       # [b, N*B]
    ctx = (j[None, None, :] < a[:, :, None]) & (j[None, None, :] < ctx_len[:, None, None])
    if window is not None:
        check_window(window, B)
        k = torch.arange(B, device=dev).repeat(N)                             # position inside its block
        ctx = ctx & in_window(j[None, None, :], a[:, :, None], k[None, :, None], window)
    blk = torch.arange(N, device=dev).repeat_interleave(B)
    own = blk[:, None] == blk[None, :]                                        # [N*B, N*B]
    return torch.cat([ctx, own[None].expand(b, -1, -1)], -1)[:, None]


def draw_anchors(rows, idx, cfg: DrafterConfig, gen: torch.Generator) -> list[list[int]]:
    """The anchors ``make_batch`` draws for rows ``idx``, in its order."""
    return [sample_anchors(rows[i]["loss_mask"][: cfg.max_len], cfg.num_anchors, gen) for i in idx]


def make_batch(rows, feats, idx, cfg: DrafterConfig, mask_id: int, gen: torch.Generator, gamma: float,
               drawn: list[list[int]] | None = None, t2d: torch.Tensor | None = None):
    """One training batch of rows ``idx``; its anchors are drawn from ``gen``, or given (``drawn``, from
    ``draw_anchors``). ``t2d`` (``drafter.target_to_draft``): a reduced draft vocabulary; labels become draft
    indices and a label the drafter cannot propose gets weight 0 (EAGLE-3's rule)."""
    B, N = cfg.block_size, cfg.num_anchors
    seqs = [rows[i]["input_ids"][: cfg.max_len] for i in idx]
    lms = [rows[i]["loss_mask"][: cfg.max_len] for i in idx]
    S = max(len(s) for s in seqs)
    b = len(idx)
    ids = torch.zeros((b, S), dtype=torch.long)
    f0 = feats[idx[0]]
    padded = feats.padded_batch(idx, S) if hasattr(feats, "padded_batch") else None
    ctx = padded if padded is not None else torch.zeros((b, S, f0.shape[-1]), dtype=f0.dtype, device=f0.device)
    anchors = torch.zeros((b, N), dtype=torch.long)
    keep = torch.zeros((b, N))
    lens = torch.tensor([len(s) for s in seqs])
    for r, (s, lm, i) in enumerate(zip(seqs, lms, idx)):
        ids[r, : len(s)] = torch.tensor(s)
        if padded is None:                 # one copy per row, unless the features came as one padded batch
            ctx[r, : len(s)] = feats[i][: len(s)]
        a = sample_anchors(lm, N, gen) if drawn is None else drawn[r]
        anchors[r, : len(a)] = torch.tensor(a, dtype=torch.long)
        keep[r, : len(a)] = 1
    k = torch.arange(B)
    pos = anchors[:, :, None] + k                                             # [b, N, B]
    inb = pos < lens[:, None, None]
    lm_t = torch.zeros((b, S + B))
    for r, lm in enumerate(lms):
        lm_t[r, : len(lm)] = torch.tensor(lm, dtype=torch.float32)
    labels = torch.gather(F.pad(ids, (0, B)), 1, pos.reshape(b, -1)).reshape(b, N, B)
    sup = torch.gather(lm_t, 1, pos.reshape(b, -1)).reshape(b, N, B)
    decay = torch.exp(-(k - 1).clamp_min(0).float() / gamma) * (k > 0)
    w = keep[:, :, None] * inb * sup * decay
    if t2d is not None:
        labels = t2d[labels]
        w = w * (labels >= 0)
        labels = labels.clamp_min(0)
    noise = torch.full((b, N, B), mask_id, dtype=torch.long)
    noise[:, :, 0] = torch.where(keep.bool(), torch.gather(ids, 1, anchors), torch.full_like(anchors, mask_id))
    # the mask (b x N*B x (S + N*B) booleans) is built on the features' device: no host-to-device copy of it
    mask = block_mask(anchors.to(ctx.device), lens.to(ctx.device), S, B, cfg.train_window)
    # a padded (unused) block must still see something: let it see its own block only (weight 0 anyway)
    return {"noise_ids": noise.reshape(b, -1), "q_pos": pos.reshape(b, -1), "ctx": ctx,
            "ctx_pos": torch.arange(S)[None].expand(b, -1), "mask": mask, "labels": labels.reshape(b, -1),
            "weights": w.reshape(b, -1), "sup_idx": (w.reshape(-1) > 0).nonzero().squeeze(1)}


def drafter_loss(drafter: DFlashDraftModel, embed, lm_head, batch: dict,
                 compute_dtype: torch.dtype | None = None, denom: float | None = None,
                 ce_chunk: int = 0) -> tuple[torch.Tensor, dict]:
    """Weighted block CE. ``compute_dtype`` bfloat16: autocast (bf16 matmuls over the drafter's fp32 master weights,
    the loss and softmax in fp32); None: everything in the drafter's own dtype. The target's embedding and lm_head
    are used frozen (no gradient reaches them). ``denom``: divide the weighted CE sum by it instead of the batch's
    weight sum (a data-parallel micro-batch's share of the global loss). ``ce_chunk`` > 0: the lm_head and the CE in
    chunks of that many rows (``losses.linear_cross_entropy``: no [rows, vocab] tensor is kept), else in one piece.
    Only the supervised positions (``batch["sup_idx"]``, found on the host by ``make_batch``) reach the lm_head, and
    nothing here waits for the device: ``info["acc"]`` is a device scalar, ``info["n_sup"]`` a host count."""
    dt = next(drafter.parameters()).dtype
    dev = drafter.device
    pin = dev.type == "cuda"
    batch = {k: (v.contiguous().pin_memory() if pin and v.device.type == "cpu" else v).to(dev, non_blocking=True)
             for k, v in batch.items()}
    sel = batch["sup_idx"]
    labels = batch["labels"].reshape(-1).index_select(0, sel)
    w = batch["weights"].reshape(-1).index_select(0, sel)
    with torch.autocast(dev.type, dtype=compute_dtype or dt, enabled=compute_dtype is not None):
        noise, ctx = embed(batch["noise_ids"]), batch["ctx"]
        if compute_dtype is None:
            noise, ctx = noise.to(dt), ctx.to(dt)
        h = drafter(noise, ctx, batch["q_pos"], batch["ctx_pos"], attn_mask=batch["mask"])
        h = h.reshape(-1, h.shape[-1]).index_select(0, sel)
        head = draft_head_weight(drafter, lm_head)      # the lm_head rows of the draft vocabulary (all by default)
        if not ce_chunk:
            logits = F.linear(h, head).float()
    if ce_chunk:
        ce_sum, hits = linear_cross_entropy(h, head, labels, w, ce_chunk, compute_dtype or dt)
    else:
        ce_sum = (F.cross_entropy(logits, labels, reduction="none") * w).sum()
        hits = (logits.argmax(-1) == labels).sum()
    loss = ce_sum / (w.sum() + 1e-6 if denom is None else denom)
    return loss, {"acc": hits.float() / max(1, len(sel)), "n_sup": int(len(sel))}


def _dp_forward_backward(dp, drafter, embed, lm_head, rows, feats, idx, cfg, mask_id, gen, gamma,
                         t2d: torch.Tensor | None) -> tuple[float, dict]:
    """The forwards and backwards of one data-parallel step (``distributed``): every rank draws the anchors of the
    whole global batch (its generator advances as in one process), builds only its own micro-batches, and divides
    each weighted CE sum by the global batch's weight sum. Returns the global loss, accuracy and supervised count."""
    drawn = draw_anchors(rows, idx, cfg, gen)
    slices = dp.micro_slices(len(idx), cfg.micro_batch_size)
    if hasattr(feats, "prefetch"):
        feats.prefetch([i for sl in slices for i in idx[sl]])
    parts = [make_batch(rows, feats, idx[sl], cfg, mask_id, gen, gamma, drawn[sl], t2d) for sl in slices]
    denom = dp.all_sum([sum(float(b["weights"][b["weights"] > 0].sum()) for b in parts)])[0] + 1e-6
    infos: list[dict] = []

    def loss_of(b: dict) -> torch.Tensor:
        loss, info = drafter_loss(drafter, embed, lm_head, b, autocast_dtype(cfg), denom, cfg.ce_chunk)
        infos.append({**info, "acc": float(info["acc"])})
        return loss
    loss = dp.accumulate(parts, loss_of)
    hit, n = dp.all_sum([sum(i["acc"] * i["n_sup"] for i in infos), sum(i["n_sup"] for i in infos)])
    return loss, {"acc": hit / max(1.0, n), "n_sup": int(n)}


LOG_EVERY = 25           # steps between host reads of the training log (each read waits for the device)


def train_drafter(drafter: DFlashDraftModel, target, rows: list[dict], feats, cfg: DrafterConfig, epochs: int,
                  ckpt: Path, log_path: Path, tag: str, progress=True, steps: int | None = None) -> list[dict]:
    """Train in place; resumable from ``ckpt`` (drafter, optimizer, step, log and the epoch's sampling generator
    state), written every ``cfg.save_every`` steps and at each epoch end: a run killed mid-epoch and resumed
    draws the same batches and anchors as an uninterrupted one. Under torchrun the drafter is FSDP-sharded in place
    (it stays sharded on return), steps run this rank's micro-batches, and the checkpoint is ``ckpt`` with the
    suffix ``.dcp`` (``distributed``). ``steps``: train exactly this many optimizer steps (whole epochs, then part of
    one; the learning-rate schedule spans them) instead of ``epochs`` epochs."""
    from tqdm.auto import tqdm
    dp = distributed.current()
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    target.requires_grad_(False)                 # frozen: its embedding / lm_head never accumulate gradients
    drafter.float()                              # fp32 master weights (bf16 params would drop small AdamW updates)
    if dp is not None:                           # FSDP2: one unit per drafter layer plus the root
        dp.shard(drafter, drafter.layers, param_dtype=autocast_dtype(cfg))
    else:
        distributed.check_one_process_batch(cfg.batch_size, cfg.micro_batch_size)
    gamma = cfg.gamma or default_gamma(cfg.block_size)
    mask_id = drafter.mask_token_id
    t2d = target_to_draft(drafter, int(drafter.config.vocab_size))
    steps_per_epoch = max(1, len(rows) // cfg.batch_size)
    total = steps if steps is not None else epochs * steps_per_epoch
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95),
                            fused=True)
    step, log, gen_state = 0, [], None
    dcp_dir = ckpt.with_suffix(".dcp")
    if dp is not None:
        got = dp.load(dcp_dir, drafter, opt, ckpt)
        if got is not None:
            step, log, gen_state = got[0]["step"], got[0]["log"], got[0]["gen_state"]
    elif ckpt.exists():
        try:
            st = torch.load(ckpt, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"drafter checkpoint {ckpt} is corrupt; delete it to restart: {e}") from e
        drafter.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, log, gen_state = st["step"], st["log"], st.get("gen_state")

    def save(gen):
        if dp is not None:
            return dp.save(dcp_dir, drafter, opt, {"step": step, "log": log, "gen_state": gen.get_state()},
                           log_path=log_path)
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"model": drafter.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                    "gen_state": gen.get_state()}, tmp)
        tmp.replace(ckpt)
        atomic_write_text(log_path, "".join(json.dumps(r) + "\n" for r in log))

    drafter.train()
    bar = tqdm(total=total, initial=step, desc=tag, disable=not progress or not distributed.is_main())
    pending: list = []      # steps whose loss / grad norm / accuracy are still device scalars (read every LOG_EVERY)
    t_mark, tok_mark = time.time(), 0
    # training seconds behind each logged step, carried over resumes (the steps a killed run did after its last
    # checkpoint are redone and counted once): a stage cut by a call's deadline reports its whole training time
    # (a log written by code that did not carry them has none: its resumed entries then carry none either)
    t_start, t_before = t_mark, (log[-1].get("train_s") if log else 0.0)

    def flush():            # one host read for many steps: the step loop itself never waits for the device
        nonlocal t_mark, tok_mark
        if not pending:
            return
        dev = next(drafter.parameters()).device
        vals = torch.stack([torch.as_tensor(v, device=dev).detach().float().reshape(())
                            for e in pending for v in (e.pop("_loss"), e.pop("_gn"), e.pop("_acc"))]).tolist()
        vals = [vals[i: i + 3] for i in range(0, len(vals), 3)]
        rate = tok_mark / max(1e-9, time.time() - t_mark)
        for e, (loss_v, gn_v, acc_v) in zip(pending, vals):
            log.append({"step": e["step"], "epoch": e["epoch"], "loss": loss_v, "lr": e["lr"], "grad_norm": gn_v,
                        "tok_per_s": rate, "acc": acc_v, "n_sup": e["n_sup"],
                        **({} if t_before is None else {"train_s": round(t_before + time.time() - t_start, 3)})})
        bar.set_postfix(loss=f"{log[-1]['loss']:.3f}", acc=f"{log[-1]['acc']:.2f}")
        bar.update(len(pending))
        pending.clear()
        t_mark, tok_mark = time.time(), 0

    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        gen = torch.Generator().manual_seed(cfg.seed * 7919 + epoch)       # anchors + order fresh per epoch
        order = torch.randperm(len(rows), generator=gen).tolist()
        if within and gen_state is not None:     # mid-epoch resume: continue the epoch's draws where they stopped
            gen.set_state(gen_state)
        gen_state = None
        for s in range(within, steps_per_epoch):
            if step >= total:               # ``steps``: the last epoch is cut short
                break
            idx = order[s * cfg.batch_size: (s + 1) * cfg.batch_size]
            lr = lr_at(step, total, cfg.warmup_frac, cfg.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            if dp is None:
                if hasattr(feats, "prefetch"):
                    feats.prefetch(idx)
                batch = make_batch(rows, feats, idx, cfg, mask_id, gen, gamma, t2d=t2d)
                loss, info = drafter_loss(drafter, embed, lm_head, batch, autocast_dtype(cfg), ce_chunk=cfg.ce_chunk)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                loss, gn = loss.detach(), torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
            else:
                opt.zero_grad(set_to_none=True)
                loss, info = _dp_forward_backward(dp, drafter, embed, lm_head, rows, feats, idx, cfg, mask_id, gen,
                                                  gamma, t2d)
                gn = dp.clip_grad_norm(list(drafter.parameters()), cfg.grad_clip)
            opt.step()
            step += 1
            tok_mark += sum(len(rows[i]["input_ids"][: cfg.max_len]) for i in idx)
            pending.append({"step": step, "epoch": epoch, "lr": lr, "n_sup": info["n_sup"], "_loss": loss,
                            "_gn": gn, "_acc": info["acc"]})
            if len(pending) >= LOG_EVERY:
                flush()
            if step % cfg.save_every == 0 and s + 1 < steps_per_epoch:
                flush()
                save(gen)
        flush()
        save(gen)
    bar.close()
    drafter.eval()
    return log


# ----------------------------------------------------------------------------------------------- stages
def train_and_save(name, drafter, target, rows, feats, cfg, epochs, out, progress):
    t0 = time.time()
    log = train_drafter(drafter, target, rows, feats, cfg, epochs, out / f"{name}.ckpt.pt",
                        out / f"train_log-{name}.jsonl", name, progress)
    dp, config = distributed.current(), drafter.config
    if dp is not None:                           # the trained tensors gathered into a plain drafter on rank 0
        drafter = dp.unsharded(drafter, lambda: DFlashDraftModel(config))
    path = save_drafter(drafter, out / name, {"epochs": epochs, "steps": len(log)}) if drafter is not None \
        else out / name
    wall = round(time.time() - t0, 2)
    # train_s: the log's training seconds over every process that trained it, with wall_s this process's (a resumed
    # run's wall_s is its last process's only); a log that does not carry them (begun by older code): this process's
    # wall time as train_s, and no wall_s (readers take wall_s as the sign that train_s covers every process)
    carried = bool(log) and "train_s" in log[-1]
    return path, {"steps": len(log), "epochs": epochs, "final_loss": log[-1]["loss"] if log else None,
                  "final_acc": log[-1]["acc"] if log else None,
                  "train_s": round(log[-1]["train_s"], 2) if carried else wall, **({"wall_s": wall} if carried else {}),
                  "mean_tok_per_s": sum(r["tok_per_s"] for r in log) / max(1, len(log)),
                  "curve": thin(log, ("step", "loss", "acc"))}


def drafter_name(cfg: DrafterConfig, kind: str) -> str:
    return f"drafter-{kind}-L{cfg.num_layers}-b{cfg.block_size}"


def eval_prompts(data_dir, n: int) -> list[list[int]]:
    rows = load_split(data_dir, "val")[:n]
    return [r["input_ids"][: r["prompt_len"]] for r in rows]


def eval_groups(data_dir, n: int) -> list[str]:
    """The source group (``data.source_group``) of each of the first ``n`` held-out prompts."""
    from .data import source_group
    return [source_group(r["id"]) for r in load_split(data_dir, "val")[:n]]


def tau_by_group(decode_file: Path, groups: list[str]) -> dict:
    """tau with its interval over prompts, per source group, of every drafter run saved in ``decode_file``."""
    from .decode_stats import acceptance_stats, results_from_json
    saved = read_json(decode_file).get("results", {})
    out = {}
    for name, rows in saved.items():
        if name == "plain":
            continue
        res = results_from_json(rows)
        out[name] = {}
        for g in sorted(set(groups)):
            st = acceptance_stats([r for r, gg in zip(res, groups) if gg == g])
            out[name][g] = {"prompts": groups.count(g), "tau": st["tau"], "tau_ci95": st["tau_ci95"]}
    return out
