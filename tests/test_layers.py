"""The package's floors, from its imports (static AST parse, lazy imports inside functions included): no import
circles, no private name imported from another module, and the method library never imports orchestration
(pipeline, CLI) or report code (tables, figures, README block, cards). Imports are resolved by the same code that
writes the Makefile's stage prerequisites (tools/stage_deps.py)."""
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC.parent / "tools"))
from stage_deps import imported_names  # noqa: E402

REPORT = {"results", "figures", "scaling", "cards", "gpu_results", "bench_index", "compare"}
ORCHESTRATION = {"pipeline", "cli", "dryrun", "bench"}


def import_graph(src: Path = SRC, pkg: str = "qdflash") -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """{module: modules of the package it imports} (dotted below the package: ``stages.s00_data``), and
    (module, from, name) for every private name imported from another module of the package."""
    def short(dotted: str) -> str:
        return dotted.removeprefix(pkg + ".").removesuffix(".__init__")
    files = {".".join(p.relative_to(src).with_suffix("").parts): p for p in (src / pkg).rglob("*.py")}
    known = {short(m) for m in files}
    edges, private = {}, []
    for mod, p in files.items():
        out = set()
        for n in ast.walk(ast.parse(p.read_text())):
            names = [short(d) for d in imported_names(n, mod) if d.split(".")[0] == pkg]
            out |= {d for d in names if d in known}
            if isinstance(n, ast.ImportFrom) and names:
                private += [(short(mod), names[0], a.name) for a in n.names if a.name.startswith("_")]
        edges[short(mod)] = out - {short(mod)}
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    edges, _ = import_graph()
    assert cycles(edges) == []


def test_no_private_names_across_modules():
    _, private = import_graph()
    assert private == []


def test_the_library_imports_no_report_or_orchestration_code():
    edges, _ = import_graph()
    upper = REPORT | ORCHESTRATION | {m for m in edges if m.split(".")[0] == "stages"}
    library = set(edges) - upper - {"", "__main__"}
    bad = {m: sorted(edges[m] & upper) for m in library if edges[m] & upper}
    assert bad == {}


def test_stage_modules_alone_open_and_close_run_directories():
    """Only the stage modules (and the figures stage's report side, none) call runio.start_run / finish_run."""
    callers = set()
    for p in (SRC / "qdflash").rglob("*.py"):
        t = ast.parse(p.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) in
               ("start_run", "finish_run") for n in ast.walk(t)):
            callers.add(".".join(p.relative_to(SRC / "qdflash").with_suffix("").parts))
    assert callers and all(c.startswith("stages.s0") for c in callers), sorted(callers)
    assert len(callers) == 8


def test_report_code_imports_no_orchestration():
    edges, _ = import_graph()
    bad = {m: sorted(edges[m] & ORCHESTRATION) for m in REPORT if edges.get(m, set()) & ORCHESTRATION}
    assert bad == {}


def test_the_checks_catch_a_circle_and_a_private_import(tmp_path):
    pkg = tmp_path / "qdflash"
    pkg.mkdir()
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from .c import _y\n")
    (pkg / "c.py").write_text("from qdflash.a import z\n")
    edges, private = import_graph(tmp_path)
    assert cycles(edges) == [["a", "b", "c"]]
    assert private == [("b", "c", "_y")]
