"""The package's floors, from its imports (static AST parse, lazy imports inside functions included): no import
circles, no private name imported from another module, and the method library never imports orchestration
(pipeline, CLI) or report code (tables, figures, README block, cards)."""
import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "src" / "qdflash"
REPORT = {"results", "figures", "scaling", "cards", "gpu_results", "bench_index", "compare"}
ORCHESTRATION = {"pipeline", "cli", "dryrun", "bench"}


def import_graph(pkg: Path = PKG) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """{module: modules of the package it imports}, and (module, from, name) for every private name imported."""
    mods = {p.stem for p in pkg.glob("*.py")}
    edges, private = {}, []
    for p in pkg.glob("*.py"):
        out = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and (n.level == 1 or (n.module or "").startswith("qdflash")):
                mod = (n.module or "").removeprefix("qdflash").lstrip(".")
                if mod:
                    out.add(mod.split(".")[0])
                    private += [(p.stem, mod, a.name) for a in n.names if a.name.startswith("_")]
                else:
                    out |= {a.name for a in n.names}
            elif isinstance(n, ast.Import):
                out |= {a.name.split(".")[1] for a in n.names if a.name.startswith("qdflash.")}
        edges[p.stem] = (out & mods) - {p.stem}
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
    library = set(edges) - REPORT - ORCHESTRATION - {"__init__", "__main__"}
    bad = {m: sorted(edges[m] & (REPORT | ORCHESTRATION)) for m in library if edges[m] & (REPORT | ORCHESTRATION)}
    assert bad == {}


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
