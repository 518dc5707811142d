"""The index of ``benchmarks/`` (``benchmarks/manifest.json``; ``benchmarks/README.md`` is its readable form): one
entry per benchmark folder (the question, its scripts, its files, where the docs use it), and the saved outputs
the generated results page (``docs/results-<preset>.md``) shows, in page order. The report code (``results.extra_tables``, ``scaling``) reads
benchmark outputs only through here, never by a path of its own."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .runio import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
MANIFEST = BENCHMARKS / "manifest.json"


@lru_cache(maxsize=None)
def manifest(path: Path = MANIFEST) -> dict:
    return json.loads(Path(path).read_text())


def folder(name: str) -> Path:
    """The folder of benchmark ``name`` (a key of the manifest's ``benchmarks``)."""
    return REPO_ROOT / manifest()["benchmarks"][name]["folder"]


def readme_sections(preset: str) -> list[tuple[str, list[Path]]]:
    """(section, files it reads) for ``docs/results-<preset>.md``, in page order; a section is shown where every
    file (or folder) it reads exists."""
    block = manifest()["readme_block"]
    if preset not in block["presets"]:
        return []
    return [(s["show"], [BENCHMARKS / r for r in s["reads"]]) for s in block["sections"]]


def rel(path: str | Path) -> str:
    """``path`` as the README cites it: relative to the repository root."""
    p = Path(path)
    return p.relative_to(REPO_ROOT).as_posix() if p.is_absolute() and p.is_relative_to(REPO_ROOT) else p.as_posix()
