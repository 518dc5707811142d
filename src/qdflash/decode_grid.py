"""Stage 03's decoding grid on one target, resumable run by run.

Every decoding run (plain, then each drafter) is written to ``decode-<target>.json`` as soon as it finishes, with
the settings it was decoded under and a fingerprint of each drafter. A stage that is cut (a 10-minute device call, a
killed job) and run again decodes only the runs that are missing. A saved run is reused only when the target (its
name and the size and mtime of its weight files), prompts, length, dtype, temperature, seed, decoder and the code's
git SHA are the same and the drafter's config and weights hash the same; otherwise it is decoded again. Each run
records the process that decoded it: a drafter's speedup over a plain run from another process says so
(``speedup_across_sessions``). Stage 04 reads the same file (``drafter_quant.reusable_decodes``).
"""
from __future__ import annotations

import hashlib
import os
import platform
import time
from pathlib import Path

import torch

from .runio import git_sha, read_json, write_json

SETTINGS = ("target", "target_files", "code", "prompts", "max_new_tokens", "dtype", "temperature", "seed", "decoder")
SESSION = f"{platform.node()}:{os.getpid()}:{time.time():.0f}"      # this process


def target_files(spec: str) -> list:
    """(name, size, mtime_ns) of a target directory's weight files: a rewritten checkpoint changes it."""
    p = Path(spec)
    if not p.is_dir():
        return [spec]
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.glob("*.safetensors"))]


def fingerprint(module: torch.nn.Module) -> str:
    """sha256 over a module's config (if it has one) and state (names, shapes, dtypes and bytes)."""
    h = hashlib.sha256()
    cfg = getattr(module, "config", None)
    if cfg is not None and hasattr(cfg, "to_json_string"):
        h.update(cfg.to_json_string(use_diff=False).encode())
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def saved_runs(path: Path, settings: dict, prints: dict[str, str], walk=()) -> tuple[dict, dict, dict]:
    """The runs of ``path`` that can stand for this grid: all of its runs when its settings equal ``settings``,
    except drafters whose fingerprint differs or that were measured the other way (walked, ``walk``, or decoded);
    nothing when the settings differ or there is no file.
    Returns ``(runs, sessions, decoders)``: the results, and the process and decoder of each kept run."""
    from .decode_stats import results_from_json
    if not path.exists():
        return {}, {}, {}
    d = read_json(path)
    if any(d.get(k) != settings[k] for k in SETTINGS):
        return {}, {}, {}
    old = d.get("drafters", {})
    runs = {name: results_from_json(rows) for name, rows in d.get("results", {}).items()
            if name == "plain" or (name in prints and old.get(name) == prints[name]
                                   and all(r.get("walk", False) == (name in walk) for r in rows))}
    return (runs, {name: d.get("sessions", {}).get(name) for name in runs},
            {name: d.get("decoder_used", {}).get(name) for name in runs})


def decode_grid(path: Path, target, settings: dict, drafters: dict, eos_token_id=None, progress: bool = False,
                walk=()) -> dict:
    """``speculative.compare_with_plain`` of ``drafters`` on ``target`` (the drafters named in ``walk`` measured by
    teacher forcing, ``walk.Walker``), with every finished run saved to ``path``
    at once and the runs already saved there (same settings and weights) reused. ``settings`` holds ``target`` (the
    target's name or directory) and the decoding settings of ``SETTINGS``; the target's files and the git SHA are
    added here. Returns compare_with_plain's stats; reused runs say ``"reused": true`` and keep the times measured
    when they were decoded."""
    from .decode_stats import results_to_json
    from .speculative import compare_with_plain
    settings = {**settings, "target_files": target_files(settings["target"]), "code": git_sha()}
    prints = {name: fingerprint(d) for name, d in drafters.items()}
    reuse, sessions, decoders = saved_runs(path, settings, prints, walk)
    done = {name: results_to_json(rs) for name, rs in reuse.items()}

    def save(name, results, stats):
        done[name] = results_to_json(results)
        decoders[name], sessions[name] = stats.get("decoder"), SESSION
        write_json(path, {**settings, "drafters": {k: prints[k] for k in done if k in prints},
                          "decoder_used": decoders, "sessions": sessions, "results": done})

    stats = compare_with_plain(target, settings["prompts"], settings["max_new_tokens"], drafters,
                               settings["temperature"], eos_token_id, seed=settings["seed"], progress=progress,
                               reuse=reuse, decoder=settings["decoder"], on_result=save, walk=walk)
    for name in reuse:
        if name in stats and decoders.get(name):
            stats[name]["decoder"] = decoders[name]
    for name in drafters:
        if name in stats and "speedup" in stats[name] and sessions.get(name) != sessions.get("plain"):
            stats[name]["speedup_across_sessions"] = True      # plain and this run timed in different processes
    return stats
