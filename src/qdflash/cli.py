"""Command line.

  qdflash run STAGE --preset P [--runs DIR] [--set key=value ...]   run one stage
  qdflash stages                                                    list the stages
  qdflash results --preset P                                        runs/P -> results/P (metrics, configs, times)
  qdflash figures --preset P                                        figures/P from runs/P, else from results/P
  qdflash compare --preset P                                        which metrics of runs/P moved vs results/P
  qdflash readme [--preset P] [--check]                             regenerate (or check) the README headline block
                                                                    and docs/results-P.md
  qdflash cards --preset P                                          model cards for every checkpoint of runs/P

Bad input (unknown preset or stage, missing upstream stage, corrupt checkpoint, missing package, a run directory
of another config) ends with one ``error: ...`` line on stderr and exit status 2; ``QDFLASH_DEBUG=1`` shows the
traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .config import ConfigError, parse_overrides
from .pipeline import STAGES, StageError, run_stage


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qdflash", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one stage")
    r.add_argument("stage", metavar="STAGE", help="one of: " + ", ".join(STAGES))
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (JSON value)")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--dry-run", action="store_true", help="resolve config, paths, chat template, quant targets and "
                   "vLLM command; run and download nothing (qdflash.dryrun)")
    sub.add_parser("stages", help="list the stages")
    res = sub.add_parser("results", help="copy metrics/config/run.json and stage times from runs/P to results/P")
    res.add_argument("--out", default=None, help="default results/<preset>")
    fig = sub.add_parser("figures", help="regenerate figures/tables (+ model cards) from runs/P, else results/P")
    fig.add_argument("--fig-dir", default=None, help="default figures/<preset>")
    fig.add_argument("--readme", action="store_true",
                     help="also regenerate the README block and docs/results-P.md when the README shows P")
    cmp_ = sub.add_parser("compare", help="diff runs/P against results/P with per-metric tolerances")
    cmp_.add_argument("--results", default=None, help="default results/<preset>")
    cmp_.add_argument("--all", action="store_true", help="list every metric, not only those that moved")
    cmp_.add_argument("--tolerances", action="store_true", help="print the tolerance table and exit")
    rd = sub.add_parser("readme", help="regenerate the README results block and docs/results-P.md from results/P")
    rd.add_argument("--check", action="store_true", help="exit 1 if either differs, write nothing")
    sub.add_parser("cards", help="write README.md + recipe.yaml into every checkpoint of runs/P")
    for p in (r, res, fig, cmp_, rd, sub.choices["cards"]):
        p.add_argument("--preset", default=None if p is rd else "smol",
                       help="tiny | smol | full" + (" (default: the block's)" if p is rd else " (default smol)"))
        if p is not rd:
            p.add_argument("--runs", default=None, help="runs root (default runs/<preset>)")
    return ap


def _check_preset(preset: str | None) -> None:
    from .config import PRESETS
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")


def _dispatch(a, ap) -> int:
    _check_preset(getattr(a, "preset", None))
    if a.cmd == "stages":
        print("\n".join(STAGES))
        return 0
    if a.cmd == "run":
        ov = parse_overrides(a.set)
        if "QDFLASH_PROGRESS" not in os.environ and not sys.stderr.isatty():
            os.environ["QDFLASH_PROGRESS"] = "text"      # a log file gets whole lines, not carriage returns
        if a.stage not in STAGES:
            raise StageError(f"unknown stage {a.stage!r}; choose one of {', '.join(STAGES)}")
        if a.dry_run:
            from .dryrun import dry_run
            plan = dry_run(a.stage, a.preset, a.runs, ov)
            print(json.dumps(plan, indent=1, default=str))
            if plan["problems"]:
                raise ConfigError(f"dry run of {a.stage} ({a.preset}) found: " + "; ".join(plan["problems"]))
            return 0
        res = run_stage(a.stage, a.preset, a.runs, ov, progress=not a.no_progress)
        print(json.dumps(getattr(res, "metrics", {}), indent=1, default=str)[:4000])
        return 0
    from . import results
    if a.cmd == "results":
        files = results.collect(a.preset, a.runs, a.out)
        print(f"wrote {len(files)} files to {Path(files[0]).parent.parent}")
        return 0
    if a.cmd == "figures":
        from .config import FiguresConfig, load_config
        from .stages.s07_figures import run_figures
        from .runio import runs_dir
        root = results.metrics_root(a.preset, a.runs)
        out = (Path(a.runs) if a.runs else runs_dir(a.preset)) / "07_figures"
        cfg = load_config(FiguresConfig, a.preset, **({"fig_dir": a.fig_dir} if a.fig_dir else {}))
        res = run_figures(cfg, out, root, cards=(root != results.results_dir(a.preset)))
        print(f"{len(res.files)} figure/table files in {res.fig_dir} from {root}; {len(res.metrics['cards'])} "
              f"model cards")
        if a.readme:
            shown, _ = results.read_block()
            if shown == a.preset:
                print(f"README block and docs/results-{a.preset}.md "
                      + ("regenerated" if results.update_readme(a.preset) else "up to date"))
            else:
                print(f"README block shows preset {shown}, not {a.preset}: left as is "
                      f"(`qdflash readme --preset {a.preset}` switches it)")
        return 0
    if a.cmd == "compare":
        from . import compare
        if a.tolerances:
            print(compare.tolerance_table())
            return 0
        rerun = Path(a.runs) if a.runs else results.runs_dir(a.preset)
        committed = Path(a.results) if a.results else results.results_dir(a.preset)
        for name, d in (("rerun", rerun), ("committed results", committed)):
            if not results.finished_stages(d):
                raise StageError(f"no finished stage in {d} ({name}); " + (
                    f"run `make reproduce PRESET={a.preset}` first" if name == "rerun" else
                    f"collect one with `make results PRESET={a.preset}`"))
        c = compare.compare(rerun, committed)
        print(f"# {rerun} vs {committed}\n")
        print(c.markdown(show_all=a.all))
        return 1 if len(c.moved) else 0
    if a.cmd == "readme":
        preset = a.preset or results.read_block()[0]
        if a.check:
            stale = results.stale_results_files(preset)
            print(f"README block and docs/results-{preset}.md " + ("match" if not stale else "differ from")
                  + f" results/{preset}" + "".join(f"\n  stale: {results.rel(p)}" for p in stale))
            return 1 if stale else 0
        print(f"README block and docs/results-{preset}.md "
              + ("regenerated" if results.update_readme(preset) else "up to date"))
        return 0
    if a.cmd == "cards":
        from .cards import write_cards
        paths = write_cards(Path(a.runs) if a.runs else results.runs_dir(a.preset))
        print("\n".join(str(p) for p in paths) or "no checkpoints found")
        return 0
    ap.error(f"unknown command {a.cmd}")
    return 2


def _one_line(e: BaseException) -> str:
    if isinstance(e, ModuleNotFoundError):
        return (f"missing Python package {e.name!r}: install the pinned environment with `make setup` and run "
                f"with .venv/bin/python (vLLM lives in .venv-vllm: `make setup-vllm`)")
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    try:
        return _dispatch(a, ap)
    except (ConfigError, StageError, FileNotFoundError, ImportError) as e:
        err = e
    except ValueError as e:                 # runio.read_json: a corrupt or half-written JSON file
        if "not valid JSON" not in str(e):
            raise
        err = e
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume (finished work is kept)", file=sys.stderr)
        return 130
    if os.environ.get("QDFLASH_DEBUG"):
        raise err
    print(f"error: {_one_line(err)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
