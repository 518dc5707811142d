"""Tables from the saved GPU benchmark outputs under ``benchmarks/`` (read only from those files; the README block
shows them): batch-1 plain decoding per decoder path (``benchmarks/gpu_fast_decode.py``) and FSDP step runs next to
``memory_plan``'s estimate (``benchmarks/fsdp_steps.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def plain_decode_table(path: str | Path) -> pd.DataFrame:
    """Batch-1 plain decoding per path (eager / static caches / CUDA graphs): tokens/s, ms per token, fraction of
    the weight-bandwidth floor, the launch-bound estimate, and outputs that differ from the eager path (bf16
    near-ties)."""
    p = json.loads(Path(path).read_text())["plain"]
    rows = []
    for mode in ("eager", "fast", "graphs"):
        if mode not in p:
            continue
        m = p[mode]
        vs = m.get("vs_eager_plain")
        rows.append({"path": mode, "prompts": m["prompts"], "tok/s": round(m["tokens_per_s"], 1),
                     "ms/token": round(m["step_ms"], 2), "of floor": f"{m['fraction_of_floor']:.2%}",
                     "launch-bound tok/s": round(p["launch_bound_tokens_per_s"][mode]),
                     "differs from eager": f"{vs['mismatched_outputs']}/{vs['of']}" if vs else "-"})
    return pd.DataFrame(rows).set_index("path")


def fsdp_table(jsonl: str | Path) -> pd.DataFrame:
    """One row per FSDP step run (one JSON line each): tokens/s (median over the steps after the first), peak
    allocated CUDA memory of rank 0, and ``memory_plan``'s estimate for the same shapes."""
    rows = [json.loads(line) for line in Path(jsonl).read_text().splitlines() if line.startswith("{")]
    return pd.DataFrame([{
        "job": f"{r['job']} {r['model']}", "GPUs": r["gpus"], "tokens per row": r["seq_len"],
        "activation ckpt": "yes" if r.get("activation_checkpointing") else "no",
        "tok/s": round(r["tok_per_s"]), "peak allocated GiB": round(r["max_memory_allocated_gib"], 1),
        "estimate GiB": round(r["estimate_gib"], 1)} for r in rows]).set_index("job")
