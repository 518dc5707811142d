"""The package's floors, from its imports (static AST parse, lazy imports inside functions included): no import
circles, no private name imported from another module, and the method library never imports orchestration
(pipeline, CLI) or report code (tables, figures, README block, cards)."""
import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "src" / "qdflash"
REPORT = {"results", "figures", "scaling", "cards", "gpu_results", "bench_index", "compare"}
ORCHESTRATION = {"pipeline", "cli", "dryrun", "bench"}


def import_graph(pkg: Path = PKG) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """{module: modules of the package it imports} (dotted below the package: ``stages.s00_data``), and
    (module, from, name) for every private name imported from another module."""
    files = {".".join(p.relative_to(pkg).with_suffix("").parts): p for p in pkg.rglob("*.py")}
    files = {k.removesuffix(".__init__"): v for k, v in files.items()}
    edges, private = {}, []
    for mod, p in files.items():
        package = mod.split(".")[:-1] if not p.name == "__init__.py" else mod.split(".")
        out = set()
        for n in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(n, ast.ImportFrom):
                if n.level:
                    base = package[: len(package) - (n.level - 1)] + ((n.module or "").split(".") if n.module else [])
                elif (n.module or "").split(".")[0] == "qdflash":
                    base = n.module.split(".")[1:]
                else:
                    continue
                base = ".".join(b for b in base if b)
                targets = [base] if base in files else []
                targets += [f"{base}.{a.name}".lstrip(".") for a in n.names if f"{base}.{a.name}".lstrip(".") in files]
                private += [(mod, base, a.name) for a in n.names if a.name.startswith("_")]
            elif isinstance(n, ast.Import):
                targets = [a.name.removeprefix("qdflash.") for a in n.names if a.name.startswith("qdflash.")]
            out |= {t for t in targets if t in files}
        edges[mod] = out - {mod}
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
    for p in PKG.rglob("*.py"):
        t = ast.parse(p.read_text())
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) in
               ("start_run", "finish_run") for n in ast.walk(t)):
            callers.add(".".join(p.relative_to(PKG).with_suffix("").parts))
    assert callers and all(c.startswith("stages.s0") for c in callers), sorted(callers)
    assert len(callers) == 8


def test_report_code_imports_no_orchestration():
    edges, _ = import_graph()
    bad = {m: sorted(edges[m] & ORCHESTRATION) for m in REPORT if edges.get(m, set()) & ORCHESTRATION}
    assert bad == {}


def test_the_checks_catch_a_circle_and_a_private_import(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import _y\n")
    (tmp_path / "c.py").write_text("from qdflash.a import z\n")
    edges, private = import_graph(tmp_path)
    assert cycles(edges) == [["a", "b", "c"]]
    assert private == [("b", "c", "_y")]
