"""Every leaf of every stage's metrics.json in two run directories, compared for equality: the check that a change
of structure changed no result (issue 37: a refactor reruns `make reproduce PRESET=tiny` before and after).

    python3 tools/compare_runs.py RUNS_BEFORE RUNS_AFTER

Skipped: timings, throughputs, latencies, paths, provenance and logs (they differ between any two runs). Strings
have their run directory replaced by RUNS. Exit 1 when any compared leaf differs (NaN equals NaN here).
`qdflash compare --runs A --results B` is the tolerant form (per-metric tolerances, for reruns on other machines)."""
from __future__ import annotations

import fnmatch
import json
import math
import sys
from pathlib import Path

SKIP = ["*wall_time_s", "*git_sha*", "*time*", "*_s", "*_s.*", "*per_s*", "*speedup*", "*drafter_share*", "*latency*",
        "*_ms*", "*init_s*", "*.provenance*", "*path*", "*cache*", "*dir*", "*command*", "*log*",
        "*_created{*"]           # Prometheus counters' creation timestamps (vLLM's server counters)


def leaves(x, prefix: str = ""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, x


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def compare(a: Path, b: Path) -> tuple[int, int, list]:
    """(leaves compared, leaves skipped, [(stage:path, a, b) that differ])."""
    n, skipped, diffs = 0, 0, []
    stages = sorted({d.name for d in a.iterdir() if (d / "metrics.json").exists()} |
                    {d.name for d in b.iterdir() if (d / "metrics.json").exists()})
    for st in stages:
        la = dict(leaves(json.loads((a / st / "metrics.json").read_text()))) if (a / st / "metrics.json").exists() else {}
        lb = dict(leaves(json.loads((b / st / "metrics.json").read_text()))) if (b / st / "metrics.json").exists() else {}
        for k in sorted(set(la) | set(lb)):
            key = f"{st}:{k}"
            if any(fnmatch.fnmatch(key, s) for s in SKIP):
                skipped += 1
                continue
            n += 1
            va, vb = la.get(k, "<absent>"), lb.get(k, "<absent>")
            if isinstance(va, str) and isinstance(vb, str):
                va, vb = va.replace(str(a), "RUNS"), vb.replace(str(b), "RUNS")
            if not same(va, vb):
                diffs.append((key, va, vb))
    return n, skipped, diffs


def main() -> int:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    n, skipped, diffs = compare(a, b)
    print(f"{n} leaves compared, {n - len(diffs)} identical, {len(diffs)} differ, {skipped} skipped "
          "(timings, paths, provenance)")
    for d in diffs:
        print("  ", *d)
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
