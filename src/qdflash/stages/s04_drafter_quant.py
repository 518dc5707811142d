"""Stage 04: the two-stage drafter quantized (W4A16 GPTQ, W8A16 RTN) and windowed, decoded against its unquantized form
on the QAD target."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..config import DrafterQuantConfig
from ..data import load_split
from ..decode_stats import results_to_json
from ..drafter import load_drafter
from ..drafter_quant import (
    collect_hessians,
    gptq_drafter,
    reusable_decodes,
    rtn_w8_drafter,
    save_packed_drafter,
)
from ..models import load_model, load_tokenizer
from ..runio import dir_size_bytes, finish_run, read_json, start_run, write_json


@dataclass
class DrafterQuantResult:
    out_dir: Path
    checkpoints: dict
    metrics: dict


def saved_result(out: Path, metrics: dict) -> DrafterQuantResult:
    """A finished run of this stage as ``run_drafter_quant`` returned it, from its saved metrics."""
    c = metrics["checkpoints"]
    return DrafterQuantResult(out, {"w4a16": out / c["w4a16"], "w8a16": out / c["w8a16"]}, metrics)


def run_drafter_quant(cfg: DrafterQuantConfig, out_dir, data_dir, qad_dir, finetune_dir, progress=True):
    from ..drafter_train import eval_prompts
    from ..speculative import compare_with_plain
    t0 = time.time()
    out = start_run(out_dir, cfg, "04_drafter_quant")
    qm = read_json(Path(qad_dir) / "metrics.json")
    fm = read_json(Path(finetune_dir) / "metrics.json")
    src = Path(finetune_dir) / fm["drafters"]["two_stage"]
    twin = load_model(str(Path(qad_dir) / qm["names"]["twin"]))
    rows = load_split(data_dir, "train")[: cfg.calib_convs]
    g4, g8 = cfg.group_size, cfg.w8_group_size
    n4 = f"drafter-w4a16-g{g4}-gptq" + ("" if cfg.include_fc else "-nofc")
    n8 = f"drafter-w8a16-g{g8}-rtn"
    timings = {}
    if not (out / n4 / "config.json").exists():
        ts = time.time()
        d = load_drafter(src).to(twin.device)
        H = collect_hessians(d, twin, rows, cfg.anchors_per_conv, cfg.include_fc, progress)
        res = gptq_drafter(d, H, g4, cfg.dampening)
        save_packed_drafter(d.cpu(), {k: v.scale for k, v in res.items()}, 4, g4, out / n4,
                            {"gptq_loss": {k: v.loss for k, v in res.items()}, "calib_convs": len(rows),
                             "used_rtn_fallback": sorted(k for k, v in res.items() if v.used_rtn_fallback),
                             "hessian_error": {k: {"gptq": v.err_gptq, "rtn": v.err_rtn} for k, v in res.items()},
                             "anchors_per_conv": cfg.anchors_per_conv, "dampening": cfg.dampening})
        timings["gptq_s"] = round(time.time() - ts, 2)
    if not (out / n8 / "config.json").exists():
        ts = time.time()
        rtn_w8_drafter(src, g8, out / n8)
        timings["rtn_w8_s"] = round(time.time() - ts, 2)
    tok = load_tokenizer(str(Path(qad_dir) / qm["names"]["qad"]))
    target = load_model(str(Path(qad_dir) / qm["names"]["qad"]))
    drafters = {k: load_drafter(p).to(target.device) for k, p in
                (("fp32", src), ("w8a16", out / n8), ("w4a16", out / n4))}
    prompts = eval_prompts(data_dir, cfg.eval_prompts)
    reuse = reusable_decodes(Path(finetune_dir) / "decode-qad.json", str(Path(qad_dir) / qm["names"]["qad"]),
                             prompts, cfg)
    table, per_prompt, walkers = {}, {}, {}
    rows_of = {}           # every row's per-prompt results, saved as decode-04.json (paired comparisons by position)

    def walked(swa):       # tau_by "walk": only the fp32 drafter without a window is decoded (or reused from 03)
        return [] if cfg.tau_by != "walk" else [k for k in drafters if swa or k != "fp32"]
    for swa in (0, cfg.swa_window):        # 0: explicitly no window, also for a drafter trained with one
        # plain decoding does not depend on the drafter window: decoded once (or taken from stage 03)
        res = compare_with_plain(target, prompts, cfg.eval_new_tokens, drafters, 0.0, tok.eos_token_id,
                                 window=swa, seed=cfg.seed, progress=progress,
                                 reuse=reuse if not swa else {"plain": per_prompt["plain"]}, results=per_prompt,
                                 decoder=cfg.decoder, walk=walked(swa), walkers=walkers)
        table["plain" if not swa else "plain_swa"] = res.pop("plain")
        for k, v in res.items():
            row = k + ("" if not swa else f"-swa{swa}")
            table[row], rows_of[row] = v, results_to_json(per_prompt[k])
        rows_of.setdefault("plain", results_to_json(per_prompt["plain"]))
    write_json(out / "decode-04.json", {"prompts": prompts, "max_new_tokens": cfg.eval_new_tokens,
                                        "swa_window": cfg.swa_window, "results": rows_of})
    sizes = {"fp32": dir_size_bytes(src), "w8a16": dir_size_bytes(out / n8), "w4a16": dir_size_bytes(out / n4)}
    params = sum(p.numel() for p in drafters["fp32"].parameters())
    ctx_lens = [len(p) for p in prompts]
    meta = read_json(out / n4 / "drafter_meta.json") if (out / n4 / "drafter_meta.json").exists() else {}
    herr = meta.get("hessian_error", {})
    gptq = {"used_rtn_fallback": meta.get("used_rtn_fallback"), "layers": len(herr),
            "layers_gptq_below_rtn": sum(v["gptq"] < v["rtn"] for v in herr.values())}
    m = finish_run(out, {"table": table, "checkpoints": {"fp32": str(src), "w8a16": n8, "w4a16": n4},
                         "disk_bytes": sizes, "params": params, "bf16_bytes": params * 2,
                         "swa_window": cfg.swa_window, "eval_prompts": len(prompts),
                         "prompt_len_mean": sum(ctx_lens) / max(1, len(ctx_lens)),
                         # SWA is measured where it matters: the share of prompts at least 4x the window long
                         "prompts_at_least_4x_window": sum(n >= 4 * cfg.swa_window for n in ctx_lens)
                         / max(1, len(ctx_lens)),
                         "eval_new_tokens": cfg.eval_new_tokens, "timings": timings,
                         # rows taken from stage 03's decodes: their tokens/s were timed in stage 03's process, so
                         # speedups of this stage's fresh rows against them compare two runs on the same machine
                         "reused_from_03": sorted(reuse), "gptq": gptq}, t0)
    return DrafterQuantResult(out, {"w4a16": out / n4, "w8a16": out / n8}, m)
