"""Each stage's Makefile prerequisites, found from the imports (static AST parse; nothing here imports qdflash).

A stage runs ``pipeline.run_stage(stage)`` (what its notebook calls). Its sources: ``pipeline.py``, the imports of
``pipeline.py`` reachable for that stage (an import under ``if stage == "X":`` counts for X only; code after such a
branch that returns is not reached by X), and then, transitively, every import of every module reached (module
level and lazy imports inside functions alike), plus modules named in strings (``python -m qdflash.vllm_worker``,
``vllm_plugin.qdflash_vllm`` run in the vLLM venv). A package's ``__init__.py`` comes with any of its modules.

    python3 tools/stage_deps.py            # print each stage's sources
    python3 tools/stage_deps.py --write    # rewrite the Makefile's stage rules with them (`make deps`)
    python3 tools/stage_deps.py --check    # exit 1 if the Makefile's lists differ from the imports
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGES = ("qdflash", "vllm_plugin")


def _module_file(src: Path, dotted: str) -> list[Path]:
    """Files executed by importing ``dotted`` (package __init__ files included); [] if not ours."""
    parts = dotted.split(".")
    if parts[0] not in PACKAGES:
        return []
    out = []
    for i in range(1, len(parts) + 1):
        base = src.joinpath(*parts[:i])
        if (base / "__init__.py").exists():
            out.append(base / "__init__.py")
        elif base.with_suffix(".py").exists():
            out.append(base.with_suffix(".py"))
            break
    return out


def imported_names(node, module: str) -> list[str]:
    """Dotted names an Import/ImportFrom node in ``module`` (``pkg.__init__`` for a package) brings in."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            base = ".".join(module.split(".")[:-node.level] + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]    # `from . import x` imports module x
    return []


def _strings(tree) -> list[str]:
    pat = re.compile(r"\b(" + "|".join(PACKAGES) + r")((?:\.\w+)+)")
    return [m.group(1) + m.group(2) for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) for m in pat.finditer(n.value)]


def _stage_test(test) -> str | None:
    """'X' for a test ``stage == "X"``."""
    if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "stage"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)):
        return test.comparators[0].value
    return None


def _reachable_nodes(stmts, stage: str):
    """Statements of ``stmts`` (recursively) that run for ``stage``, honouring ``if stage == "X": ... return``."""
    for st in stmts:
        x = _stage_test(st.test) if isinstance(st, ast.If) else None
        if x is not None:
            if x == stage:
                yield from _reachable_nodes(st.body, stage)
                if st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)):
                    return                                          # nothing after this branch runs for stage
            else:
                yield from _reachable_nodes(st.orelse, stage)
            continue
        yield st
        for field in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(st, field, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], (ast.stmt, ast.excepthandler)):
                yield from _reachable_nodes(sub, stage)


def stage_sources(stage: str, src: Path = SRC, entry: str = "qdflash.pipeline") -> set[Path]:
    """Every source file ``run_stage(stage)`` can execute (see the module docstring)."""
    entry_file = _module_file(src, entry)[-1]
    tree = ast.parse(entry_file.read_text())
    seen = set(_module_file(src, entry))
    todo = []
    for node in _reachable_nodes(tree.body, stage):
        todo += imported_names(node, entry)
        if not isinstance(node, (ast.FunctionDef, ast.If)):
            todo += _strings(node)
    while todo:
        name = todo.pop()
        for f in _module_file(src, name):
            if f in seen:
                continue
            seen.add(f)
            module = ".".join(f.relative_to(src).with_suffix("").parts)
            t = ast.parse(f.read_text())
            todo += [d for n in ast.walk(t) for d in imported_names(n, module)] + _strings(t)
    return seen


RULE = re.compile(r"^\$\(RUNS\)/(\w+)/metrics\.json\s*:(?!=)(.*)$")    # a stage rule's header line


def makefile_prereqs(makefile: Path = REPO / "Makefile") -> dict[str, list[str]]:
    """Normal (not order-only) prerequisites of every ``$(RUNS)/<stage>/metrics.json`` target."""
    text = makefile.read_text().replace("\\\n", " ")
    return {m.group(1): m.group(2).split("|")[0].split() for m in map(RULE.match, text.splitlines()) if m}


def stage_rule(stage: str, old: list[str], src: Path = SRC) -> list[str]:
    """The prerequisite tokens of a stage rule: its notebook (kept from ``old``), the sources its imports reach
    (sorted), its upstream stages' metrics (kept from ``old``)."""
    notebook = [p for p in old if p.startswith("notebooks/")]
    upstream = [p for p in old if p.startswith("$(RUNS)/")]
    sources = sorted(str(p.relative_to(src.parent)) for p in stage_sources(stage, src))
    return notebook + sources + upstream


def rewrite_makefile(makefile: Path = REPO / "Makefile", src: Path = SRC, width: int = 118) -> str:
    """The Makefile's text with every ``$(RUNS)/<stage>/metrics.json`` rule header's normal prerequisites replaced by
    ``stage_rule`` (order-only ones after ``|`` kept), wrapped at ``width``."""
    lines = makefile.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = RULE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        j = i
        while lines[j].endswith("\\"):
            j += 1
        header = " ".join(line.rstrip("\\").strip() for line in lines[i: j + 1])
        target, rest = header.split(":", 1)
        normal, _, order = rest.partition("|")
        toks = [target + ":"] + stage_rule(m.group(1), normal.split(), src) + ([" ".join(["|", *order.split()])] if order else [])
        cur = ""
        wrapped = []
        for tok in toks:
            if cur and len(cur) + 1 + len(tok) + 2 > width:
                wrapped.append(cur + " \\")
                cur = "    " + tok
            else:
                cur = f"{cur} {tok}" if cur else tok
        wrapped.append(cur)
        out += wrapped
        i = j + 1
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mk = REPO / "Makefile"
    new = rewrite_makefile(mk)
    if args.write:
        mk.write_text(new)
    elif args.check:
        if new != mk.read_text():
            print("Makefile stage prerequisites differ from the imports: run `make deps`")
            return 1
    else:
        for stage in makefile_prereqs():
            print(stage, " ".join(sorted(str(p.relative_to(REPO)) for p in stage_sources(stage))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
