"""Results that travel with the repository: ``results/<preset>/`` and the README's generated block.

``collect`` copies each stage's ``metrics.json``, ``config.json`` and ``run.json`` plus ``stage_times.txt`` (no
weights, no data) from ``runs/<preset>/`` to ``results/<preset>/``. Figures and tables read ``runs/<preset>`` when
a stage has finished there and ``results/<preset>`` otherwise (``metrics_root``), so a fresh clone regenerates them
in seconds. The README's block between ``<!-- results:begin preset=P -->`` and ``<!-- results:end -->`` holds the
stage-07 tables of ``results/P`` (``update_readme``; a test fails when they differ).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from .pipeline import STAGES, StageError
from .runio import REPO_ROOT, atomic_write_text, read_json, runs_dir

RESULT_FILES = ("metrics.json", "config.json", "run.json")
README = REPO_ROOT / "README.md"
BLOCK_RE = re.compile(r"<!-- results:begin preset=(?P<preset>[\w-]+) -->\n(?P<body>.*?)<!-- results:end -->",
                      re.S)

DAG_COMPARE = "dag-compare-smol-inproc.json"      # benchmarks/dag_compare.py of the latest results/smol
DAG_COMPARE_AMX = "dag-compare-smol-amx.json"     # results/smol against the same code on an Intel CPU with AMX


def sha_groups(by_stage: dict) -> str:
    """Distinct SHAs (7 characters; stage 07's ``-dirty`` dropped, the README says why) of a run's stages in stage
    order, each with its runs of consecutive stages: "d8efed7", "d8efed7 (00-04), a8b0106 (05-07)",
    "a (00-01/03), b (02)"."""
    runs: list[list] = []                       # [sha, first stage, last stage] per run of equal SHAs
    for stage, sha in by_stage.items():
        sha = (sha or "?")[:7]
        if runs and runs[-1][0] == sha:
            runs[-1][2] = stage[:2]
        else:
            runs.append([sha, stage[:2], stage[:2]])
    groups: dict[str, list[str]] = {}
    for sha, a, b in runs:
        groups.setdefault(sha, []).append(a if a == b else f"{a}-{b}")
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{k} ({'/'.join(v)})" for k, v in groups.items())


def _machine_line(path: Path, who: str) -> str:
    r = read_json(path)
    m, v = r["machine"], r["vllm_jobs"]
    o, n = v["old_separate_processes"], v["new_one_process_inproc"]
    isa = ", ".join(f"{k} {'yes' if x else 'no'}" for k, x in m["flags"].items() if k.startswith(("amx", "avx512_bf")))
    return (f"\n{who} (`benchmarks/cpu_machine_and_vllm_jobs.py`, `benchmarks/{path.name}`): "
            f"{m['cores']} cores, {isa}; 2048^3 matmul {m['matmul_bfloat16_2t_gflops']:.0f} GFLOP/s bf16 and "
            f"{m['matmul_float32_2t_gflops']:.0f} fp32 on {m['cores']} threads "
            f"({m['matmul_bfloat16_1t_gflops']:.0f} and {m['matmul_float32_1t_gflops']:.0f} on one). Stage 05's "
            f"offline vLLM jobs: {v['jobs']} jobs of its shape take {o['wall_s']:.0f} s as separate processes and "
            f"{n['wall_s']:.0f} s in one process with the engine in-process ({v['ratio']:.2f}x, "
            f"{v['saved_s_per_job']:.0f} s saved per job, same tokens: {'yes' if v['same_tokens'] else 'no'}); "
            f"engine start {_span(o['engine_start_s'])} s against {_span(n['engine_start_s'])} s, generation "
            f"{_span(o['generate_s'])} s against {_span(n['generate_s'])} s per job (one run, old before new).\n")


def _span(xs: list[float]) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}"


def results_dir(preset: str) -> Path:
    return REPO_ROOT / "results" / preset


def finished_stages(root: str | Path) -> list[str]:
    return [s for s in STAGES if (Path(root) / s / "metrics.json").exists()]


def collect(preset: str, runs: str | Path | None = None, out: str | Path | None = None) -> list[Path]:
    """Copy the small per-stage records of a run to ``results/<preset>`` (atomically, file by file)."""
    src = Path(runs) if runs else runs_dir(preset)
    out = Path(out) if out else results_dir(preset)
    stages = finished_stages(src)
    if not stages:
        raise StageError(f"no finished stage under {src} (no */metrics.json); run `make reproduce PRESET={preset}` "
                         f"first, or pass --runs")
    written = []
    for s in stages:
        for name in RESULT_FILES:
            f = src / s / name
            if f.exists():
                atomic_write_text(out / s / name, f.read_text())
                written.append(out / s / name)
    if (src / "stage_times.txt").exists():
        shutil.copyfile(src / "stage_times.txt", out / "stage_times.txt")
        written.append(out / "stage_times.txt")
    return written


def metrics_root(preset: str, runs: str | Path | None = None) -> Path:
    """Where figures read metrics: the runs root if a compute stage finished there, else ``results/<preset>``."""
    src = Path(runs) if runs else runs_dir(preset)
    if [s for s in finished_stages(src) if s != "07_figures"]:
        return src
    if runs is None and [s for s in finished_stages(results_dir(preset)) if s != "07_figures"]:
        return results_dir(preset)
    raise StageError(f"no stage metrics for preset {preset!r} under {src}" + ("" if runs else
                     f" or {results_dir(preset)}") + f"; run `make reproduce PRESET={preset}` first")


def readme_block(preset: str, root: str | Path | None = None) -> str:
    """The generated README block body: the stage-07 tables of ``results/<preset>`` (or ``root``)."""
    from .figures import tables_markdown
    root = Path(root) if root else results_dir(preset)
    if not finished_stages(root):
        raise StageError(f"{root} holds no results; run `make results PRESET={preset}` after a run")
    rel = root.relative_to(REPO_ROOT) if root.is_relative_to(REPO_ROOT) else root
    head = (f"<!-- generated by `qdflash readme --preset {preset}` (`make figures`) from {rel}/; "
            f"edit the code in src/qdflash/figures.py, not this block -->\n"
            f"*Preset `{preset}`, generated from `{rel}/` (stages {', '.join(s[:2] for s in finished_stages(root))}"
            f") by `make figures`; the same tables as `figures/{preset}/tables.md`.*\n\n")
    from .figures import TABLES
    rest = [title for stage, name, title, _ in TABLES if name not in README_TABLES
            and (root / stage / "metrics.json").exists()]
    more = (f"\nMore tables from the same metrics in [`figures/{preset}/tables.md`](figures/{preset}/tables.md): "
            + "; ".join(rest) + ".\n") if rest else ""
    return head + tables_markdown(root, level=4, only=README_TABLES) + more + extra_tables(preset, root)


# the tables the README block shows; the others are linked (figures/<preset>/tables.md)
README_TABLES = {"table-qad-vs-ptq", "table-drafters", "table-quality"}


def extra_tables(preset: str, root: Path) -> str:
    """Wall time per stage of the run, and for smol the saved benchmark outputs (CPU paths, QAD recipe sweep)."""
    from .figures import cpu_speed_table, qad_sweep_table, stage_times_table, table_markdown
    out = ""
    st = stage_times_table(root)
    if len(st):
        out += ("\nWall time per stage, s (each stage's `metrics.json`): "
                + ", ".join(f"{k} {v:.0f}" for k, v in st["wall time s"].items()) + ".\n")
    bench = REPO_ROOT / "benchmarks"
    dag = bench / DAG_COMPARE
    if preset == "smol" and dag.exists():
        from .gpu_results import dag_times_table
        d = read_json(dag)
        code = {k: sha_groups(d["stage_git_sha"][k]) if "stage_git_sha" in d else d["git_sha"][k][:7]
                for k in ("before", "after")}
        out += "\n" + table_markdown(dag_times_table(dag), f"`make reproduce` seconds per stage: the run before "
                                      f"(code at {code['before']}) and this run (at {code['after']}), "
                                      "each alone on the 2-core CPU (`stage_times.txt`, papermill kernel starts "
                                      f"included; `benchmarks/{dag.with_suffix('.md').name}` also compares the "
                                      "method's numbers)", 4)
    if preset == "smol" and (bench / "cpu_stages.json").exists():
        t = cpu_speed_table(bench / "cpu_stages.json")
        out += ("\nCPU units, new path / old path (`benchmarks/cpu_stages.py`, one run, `benchmarks/cpu_stages.json`): "
                + ", ".join(f"{u} {r:.2f}x" for u, r in zip(t.index, t["new / old"])) + ".\n")
    for name, who in (("cpu-machine-vllm-jobs.json", "The CPU of results/smol"),
                      ("cpu-machine-vllm-jobs-amx.json", "The Intel CPU with AMX")):
        if preset == "smol" and (bench / name).exists():
            out += _machine_line(bench / name, who)
    amx = bench / DAG_COMPARE_AMX
    if preset == "smol" and amx.exists():
        from .gpu_results import dag_times_table, qad_profile
        d = read_json(amx)
        out += "\n" + table_markdown(
            dag_times_table(amx, ("no AMX s", "AMX s")),
            f"`make reproduce` seconds per stage on two 2-core CPUs: results/smol (no AMX; code at "
            f"{sha_groups(d['stage_git_sha']['before'])}) and `benchmarks/cpu-amx-run/smol` (an Intel Xeon with "
            f"AMX; code at {sha_groups(d['stage_git_sha']['after'])}), each alone on its machine "
            f"(`benchmarks/{amx.with_suffix('.md').name}` also compares the method's numbers)", 4)
        prof = {k: bench / f for k, f in (("no AMX", "qad-step-profile.txt"), ("AMX", "qad-step-profile-amx.txt"))}
        if all(p.exists() for p in prof.values()):
            q = {k: qad_profile(p) for k, p in prof.items()}
            out += ("\nOne `smol` QAD step (4 x 256 tokens, `benchmarks/qad_step_profile.py`, `benchmarks/"
                    "qad-step-profile*.txt`), median step and the profiled step's self time split into matmuls / "
                    "the rest (elementwise fake-quant, norms and activations, attention, softmax, optimizer): "
                    + "; ".join(f"{k} {v['step_s']:.1f} s, {v['mm_s']:.2f} / {v['rest_s']:.2f} s"
                                for k, v in q.items())
                    + f". The AMX machine runs the matmuls {q['no AMX']['mm_s'] / q['AMX']['mm_s']:.2f}x as fast and "
                    f"the rest {q['no AMX']['rest_s'] / q['AMX']['rest_s']:.2f}x as fast.\n")
    from .scaling import GPU_RUN, decode_table, scaling_table
    if preset == "smol" and (GPU_RUN / "scaling.json").exists():
        out += ("\n" + table_markdown(scaling_table(), "Drafter scaling on one H200 (`smol-gpu` data, "
                                      "`benchmarks/drafter_scaling.py`; block-level tau estimate, 95% CI over "
                                      "held-out conversations)", 4)
                + "\n![tau against conversations and epochs](figures/smol/fig-drafter-scaling.png)\n")
        if (root / "02_drafter_pretrain" / "metrics.json").exists():
            from .scaling import cpu_minutes_table
            out += "\n" + table_markdown(cpu_minutes_table(root), "The sweep's points in minutes of this 2-core CPU "
                                          "(projection: stage 00's vLLM rate and stage 02's drafter rate of this run; "
                                          "`scaling.cpu_minutes_table`)", 4)
    if preset == "smol" and (GPU_RUN / "eval-fp.json").exists():
        out += "\n" + table_markdown(decode_table(), "`smol-gpu` drafters on held-out prompts (one H200, reference "
                                      "decoder, greedy, 128 new tokens; 95% CI over prompts)", 4)
    run = GPU_RUN / "run-1204" / "metrics-03_drafter_finetune.json"
    if preset == "smol" and run.exists():
        from .figures import decoding_table
        m3 = read_json(run)
        out += "\n" + table_markdown(decoding_table(None, m3).drop(columns=["steps"]).round(3),
                                      f"`smol-gpu` stage 03 on one H200 (run of 2026-12-04, "
                                      f"`benchmarks/smol-gpu-h200/run-1204/`): {m3['eval_prompts']} held-out prompts "
                                      f"x {m3['eval_new_tokens']} tokens, greedy, fp32, CUDA-graph decoder; 95% CI "
                                      "over prompts", 4)
    xl = REPO_ROOT / "benchmarks" / "smol-gpu-xl" / "run-1206-h100"
    if preset == "smol" and (xl / "bench.json").exists():
        from .gpu_results import gpu_xl_summary
        out += ("\n`smol-gpu-xl` on one GPU (issue 34; `benchmarks/gpu_xl.sh`, `benchmarks/smol-gpu-xl/run-1206-h100/`):\n\n"
                + gpu_xl_summary(xl))
    from .gpu_results import (fsdp_table, plain_decode_table, projection_table, spec_decode_table, verify_cost_table,
                              walk_check_table)
    saved = [  # (saved benchmark output, its table, title), in README order; each shown where its file exists
        (bench / "fast-decode-h200" / "plain-bf16.json", plain_decode_table,
         "Batch-1 plain decoding of the smol target on one H200, bf16, 128 new tokens "
         "(`benchmarks/gpu_fast_decode.py`; `benchmarks/fast-decode-h200/`)"),
        (bench / "fast-decode-h200" / "spec-bf16.json", spec_decode_table,
         "Batch-1 speculative decoding on one H200, CUDA graphs, bf16, FP smol target, the smol-gpu two-stage drafter "
         "(W4A16 GPTQ / W8A16 RTN de-quantized) and the pretrain drafter, 16 held-out smol prompts x 128 tokens "
         "(`benchmarks/fast-decode-h200/`)"),
        (bench / "cpu-verify-cost-k.json", verify_cost_table,
         "vLLM on this 2-core CPU, batch 1: QAD W4A16 target + the smol-gpu two-stage drafter (W4A16 GPTQ) against k "
         "drafted tokens, 12 held-out prompts (4 per length tercile) x 96 tokens (`benchmarks/verify_cost_k.py`)"),
        (bench / "walk-vs-decoder.json", walk_check_table,
         "Acceptance by teacher forcing (walk) against the reference decoder on this 2-core CPU: the smol-gpu drafters "
         "on this run's FP and QAD W4A16 targets, 8 held-out prompts x 64 tokens, greedy, fp32, eager "
         "(`benchmarks/walk_vs_decoder.py`; walk s: the drafter steps, after the target forwards that all drafters of a "
         "target share)"),
        (bench / "qwen35-projection-h200", projection_table,
         "Qwen3.5-4B shapes on one H200, random weights, eager bf16, batch 1, 1,024-token context: step costs and the "
         "projected speedup tau x t_verify(1) / (t_draft + t_verify(16)), a projection "
         "(`benchmarks/qwen35-projection-h200/`)"),
        (bench / "fsdp-h200" / "fsdp_steps.jsonl", fsdp_table,
         "FSDP steps through torchrun on one H200: SmolLM2-135M (real weights) and Qwen3.5-4B shapes (random weights) "
         "(`benchmarks/gpu_fsdp.sh`; estimate: `memory_plan.py` for the same shapes)")]
    for src, table, title in saved if preset == "smol" else ():
        if src.exists():
            out += "\n" + table_markdown(table(src), title, 4)
    sweeps = sorted((bench / "qad-sweep-h200").glob("*.json")) if preset == "smol" else []
    if sweeps:
        out += "\n" + table_markdown(qad_sweep_table(sweeps), "QAD recipes on the smol data "
                                     "(`benchmarks/qad_sweep.py`, one H200; the same GPTQ start and held-out set)", 4)
    return out


def read_block(readme: str | Path = README) -> tuple[str, str]:
    """(preset, body) of the README's results block."""
    m = BLOCK_RE.search(Path(readme).read_text())
    if not m:
        raise StageError(f"{readme} has no `<!-- results:begin preset=P -->` ... `<!-- results:end -->` block")
    return m["preset"], m["body"]


def update_readme(preset: str | None = None, readme: str | Path = README, root: str | Path | None = None) -> bool:
    """Regenerate the README block (for ``preset``, default the block's own); True when the file changed."""
    readme = Path(readme)
    old_preset, _ = read_block(readme)
    preset = preset or old_preset
    text = readme.read_text()
    body = readme_block(preset, root)
    new = BLOCK_RE.sub(lambda m: f"<!-- results:begin preset={preset} -->\n{body}<!-- results:end -->", text,
                       count=1)
    if new != text:
        atomic_write_text(readme, new)
    return new != text
