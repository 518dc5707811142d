"""Scripts outside the package (benchmarks/, tools/) import names from it that still exist: a static AST check, so a
name moved or renamed in the library fails here rather than minutes into a benchmark on a lent GPU or under vLLM
(benchmarks/verify_cost_k.py imported ``mismatch_causes`` from ``serving`` after it had moved to ``decode_stats``)."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "qdflash"


def top_level_names(path: Path) -> set[str]:
    """Names a module defines or imports at its top level (functions, classes, assignments, imports, and what
    ``if``/``try`` blocks at the top level define)."""
    names: set[str] = set()

    def visit(body):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Assign):
                names.update(t.id for t in n.targets if isinstance(t, ast.Name))
                names.update(e.id for t in n.targets if isinstance(t, ast.Tuple) for e in t.elts
                             if isinstance(e, ast.Name))
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.If, ast.Try)):
                visit(n.body)
                visit(getattr(n, "orelse", []))
                for h in getattr(n, "handlers", []):
                    visit(h.body)
    visit(ast.parse(path.read_text()).body)
    return names


def module_file(dotted: str) -> Path | None:
    parts = dotted.split(".")[1:]
    if not parts:
        return PKG                      # the package itself: its names are its modules
    for cand in (PKG.joinpath(*parts).with_suffix(".py"), PKG.joinpath(*parts, "__init__.py")):
        if cand.exists():
            return cand
    return None


def guarded(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``try`` blocks that catch ImportError, and in their handlers (a deliberate fallback for
    older code)."""
    out = set()
    for t in ast.walk(tree):
        if isinstance(t, ast.Try) and any("ImportError" in ast.dump(h.type) for h in t.handlers if h.type):
            out |= {id(n) for b in t.body + [s for h in t.handlers for s in h.body] for n in ast.walk(b)}
    return out


def missing_imports(script: Path) -> list[tuple[int, str]]:
    tree = ast.parse(script.read_text())
    skip, out = guarded(tree), []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import) and id(n) not in skip:      # import qdflash.x [as y]: the module must exist
            out += [(n.lineno, f"{script.name}:{n.lineno} no module {a.name}") for a in n.names
                    if a.name.split(".")[0] == "qdflash" and module_file(a.name) is None]
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "qdflash" and n.level == 0 \
                and id(n) not in skip:
            f = module_file(n.module)
            if f is None:
                out.append((n.lineno, f"{script.name}:{n.lineno} no module {n.module}"))
                continue
            if f.is_dir():
                defined = {p.stem for p in f.glob("*.py")} | {p.name for p in f.iterdir() if p.is_dir()}
            else:
                defined = top_level_names(f)
                if f.name == "__init__.py":
                    defined |= {p.stem for p in f.parent.glob("*.py")}
            out += [(n.lineno, f"{script.name}:{n.lineno} {n.module}.{a.name}") for a in n.names
                    if a.name != "*" and a.name not in defined]
    return [m for _, m in sorted(out)]


SCRIPTS = sorted([*(REPO / "benchmarks").rglob("*.py"), *(REPO / "tools").rglob("*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_script_imports_exist(script):
    assert missing_imports(script) == []


def test_the_check_catches_a_moved_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from qdflash.serving import mismatch_causes\n"
                   "from qdflash.decode_stats import mismatch_causes, GenResult\nfrom qdflash.nowhere import x\n"
                   "try:\n    from qdflash.serving import old_name\nexcept ImportError:\n    pass\n"
                   "from qdflash import serving, no_such_module\nimport qdflash.drafter as D, qdflash.gone\n")
    assert missing_imports(bad) == ["bad.py:2 qdflash.serving.mismatch_causes", "bad.py:4 no module qdflash.nowhere",
                                    "bad.py:9 qdflash.no_such_module", "bad.py:10 no module qdflash.gone"]
