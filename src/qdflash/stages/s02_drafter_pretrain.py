"""Stage 02: the DFlash drafter pretrained against the full-precision target."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .. import distributed
from ..config import DrafterConfig
from ..data import load_split
from ..drafter import most_frequent_tokens, new_drafter, set_draft_vocab
from ..drafter_train import drafter_name, stage_features, train_and_save
from ..models import load_model, load_tokenizer, mask_token_id, resolve_target
from ..runio import finish_run, read_json, start_run


@dataclass
class DrafterResult:
    out_dir: Path
    drafters: dict
    metrics: dict


def saved_result(out: Path, metrics: dict) -> DrafterResult:
    """A finished run of this stage as ``run_drafter_pretrain`` returned it, from its saved metrics."""
    return DrafterResult(out, {"pretrain": out / metrics["drafter"]}, metrics)


def run_drafter_pretrain(cfg: DrafterConfig, out_dir, data_dir, progress=True) -> DrafterResult:
    """Stage 02: pretrain against the full-precision target (the data stage's target)."""
    t0, dp = time.time(), distributed.current()      # torchrun: every rank trains, rank 0 writes
    out = start_run(out_dir, cfg, "02_drafter_pretrain") if distributed.is_main() else Path(out_dir)
    target_spec = read_json(Path(data_dir) / "config.json")["target"]
    distributed.main_first(lambda: resolve_target(target_spec))     # an offline target is built once
    target = load_model(target_spec, cfg.dtype)
    tok = load_tokenizer(target_spec)
    rows = load_split(data_dir, "train")
    feats = stage_features(target, resolve_target(target_spec), rows, cfg, progress)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids,
                    mask_token_id(tok, cfg.mask_token_id), cfg.intermediate_size, cfg.seed,
                    cfg.init, cfg.train_window).to(target.device)
    vocab = None
    if cfg.draft_vocab:                          # reduced draft vocabulary: the training answers' most frequent tokens
        ids, cover = most_frequent_tokens(rows, cfg.draft_vocab, cfg.max_len)
        set_draft_vocab(d, ids)
        vocab = {"size": len(ids), "supervised_token_coverage": round(cover, 5)}
    path, info = train_and_save(drafter_name(cfg, "pretrain"), d, target, rows, feats, cfg, cfg.epochs, out, progress)
    n_params = sum(p.numel() for p in d.parameters())
    if dp is not None:
        dp.close()                               # rank 0 goes on alone, the others are done
        if not dp.is_main:
            return DrafterResult(out, {"pretrain": path}, {})
    m = finish_run(out, {"drafter": path.name, "target": target_spec, "params": n_params, "train": info,
                         "draft_vocab": vocab,
                         "features": {"cache": str(feats.path), "computed_rows": feats.computed_rows}}, t0)
    return DrafterResult(out, {"pretrain": path}, m)
