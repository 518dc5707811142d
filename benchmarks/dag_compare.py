"""Before / after table of one `make reproduce` against another (issue 13: faster at equal work, the method's numbers
not worse). Reads each run's saved results (``stage_times.txt`` and the stages' ``metrics.json``), never re-runs.

    python benchmarks/dag_compare.py --before-rev f89693f --after results/smol --out benchmarks/dag-compare-smol/dag-compare-smol-inproc

``--before-rev`` takes the ``results/<preset>`` folder of a commit (``git archive``); ``--before DIR`` a folder.
Writes OUT.json and OUT.md (the README links the markdown).
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


from qdflash.results import sha_groups  # noqa: E402


def from_rev(rev: str, preset: str, into: Path) -> Path:
    data = subprocess.run(["git", "archive", rev, f"results/{preset}"], cwd=ROOT, check=True,
                          capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(data)).extractall(into, filter="data")
    return into / "results" / preset


def stage_times(d: Path) -> dict[str, float]:
    out = {}
    for line in (d / "stage_times.txt").read_text().splitlines():   # make's "NAME 123s" (a stage that failed
        parts = line.split()                                           # writes no line; a rerun's line wins)
        if len(parts) == 2 and parts[1].endswith("s"):
            out[parts[0]] = float(parts[1][:-1])
    return out


def _m(d: Path, stage: str) -> dict:
    p = d / stage / "metrics.json"
    return json.loads(p.read_text()) if p.exists() else {}


def method_numbers(d: Path) -> dict[str, tuple[float, list | None]]:
    """The numbers the issue says must not get worse, each (value, 95% CI or None)."""
    out = {}
    q = _m(d, "01_qad").get("qad_vs_gptq_kl") or {}
    if q:
        out["QAD / GPTQ held-out KL (lower is better)"] = (q["ratio"], q.get("ratio_ci95"))
    dec = _m(d, "03_drafter_finetune").get("decoding") or {}
    for t in ("fp", "qad"):
        for k in ("pretrain", "two_stage", "direct"):
            r = (dec.get(t) or {}).get(k)
            if r:
                out[f"tau, {k} drafter, {t.upper()} target"] = (r["tau"], r.get("tau_ci95"))
    for k, r in ((_m(d, "04_drafter_quant").get("table")) or {}).items():
        if k.startswith(("w4a16", "w8a16")) and "tau" in r:
            out[f"tau, {k} drafter, QAD target"] = (r["tau"], r.get("tau_ci95"))
    vt = (_m(d, "06_evaluation").get("quality") or {}).get("vs_teacher") or {}
    for model, tasks in vt.items():
        for task, r in tasks.items():
            if isinstance(r, dict) and "fraction_of_teacher" in r:
                out[f"fraction of teacher, {model}, {task}"] = (r["fraction_of_teacher"], r.get("fraction_ci95"))
    return out


def fmt(v: tuple | None) -> str:
    if v is None:
        return "-"
    val, ci = v
    return f"{val:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path)
    ap.add_argument("--before-rev")
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--preset", default="smol")
    ap.add_argument("--out", type=Path, required=True, help="path without suffix: OUT.json and OUT.md")
    a = ap.parse_args()
    if (a.before is None) == (a.before_rev is None):
        raise SystemExit("give one of --before DIR or --before-rev REV")
    with tempfile.TemporaryDirectory() as tmp:
        before = a.before or from_rev(a.before_rev, a.preset, Path(tmp))
        tb, ta = stage_times(before), stage_times(a.after)
        mb, ma = method_numbers(before), method_numbers(a.after)
        sha = {k: _m(d, "00_data").get("git_sha") for k, d in (("before", before), ("after", a.after))}
        stage_sha = {k: {s: _m(d, s).get("git_sha") for s in (tb if k == "before" else ta)}
                     for k, d in (("before", before), ("after", a.after))}
    stages = sorted(set(tb) | set(ta))
    rows = [(s, tb.get(s), ta.get(s)) for s in stages]
    if set(tb) != set(ta):
        raise SystemExit(f"the runs have different stages: {sorted(set(tb) ^ set(ta))}")
    tot_b, tot_a = sum(tb.values()), sum(ta.values())
    md = [f"# `make reproduce` ({a.preset}), before vs after\n",
          f"before: {a.before_rev or a.before} (stage 00 at {sha['before']}); after: {a.after} (stage 00 at "
          f"{sha['after']}). Wall time per stage from `stage_times.txt` (papermill, kernel start included).\n",
          "Code of the stages (git SHA in each metrics.json): before " + sha_groups(stage_sha["before"])
          + "; after " + sha_groups(stage_sha["after"]) + ".\n",
          "| stage | before s | after s | after / before |", "|---|---|---|---|"]
    for s, b, x in rows:
        md.append(f"| {s} | {b if b is not None else '-'} | {x if x is not None else '-'} | "
                  f"{(x / b) if b and x else float('nan'):.2f} |")
    md.append(f"| total | {tot_b:.0f} ({tot_b / 60:.1f} min) | {tot_a:.0f} ({tot_a / 60:.1f} min) | "
              f"{tot_a / tot_b:.2f} |\n")
    md += ["| number (95% CI over prompts / conversations / items) | before | after |", "|---|---|---|"]
    for k in list(mb) + [k for k in ma if k not in mb]:
        md.append(f"| {k} | {fmt(mb.get(k))} | {fmt(ma.get(k))} |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    a.out.with_suffix(".json").write_text(json.dumps({
        "command": " ".join(["python"] + sys.argv), "git_sha": sha, "stage_git_sha": stage_sha,
        "stage_times": {"before": tb, "after": ta},
        "total_s": {"before": tot_b, "after": tot_a}, "method": {"before": mb, "after": ma}}, indent=1) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
