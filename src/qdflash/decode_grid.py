"""Stage 03's decoding grid on one target, resumable run by run.

Every decoding run (plain, then each drafter) is written to ``decode-<target>.json`` as soon as it finishes, with
the settings it was decoded under and a fingerprint of each drafter's weights. A stage that is cut (a 10-minute
device call, a killed job) and run again decodes only the runs that are missing. A saved run is reused only when the
target, prompts, length, dtype, temperature, seed and decoder are the same and the drafter's weights hash the same.
Otherwise the whole file is decoded again. Stage 04 reads the same file (``drafter_quant.reusable_decodes``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .runio import read_json, write_json

SETTINGS = ("target", "prompts", "max_new_tokens", "dtype", "temperature", "seed", "decoder")


def fingerprint(module: torch.nn.Module) -> str:
    """sha256 over a module's state (names, shapes, dtypes and bytes): equal iff the weights are equal."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def saved_runs(path: Path, settings: dict, prints: dict[str, str]) -> dict:
    """The runs of ``path`` that can stand for this grid: all of its runs when its settings equal ``settings``,
    except drafters whose fingerprint differs; nothing when the settings differ or there is no file."""
    from .speculative import results_from_json
    if not path.exists():
        return {}
    d = read_json(path)
    if any(d.get(k) != settings[k] for k in SETTINGS):
        return {}
    old = d.get("drafters", {})
    return {name: results_from_json(rows) for name, rows in d.get("results", {}).items()
            if name == "plain" or (name in prints and old.get(name) == prints[name])}


def decode_grid(path: Path, target, settings: dict, drafters: dict, eos_token_id=None, progress: bool = False) -> dict:
    """``speculative.compare_with_plain`` of ``drafters`` on ``target``, with every finished run saved to ``path``
    at once and the runs already saved there (same settings and weights) reused. ``settings`` holds ``SETTINGS``
    (``target`` names the target, e.g. its directory). Returns compare_with_plain's stats; reused runs say
    ``"reused": true`` and keep the times measured when they were decoded."""
    from .speculative import compare_with_plain, results_to_json
    prints = {name: fingerprint(d) for name, d in drafters.items()}
    reuse = saved_runs(path, settings, prints)
    done = {name: results_to_json(rs) for name, rs in reuse.items()}
    decoders = {name: d for name, d in (read_json(path).get("decoder_used", {}) if reuse else {}).items()
                if name in reuse}

    def save(name, results, stats):
        done[name] = results_to_json(results)
        decoders[name] = stats.get("decoder")
        write_json(path, {**settings, "drafters": {k: prints[k] for k in done if k in prints},
                          "decoder_used": decoders, "results": done})

    stats = compare_with_plain(target, settings["prompts"], settings["max_new_tokens"], drafters,
                               settings["temperature"], eos_token_id, seed=settings["seed"], progress=progress,
                               reuse=reuse, decoder=settings["decoder"], on_result=save)
    for name in reuse:
        if name in stats and decoders.get(name):
            stats[name]["decoder"] = decoders[name]
    return stats
