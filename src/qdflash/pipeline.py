"""The stage DAG: names, run directories and upstream wiring, shared by the CLI, the notebooks and the tests.

``run_stage`` checks its input before it writes anything: the preset and stage exist, every upstream stage has
finished (its ``metrics.json``) with the same preset, no checkpoint it reads is truncated, and the stage's own run
directory (if any) was made with the same config. Each failure is a ``StageError`` whose message says what to do.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import struct
import zipfile
from pathlib import Path
from typing import Any

from .dag import STAGES, UPSTREAM, StageError
from .runio import runs_dir

def stage_dir(preset: str, stage: str, runs: str | Path | None = None) -> Path:
    if stage not in STAGES:
        raise StageError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)} (`qdflash stages`)")
    return (Path(runs) if runs else runs_dir(preset)) / stage


def _config_class(stage: str):
    from . import config as C
    return {"00_data": C.DataConfig, "01_qad": C.QADConfig, "02_drafter_pretrain": C.DrafterConfig,
            "03_drafter_finetune": C.DrafterConfig, "04_drafter_quant": C.DrafterQuantConfig,
            "05_serving": C.DrafterConfig, "06_evaluation": C.EvalConfig, "07_figures": C.FiguresConfig}[stage]


def stage_config(stage: str, preset: str, overrides: dict[str, Any] | None = None):
    """The config a stage records in its ``config.json`` (05 records the drafter config; its overrides are the
    serving function's keyword arguments)."""
    from .config import PRESETS, ConfigError, load_config
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    ov = dict(overrides or {})
    if stage == "05_serving":
        from .stages.s05_serving import run_serving
        allowed = [n for n, p in inspect.signature(run_serving).parameters.items() if p.default is not p.empty]
        bad = sorted(set(ov) - set(allowed))
        if bad:
            raise ConfigError(f"unknown key(s) {bad} for 05_serving; valid keys: {allowed}")
        return load_config(_config_class(stage), preset)
    return load_config(_config_class(stage), preset, **ov)


def _cmd(stage: str, preset: str, runs) -> str:
    return f"`qdflash run {stage} --preset {preset}" + (f" --runs {runs}`" if runs else "`")


def check_upstream(stage: str, preset: str, runs: str | Path | None = None) -> None:
    """Every upstream stage has a readable ``metrics.json`` made with ``preset``."""
    for up in UPSTREAM[stage_dir(preset, stage, runs).name]:
        d = stage_dir(preset, up, runs)
        if not (d / "metrics.json").exists():
            raise StageError(f"stage {stage} needs {up}, but {d / 'metrics.json'} is missing; run "
                             f"{_cmd(up, preset, runs)} first")
        data = {}
        for name in ("metrics.json", "config.json"):
            try:
                data[name] = json.loads((d / name).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise StageError(f"{d / name} is unreadable ({type(e).__name__}); rerun {_cmd(up, preset, runs)}"
                                 f" into a fresh --runs directory") from None
        made_with = data["config.json"].get("preset")
        if made_with not in (None, preset):
            raise StageError(f"{d} was made with preset {made_with!r}, not {preset!r}; pass the matching "
                             f"--preset or another --runs directory")
        if up == "00_data":
            check_data(d, _cmd(up, preset, runs))


def check_data(data_dir: Path, rerun: str) -> None:
    """The data files match the sha256 sums in their manifest (files over 256 MB are not hashed)."""
    from .runio import sha256_file
    try:
        files = json.loads((data_dir / "manifest.json").read_text()).get("files", {})
    except (OSError, json.JSONDecodeError):
        return
    for split, info in files.items():
        f = data_dir / f"{split}.jsonl"
        want = info.get("sha256") if isinstance(info, dict) else None
        if want and f.exists() and f.stat().st_size < 256 * 2**20 and sha256_file(f) != want:
            raise StageError(f"{f} does not match the sha256 in its manifest (changed or corrupt); rerun {rerun}"
                             f" into a fresh --runs directory")


def check_safetensors(path: str | Path) -> None:
    """Header and length of a safetensors file (a truncated or overwritten file fails here, in microseconds)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header of {n} bytes in a {size}-byte file")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end != size:
            raise ValueError(f"{size} bytes on disk, the header describes {8 + n + end}")
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise StageError(f"{path} is a corrupt checkpoint ({e}); rerun the stage that wrote it into a fresh "
                         f"--runs directory, or delete {path.parent} and rerun it") from None


def check_checkpoints(stage: str, preset: str, runs: str | Path | None = None) -> None:
    """The safetensors checkpoints upstream (and the stage's own reusable ones) and its resume files (.pt)."""
    own = stage_dir(preset, stage, runs)
    for d in [stage_dir(preset, u, runs) for u in UPSTREAM[stage]] + [own]:
        for p in sorted(d.glob("*.safetensors")) + sorted(d.glob("*/*.safetensors")):
            if p.parent.name.endswith(".tmp"):         # an interrupted save: the stage rewrites it
                continue
            check_safetensors(p)
            try:
                if (p.parent / "config.json").exists():
                    json.loads((p.parent / "config.json").read_text())
            except json.JSONDecodeError:
                raise StageError(f"{p.parent / 'config.json'} is corrupt (not JSON); rerun the stage that wrote "
                                 f"{p.parent} into a fresh --runs directory") from None
    for p in sorted(own.glob("*.pt")) + sorted(own.glob("*/*.pt")):
        try:
            with zipfile.ZipFile(p) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise StageError(f"resume checkpoint {p} is corrupt ({e}); delete it to restart {stage} from "
                             f"scratch (the rest of {own} is kept)") from None


def check_same_config(stage: str, cfg, out_dir: Path) -> None:
    """Refuse to resume into (and overwrite) a run directory made with another config."""
    from .config import to_dict
    f = Path(out_dir) / "config.json"
    if stage == "07_figures" or not f.exists():
        return
    try:
        old = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        raise StageError(f"{f} is unreadable; move {out_dir} away (or use another --runs directory) and rerun "
                         f"{stage}") from None
    new = {"stage": stage, **to_dict(cfg)}
    defaults = {fl.name: fl.default for fl in dataclasses.fields(cfg)}
    diff = []
    for k, v in new.items():
        if k in old and old[k] != v:
            diff.append(f"{k}: {old[k]!r} -> {v!r}")
        elif k not in old and json.loads(json.dumps(defaults.get(k))) != v:   # a field added since, not at default
            diff.append(f"{k}: (absent) -> {v!r}")
    if diff:
        raise StageError(f"{out_dir} holds a {stage} run with another config ({'; '.join(diff[:4])}); pass another"
                         f" --runs directory, or delete {out_dir} to rerun it")


def finished_result(stage: str, preset: str, runs: str | Path | None = None):
    """The saved result of a finished run of ``stage`` (each stage module's ``saved_result``), or None where the
    stage must run: no ``metrics.json``; an upstream stage finished after it; make is running this very stage
    (``QDFLASH_STAGE``: make runs a stage only when it is out of date, e.g. after a code change); stage 07 (cheap)."""
    import importlib
    import os
    out = stage_dir(preset, stage, runs)
    f = out / "metrics.json"
    if stage == "07_figures" or os.environ.get("QDFLASH_STAGE") == stage or not f.exists():
        return None
    ups = [stage_dir(preset, u, runs) / "metrics.json" for u in UPSTREAM[stage]]
    if any(u.exists() and u.stat().st_mtime > f.stat().st_mtime for u in ups):
        return None
    module = importlib.import_module(f".stages.s{stage}", __package__)
    return module.saved_result(out, json.loads(f.read_text()))


def run_stage(stage: str, preset: str, runs: str | Path | None = None, overrides: dict[str, Any] | None = None,
              progress: bool = True, reuse: bool = False):
    """Run one stage with its preset config (plus overrides) on the standard run directories. ``reuse`` (the
    notebooks): return a finished run's saved result instead (``finished_result``), so that opening a notebook
    after ``make reproduce`` neither trains again nor overwrites the run's timings with a resumed call's."""
    from . import progress as prog
    d = lambda s: stage_dir(preset, s, runs)  # noqa: E731
    out = d(stage)
    cfg = stage_config(stage, preset, overrides)
    check_upstream(stage, preset, runs)
    check_checkpoints(stage, preset, runs)
    check_same_config(stage, cfg, out)
    saved = finished_result(stage, preset, runs) if reuse else None
    if saved is not None:
        print(f"{stage}: read back the finished run in {out} (FORCE = True runs it again)")
        return saved
    prog.install()
    ov = dict(overrides or {})
    if stage == "00_data":
        from .stages.s00_data import run_data
        return run_data(cfg, out, progress)
    if stage == "01_qad":
        from .stages.s01_qad import run_qad
        return run_qad(cfg, out, d("00_data"), progress)
    if stage == "02_drafter_pretrain":
        from .stages.s02_drafter_pretrain import run_drafter_pretrain
        return run_drafter_pretrain(cfg, out, d("00_data"), progress)
    if stage == "03_drafter_finetune":
        from .stages.s03_drafter_finetune import run_drafter_finetune
        return run_drafter_finetune(cfg, out, d("00_data"), d("02_drafter_pretrain"), d("01_qad"), progress)
    if stage == "04_drafter_quant":
        from .stages.s04_drafter_quant import run_drafter_quant
        return run_drafter_quant(cfg, out, d("00_data"), d("01_qad"), d("03_drafter_finetune"), progress)
    if stage == "05_serving":
        from .stages.s05_serving import run_serving
        return run_serving(preset, out, d("00_data"), d("01_qad"), d("03_drafter_finetune"), d("04_drafter_quant"),
                           **ov)
    if stage == "06_evaluation":
        from .stages.s06_evaluation import run_evaluation
        return run_evaluation(cfg, out, d("00_data"), d("01_qad"), d("03_drafter_finetune"), progress)
    from .stages.s07_figures import run_figures
    from .results import metrics_root, results_dir
    root = metrics_root(preset, runs)          # runs/<preset>, or the committed results/<preset> on a fresh clone
    return run_figures(cfg, out, root, cards=root != results_dir(preset))
