"""Command line: ``qdflash run STAGE --preset smol [--set key=value ...]`` and ``qdflash stages``."""
from __future__ import annotations

import argparse
import json
import sys

from .pipeline import STAGES, run_stage


def _parse_value(v: str):
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="qdflash", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one stage")
    r.add_argument("stage", choices=STAGES)
    r.add_argument("--preset", default="smol")
    r.add_argument("--runs", default=None, help="runs root (default runs/<preset>)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (JSON value)")
    r.add_argument("--no-progress", action="store_true")
    sub.add_parser("stages", help="list the stages")
    a = ap.parse_args(argv)
    if a.cmd == "stages":
        print("\n".join(STAGES))
        return 0
    ov = {}
    for kv in a.set:
        if "=" not in kv:
            ap.error(f"--set expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        ov[k] = _parse_value(v)
    res = run_stage(a.stage, a.preset, a.runs, ov, progress=not a.no_progress)
    print(json.dumps(getattr(res, "metrics", {}), indent=1, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
