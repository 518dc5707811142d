"""Diff a rerun (``runs/<preset>``) against the committed numbers (``results/<preset>``).

Every numeric leaf of each stage's ``metrics.json`` is matched by its dotted path against ``TOLERANCES`` (first
match wins): ``abs`` bounds |rerun - committed|, ``rel`` bounds it relative to |committed|, ``exact`` wants
equality, ``skip`` is not compared (wall times and throughputs depend on the machine; curves are covered by their
final values; paths depend on the checkout). The result lists which metrics moved and by how much.
"""
from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .dag import STAGES

_LOSSLESS = "fp32 reference decoder is lossless: greedy mismatches must stay 0"
# (pattern on "stage:dotted.path", kind, tolerance, why)
TOLERANCES: list[tuple[str, str, float | None, str]] = [
    ("*wall_time_s", "skip", None, "wall time: machine and load dependent"),
    ("*git_sha*", "skip", None, "provenance"),
    ("*time*", "skip", None, "timings"),
    ("*_s", "skip", None, "timings (seconds)"),
    ("*_s.*", "skip", None, "timings (seconds)"),
    ("*per_s*", "skip", None, "throughput: machine dependent"),
    ("*speedup*", "skip", None, "throughput ratio: machine dependent"),
    ("*drafter_share*", "skip", None, "time split: machine dependent"),
    ("*latency*", "skip", None, "latency: machine dependent"),
    ("*_ms*", "skip", None, "latency: machine dependent"),
    ("*curve.*", "skip", None, "training curve: compared through its final value"),
    ("*histogram*", "skip", None, "acceptance-length counts: compared through tau"),
    ("*frac_a_above_b*", "skip", None, "bootstrap fraction: follows the paired difference"),
    ("*mismatch_causes.*", "skip", None, "per-output causes, listed by index: their count is compared"),
    ("*mismatch_margins*", "skip", None, "per-output margins, listed by index: their count is compared"),
    ("*per_conversation.*", "skip", None, "per-item values: compared through their pooled statistic"),
    ("*per_prompt.*", "skip", None, "per-item values: compared through their pooled statistic"),
    ("*_ci95*", "abs", 0.10, "95% bootstrap interval bound (prompts)"),
    ("*kl_reduction*", "abs", 0.05, "relative KL change vs the best PTQ"),
    ("*tau*", "abs", 0.05, "mean acceptance length (bonus counted)"),
    ("*per_position*", "abs", 0.05, "per-position acceptance rate"),
    ("*accept_rate*", "abs", 0.05, "per-token acceptance rate"),
    ("*kl*", "rel", 0.02, "KL to the teacher"),
    ("*ppl*", "rel", 0.02, "perplexity"),
    ("*top1_agreement*", "abs", 0.02, "top-1 agreement with the teacher"),
    ("*loss*", "rel", 0.05, "training loss"),
    ("*acc", "abs", 0.02, "training accuracy"),
    ("*score*", "abs", 0.10, "lm-eval score (few items: one item moves it by ~0.07)"),
    ("*.pass", "exact", None, "gate pass/fail"),
    ("06_evaluation:*mismatched*", "abs", 6, "bf16 reference decoder: near-tie flips (22 and 25 of 42 in two runs); "
     "exact where the stage ran in float32 (tolerance's dtype)"),
    ("*.mismatched_outputs", "exact", None, _LOSSLESS),
    ("*mismatch*", "abs", 2, "bf16 vLLM greedy mismatches (near-ties flip)"),
    ("*mb", "rel", 0.01, "on-disk size"),
    ("*bytes*", "rel", 0.01, "on-disk size"),
    ("*steps", "rel", 0.05, "step counts (draft steps follow tau)"),
    ("*", "rel", 0.05, "anything else numeric"),
]


def tolerance(key: str, dtype: str | None = None) -> tuple[str, float | None, str]:
    """(kind, tolerance, why) of the metric ``key`` ("stage:dotted.path"): the first matching ``TOLERANCES`` entry;
    ``dtype``, the stage config's, holds a greedy-mismatch count exact wherever the stage ran in float32."""
    if dtype == "float32" and key.rsplit(".", 1)[-1].startswith("mismatched"):
        return "exact", None, _LOSSLESS
    for pat, kind, tol, why in TOLERANCES:
        if fnmatch.fnmatchcase(key, pat):
            return kind, tol, why
    return "rel", 0.05, "default"


def flatten(obj, prefix: str = "", strings: bool = False) -> dict[str, object]:
    """Numeric and boolean leaves of a JSON tree by dotted path; strings (in metrics: paths and names) only with
    ``strings`` (in configs they are settings: a dtype, a data source)."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k), strings))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}.{i}", strings))
    elif isinstance(obj, (bool, int, float)) or (strings and isinstance(obj, str)):
        out[prefix] = obj
    return out


def _within(kind: str, tol, old, new) -> bool:
    if kind == "exact" or isinstance(old, bool) or isinstance(new, bool):
        return old == new
    if isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new):
        return True
    d = abs(new - old)
    return d <= tol + 1e-12 if kind == "abs" else d <= tol * abs(old) + 1e-12


@dataclass
class Comparison:
    table: pd.DataFrame           # one row per compared/missing/new metric
    config_diffs: list[str]       # "stage: key committed -> rerun"
    stages: list[str]             # stages present on both sides

    @property
    def moved(self) -> pd.DataFrame:
        return self.table[self.table.status == "MOVED"]

    def summary(self) -> str:
        c = self.table.status.value_counts().to_dict()
        return (f"{len(self.stages)} stages, {c.get('ok', 0)} metrics within tolerance, {c.get('MOVED', 0)} moved, "
                f"{c.get('missing', 0)} missing in the rerun, {c.get('new', 0)} new, "
                f"{c.get('not compared', 0)} not compared (timings, curves)")

    def markdown(self, show_all: bool = False) -> str:
        t = self.table if show_all else self.table[self.table.status.isin(["MOVED", "missing", "new"])]
        parts = [self.summary()]
        if self.config_diffs:
            parts.append("config differs (moved metrics are expected):\n" + "\n".join(f"* {d}" for d in self.config_diffs))
        if len(t):
            parts.append(t.to_markdown(index=False, floatfmt=".4g"))
        return "\n\n".join(parts) + "\n"


def _load(d: Path, name: str) -> dict:
    f = d / name
    return json.loads(f.read_text()) if f.exists() else {}


def compare(rerun: str | Path, committed: str | Path) -> Comparison:
    rerun, committed = Path(rerun), Path(committed)
    rows, cfg_diffs, stages = [], [], []
    for s in STAGES:
        a, b = committed / s / "metrics.json", rerun / s / "metrics.json"
        if not (a.exists() and b.exists()):
            continue
        stages.append(s)
        cfg_a = _load(committed / s, "config.json")
        ca, cb = flatten(cfg_a, strings=True), flatten(_load(rerun / s, "config.json"), strings=True)
        cfg_diffs += [f"{s}: {k} {ca.get(k)!r} -> {cb.get(k)!r}" for k in sorted(set(ca) | set(cb))
                      if ca.get(k) != cb.get(k)]
        old, new = flatten(json.loads(a.read_text())), flatten(json.loads(b.read_text()))
        for k in sorted(set(old) | set(new)):
            kind, tol, why = tolerance(f"{s}:{k}", cfg_a.get("dtype"))
            row = {"stage": s, "metric": k, "committed": old.get(k), "rerun": new.get(k), "delta": None,
                   "tolerance": "-" if kind == "skip" else (kind if tol is None else f"{kind} {tol:g}"), "why": why}
            if kind == "skip":
                row["status"] = "not compared"
            elif k not in new:
                row["status"] = "missing"
            elif k not in old:
                row["status"] = "new"
            else:
                if not isinstance(old[k], bool) and not isinstance(new[k], bool):
                    row["delta"] = new[k] - old[k]
                row["status"] = "ok" if _within(kind, tol, old[k], new[k]) else "MOVED"
            rows.append(row)
    cols = ["stage", "metric", "committed", "rerun", "delta", "tolerance", "status", "why"]
    return Comparison(pd.DataFrame(rows, columns=cols), cfg_diffs, stages)


def tolerance_table() -> str:
    return pd.DataFrame(TOLERANCES, columns=["metric pattern", "kind", "tolerance", "why"]).fillna("-").to_markdown(
        index=False)
