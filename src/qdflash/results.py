"""Results that travel with the repository: ``results/<preset>/``, the README's headline, ``docs/results-<preset>.md``.

``collect`` copies each stage's ``metrics.json``, ``config.json`` and ``run.json`` plus ``stage_times.txt`` (no
weights, no data) from ``runs/<preset>/`` to ``results/<preset>/``. Figures and tables read ``runs/<preset>`` when
a stage has finished there and ``results/<preset>`` otherwise (``metrics_root``), so a fresh clone regenerates them
in seconds. The README's block between ``<!-- results:begin preset=P -->`` and ``<!-- results:end -->`` holds the
headline numbers of ``results/P`` with their intervals (``readme_block``); ``docs/results-P.md`` holds the key
stage-07 tables and the saved benchmark outputs (``results_page``). ``update_readme`` writes both; a test fails when
either differs from what the code generates.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from . import bench_index
from .bench_index import rel
from .dag import STAGES, StageError
from .runio import REPO_ROOT, atomic_write_text, read_json, runs_dir

RESULT_FILES = ("metrics.json", "config.json", "run.json")
README = REPO_ROOT / "README.md"
LEVEL = 2                                       # heading level of each table in docs/results-<preset>.md
BLOCK_RE = re.compile(r"<!-- results:begin preset=(?P<preset>[\w-]+) -->\n(?P<body>.*?)<!-- results:end -->",
                      re.S)

def sha_groups(by_stage: dict) -> str:
    """Distinct SHAs (7 characters; stage 07's ``-dirty`` dropped, docs/smol-run.md says why) of a run's stages in
    stage order, each with its runs of consecutive stages: "d8efed7", "d8efed7 (00-04), a8b0106 (05-07)",
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
    return (f"\n{who} (`benchmarks/cpu_machine_and_vllm_jobs.py`, `{rel(path)}`): "
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


def _root(preset: str, root: str | Path | None) -> tuple[Path, Path]:
    """(metrics root, how the generated text names it)."""
    root = Path(root) if root else results_dir(preset)
    if not finished_stages(root):
        raise StageError(f"{root} holds no results; run `make results PRESET={preset}` after a run")
    return root, (root.relative_to(REPO_ROOT) if root.is_relative_to(REPO_ROOT) else root)


def _metrics(root: Path, stage: str) -> dict:
    return read_json(root / stage / "metrics.json") if (root / stage / "metrics.json").exists() else {}


def results_doc(preset: str, readme: str | Path = README) -> Path:
    """``docs/results-<preset>.md`` beside ``readme``."""
    return Path(readme).parent / "docs" / f"results-{preset}.md"


def readme_block(preset: str, root: str | Path | None = None) -> str:
    """The generated README block body: the headline numbers of ``results/<preset>`` (or ``root``) with their
    intervals, and the GPU run's two-stage drafter where the manifest's section for it exists."""
    root, rel_root = _root(preset, root)
    rows, notes = [], []
    m1, m3, m6 = (_metrics(root, s) for s in ("01_qad", "03_drafter_finetune", "06_evaluation"))
    if m1.get("qad_vs_gptq_kl"):
        c = m1["qad_vs_gptq_kl"]
        rows.append(("QAD W4A16's held-out KL to the FP teacher, as a fraction of GPTQ W4A16's", f"`{preset}` 01",
                     f"{c['ratio']:.3f}", _interval(c, "ratio_ci95", "n_conversations", "conversations")))
    rows += _two_stage_rows(m3, f"`{preset}` 03", ("pretrain",))
    for model, name in (("qad", "QAD W4A16"), ("gptq", "GPTQ W4A16")):
        for task, v in ((m6.get("quality") or {}).get("vs_teacher", {}).get(model) or {}).items():
            rows.append((f"{name}'s score on `{task}` as a fraction of the teacher's", f"`{preset}` 06",
                         f"{v['fraction_of_teacher']:.3f}", _interval(v, "fraction_ci95", "items", "items")))
    for task, v in ((m6.get("quality") or {}).get("paired", {}).get("qad - gptq") or {}).items():
        lo, hi = v["diff_ci95"]
        rows.append((f"QAD minus GPTQ W4A16 score on `{task}`, paired over the same items", f"`{preset}` 06",
                     f"{v['diff']:+.3f}", f"{lo:+.3f}–{hi:+.3f} ({v['items']} items)"))
    t5 = _metrics(root, "05_serving").get("timing") or {}
    if t5.get("rounds"):
        run5 = root / "05_serving" / "run.json"
        cpu = (read_json(run5).get("cpu") or {}) if run5.exists() else {}
        where = f"{cpu.get('model', 'this run')}, {cpu.get('cores', '?')} cores" if cpu else "this run's machine"
        sp = t5["speedup"]
        rows.append((f"vLLM speed-up, W4A16 drafter over plain decoding, QAD target, batch 1, bf16, {where}: "
                     f"median of rounds", f"`{preset}` 05", f"{sp['median']:.2f}x",
                     f"range {sp['min']:.2f}–{sp['max']:.2f} ({t5['rounds']} rounds of {t5['prompts']} prompts; "
                     f"not a CI)"))
    for show, reads in bench_index.readme_sections(preset):
        if show == "gpu_stage03" and all(p.exists() for p in reads):
            gpu = _two_stage_rows(read_json(reads[0]), "`smol-gpu` 03", ("direct",))
            if gpu:
                rows += gpu
                notes.append(f"`smol-gpu`: the same target and method with more data, sized for one GPU; its stage 03 "
                             f"ran on one H200 (`{rel(reads[0].parent)}/`).")
        if show == "gpu_xl_epochs" and all(p.exists() for p in reads):
            xl = _grid_rows(reads[0], "`smol-gpu-xl` 03", "pretrain")
            if xl:
                rows += xl
                epochs = read_json(reads[0].parent / "metrics-02_drafter_pretrain.json")["train"]["epochs"]
                notes.append(f"`smol-gpu-xl`: 50K conversations (40% written by the target itself), a 4-layer drafter "
                             f"trained {epochs} epochs; stages 00-03 ran on one H100 (`{rel(reads[0].parent)}/`), one "
                             f"training seed.")
        if show == "gpu_xl_repeat" and all(p.exists() for p in reads):
            again = _grid_rows(reads[0], "`smol-gpu-xl` 03, run 2", "pretrain")
            m4 = reads[0].parent / "metrics-04_drafter_quant.json"
            if again:
                rows += again
                if m4.exists():
                    q = read_json(m4)["table"]["w4a16"]["paired_tau_diff"]["fp32"]
                    rows.append(_diff_row("fp32 two-stage", "`smol-gpu-xl` 04, run 2", q, "W4A16 GPTQ"))
                notes.append(f"`smol-gpu-xl` run 2: the same recipe again, stages 00-04 on one H100 in one session "
                             f"(`{rel(reads[0].parent)}/`); GPU training is not bit-reproducible, so it is a second "
                             f"run, not a second seed.")
        if show == "gpu_xl_scaling" and all(p.exists() for p in reads):
            data_rows, data_runs = _data_curve_rows(reads)
            if data_rows:
                rows += data_rows
                notes.append("The `smol-gpu-xl` 02 data rows: the pretrained drafter on the FP target, every data "
                             "size trained the same optimizer steps, one training seed a point ("
                             + ", ".join(f"`{rel(r)}/`" for r in data_runs) + ")"
                             + _cross_run_note(data_runs, [p for p in reads if p.name.endswith(".grid.json")]) + ".")
        if show == "gpu_seeds" and all(p.exists() for p in reads):
            seeds = _seeds_rows(reads[0])
            if seeds:
                rows += seeds
                notes.append(f"The `smol-gpu-xl` 01 row over seeds: stage 01 of the same recipe on a smaller data set, "
                             f"once per training seed on one H100 (`{rel(reads[0])}/`).")
    head = (f"<!-- generated by `qdflash readme --preset {preset}` (`make figures`) from {rel_root}/; "
            f"edit the code in src/qdflash/results.py, not this block -->\n"
            f"*Preset `{preset}`, from `{rel_root}/` (stages {', '.join(s[:2] for s in finished_stages(root))}); "
            f"one run, one training seed per stage: the intervals are over prompts, items or conversations, not "
            f"over seeds unless a row says so; 95% bootstrap intervals. Every table: [docs/results-{preset}.md](docs/results-{preset}.md).*\n\n")
    table = ("| run, stage | result | value | 95% CI |\n|:--|:--|--:|:--|\n"
             + "".join(f"| {stage} | {what} | {value} | {ci} |\n" for what, stage, value, ci in rows)) if rows else ""
    lossless = _lossless_note(m3, _metrics(root, "05_serving"), m6)
    if lossless:
        notes.append(lossless)
    from .figures import stage_times_table
    st = stage_times_table(root)
    if len(st):
        # the CPU model every stage recorded, if one (a wall time of one run, not a median of repetitions)
        runs = [root / s / "run.json" for s in finished_stages(root) if (root / s / "run.json").exists()]
        cpus = {(c.get("model"), c.get("cores")) for c in (read_json(r).get("cpu") or {} for r in runs)}
        model, cores = next(iter(cpus)) if len(cpus) == 1 else (None, None)
        where = f" on {model}, {cores} cores, one run" if model and cores else " (one run)"
        notes.insert(0, f"Wall time of the `{preset}` run, all stages: {st['wall time s']['total']:.0f} s{where}.")
    import textwrap
    wrap = lambda t: textwrap.fill(t, 118, break_long_words=False, break_on_hyphens=False)   # noqa: E731
    comment, _, italic = head.strip().partition("\n")
    return comment + "\n" + wrap(italic) + "\n\n" + table + "".join(f"\n{wrap(n)}\n" for n in notes)


def _seeds_rows(run_dir: Path) -> list[tuple[str, str, str, str]]:
    """QAD against GPTQ over training seeds (``gpu_results.seeds_summary`` of a ``gpu_seeds.sh`` run)."""
    from .gpu_results import seeds_summary
    s = seeds_summary(run_dir).get("qad_vs_gptq_kl_ratio")
    if not s:
        return []
    lo, hi = s["ci95"]
    n = _seeds_conversations(run_dir)
    return [(f"QAD W4A16's held-out KL as a fraction of GPTQ W4A16's, mean of {s['seeds']} training seeds"
             + (f" ({n:,} conversations)" if isinstance(n, int) else ""), "`smol-gpu-xl` 01", f"{s['estimate']:.3f}",
             f"{lo:.3f}–{hi:.3f} ({s['seeds']} seeds, then {s['items']} conversations)")]


def _seeds_conversations(run_dir: Path) -> int | None:
    """Stage 00's ``n_prompts`` of a ``gpu_seeds.sh`` run (every seed trains on that data)."""
    cfg = run_dir / "config-s0-00_data.json"
    return read_json(cfg).get("n_prompts") if cfg.exists() else None


def _lossless_note(m3: dict, m5: dict, m6: dict) -> str:
    """Where speculative decoding gave plain greedy decoding's tokens, from the saved counts: the fp32 reference
    decoder's rows of stage 03, vLLM in bf16 (stage 05) and the bf16 reference decoder of stage 06, with the largest
    fp32 top-2 margin of the target at a first difference (a near-tie flipped by bf16 rounding when small)."""
    parts = []
    rows = [st for res in (m3.get("decoding") or {}).values() for d, st in res.items()
            if d != "plain" and st.get("measured_by") == "decoder" and "mismatched_outputs" in st]
    if rows:
        parts.append(f"the fp32 reference decoder (stage 03): {sum(r['mismatched_outputs'] for r in rows)} of "
                     f"{sum(r.get('prompts', 0) for r in rows)} differ")
    off = {k: v for k, v in (m5.get("offline") or {}).items() if v.get("greedy_mismatches_vs_plain") is not None}
    if off:
        margins = [c["margin"] for cs in (m5.get("mismatch_causes") or {}).values() for c in cs]
        n = m5.get("prompts") if isinstance(m5.get("prompts"), int) else len(m5.get("prompts") or [])
        parts.append(f"vLLM in bf16 (stage 05): {sum(v['greedy_mismatches_vs_plain'] for v in off.values())} of "
                     f"{n * len(off)}" + (f", each first where the target's fp32 top-2 margin is at most "
                                          f"{max(margins):.3f}" if margins else ""))
    sc = m6.get("speculation_check") or {}
    if sc.get("outputs"):
        k = sc.get("mismatched_token_outputs", sc.get("mismatched_outputs"))
        parts.append(f"the bf16 reference decoder (stage 06): {k} of {sc['outputs']}"
                     + (f", the largest margin at a first difference {sc['max_mismatch_margin']:.3f}"
                        if sc.get("max_mismatch_margin") is not None else
                        " (this run predates the per-output causes)" if k else ""))
    return ("Speculative outputs that differ from plain greedy decoding of the same target and precision: "
            + "; ".join(parts) + ".") if parts else ""


def _interval(d: dict, key: str, n_key: str, over: str) -> str:
    """``d[key]`` as "lo–hi (n over)", n from ``d[n_key]`` where saved."""
    from .decode_stats import ci_text
    return ci_text(d, key) + (f" ({d[n_key]} {over})" if d.get(n_key) else "")


_TAU_ROW = "tau of the two-stage drafter on the QAD W4A16 target (decoded, greedy)"


def _diff_row(other: str, stage: str, d: dict, what: str = "two-stage") -> tuple[str, str, str, str]:
    lo, hi = d["diff_ci95"]
    return (f"{what} minus {other} drafter tau, paired over the same prompts", stage, f"{d['diff']:+.3f}",
            f"{lo:+.3f}–{hi:+.3f}")


def _two_stage_rows(m3: dict, stage: str, against: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    """The two-stage drafter's tau on the QAD target and its paired difference to the drafters ``against``."""
    st = (m3.get("decoding") or {}).get("qad", {}).get("two_stage")
    if not st:
        return []
    rows = [(_TAU_ROW, stage, f"{st['tau']:.3f}", _interval(st, "tau_ci95", "prompts", "prompts"))]
    return rows + [_diff_row(o, stage, st["paired_tau_diff"][o]) for o in against
                   if (st.get("paired_tau_diff") or {}).get(o)]


def _grid_rows(grid: Path, stage: str, other: str) -> list[tuple[str, str, str, str]]:
    """The two-stage drafter's tau in a saved decoding grid (``decode-qad.json``) and its difference to ``other``,
    paired over the grid's prompts."""
    from .decode_stats import acceptance_stats, ci_text, paired_bootstrap, results_from_json
    res = {k: results_from_json(v) for k, v in read_json(grid)["results"].items()}
    if "two_stage" not in res:
        return []
    st = acceptance_stats(res["two_stage"])
    rows = [(_TAU_ROW, stage, f"{st['tau']:.3f}", f"{ci_text(st, 'tau_ci95')} ({len(res['two_stage'])} prompts)")]
    return rows + ([_diff_row(other, stage, paired_bootstrap(res["two_stage"], res[other]))] if other in res else [])


def results_page(preset: str, root: str | Path | None = None) -> str:
    """``docs/results-<preset>.md``: the key stage-07 tables of ``results/<preset>`` (or ``root``), the others
    linked, then the saved benchmark outputs the manifest names for ``preset``."""
    from .figures import stage_tables, tables_markdown
    root, rel_root = _root(preset, root)
    head = (f"# Results of the `{preset}` preset\n\n"
            f"<!-- generated by `qdflash readme --preset {preset}` (`make figures`) from {rel_root}/; "
            f"edit the code in src/qdflash/results.py and figures.py, not this file -->\n"
            f"*Preset `{preset}`, generated from `{rel_root}/` (stages "
            f"{', '.join(s[:2] for s in finished_stages(root))}) and the saved benchmark outputs "
            f"([benchmarks/README.md](../benchmarks/README.md)) by `make figures`; the stage tables are those of "
            f"`figures/{preset}/tables.md`.*\n\n")
    rest = [title for name, title, _ in stage_tables(root) if name not in README_TABLES]     # those with rows
    more = (f"\nMore tables from the same metrics in [`figures/{preset}/tables.md`](../figures/{preset}/tables.md): "
            + "; ".join(rest) + ".\n") if rest else ""
    return head + tables_markdown(root, level=LEVEL, only=README_TABLES) + more + extra_tables(preset, root)


# the stage tables docs/results-<preset>.md shows; the others are linked (figures/<preset>/tables.md)
README_TABLES = {"table-qad-vs-ptq", "table-drafters", "table-quality"}


def extra_tables(preset: str, root: Path) -> str:
    """Wall time per stage of the run, then the saved benchmark outputs the manifest names for ``preset``
    (``benchmarks/manifest.json``, ``readme_block``; for smol: CPU paths, GPU runs, the QAD recipe sweep), each where
    the files it reads exist."""
    from .figures import stage_times_table
    out = ""
    st = stage_times_table(root)
    if len(st):
        out += ("\nWall time per stage, s (each stage's `metrics.json`): "
                + ", ".join(f"{k} {v:.0f}" for k, v in st["wall time s"].items()) + ".\n")
    for show, reads in bench_index.readme_sections(preset):
        if all(p.exists() for p in reads):
            out += SECTIONS[show](reads, root)
    return out


# ----------------------------------------------------------------------- docs/results-<preset>.md's benchmark sections
# Each takes the files its manifest entry reads (benchmarks/manifest.json, readme_block) and the run's metrics root,
# and returns its Markdown; the paths it cites are the files it read.
def _dag_times(reads: list[Path], root: Path) -> str:
    from .figures import table_markdown
    from .gpu_results import dag_times_table
    dag, = reads
    d = read_json(dag)
    code = {k: sha_groups(d["stage_git_sha"][k]) if "stage_git_sha" in d else d["git_sha"][k][:7]
            for k in ("before", "after")}
    return "\n" + table_markdown(dag_times_table(dag), f"`make reproduce` seconds per stage: the run before "
                                  f"(code at {code['before']}) and this run (at {code['after']}), "
                                  "each alone on the 2-core CPU (`stage_times.txt`, papermill kernel starts "
                                  f"included; `{rel(dag.with_suffix('.md'))}` also compares the "
                                  "method's numbers)", LEVEL)


def _cpu_units(reads: list[Path], root: Path) -> str:
    from .figures import cpu_speed_table
    path, = reads
    t = cpu_speed_table(path)
    return (f"\nCPU units, new path / old path (`benchmarks/cpu_stages.py`, one run, `{rel(path)}`): "
            + ", ".join(f"{u} {r:.2f}x" for u, r in zip(t.index, t["new / old"])) + ".\n")


def _dag_times_amx(reads: list[Path], root: Path) -> str:
    from .figures import table_markdown
    from .gpu_results import dag_times_table
    amx, = reads
    d = read_json(amx)
    return "\n" + table_markdown(
        dag_times_table(amx, ("no AMX s", "AMX s")),
        f"`make reproduce` seconds per stage on two 2-core CPUs: results/smol (no AMX; code at "
        f"{sha_groups(d['stage_git_sha']['before'])}) and `{rel(bench_index.folder('cpu-amx-run') / 'smol')}` (an "
        f"Intel Xeon with AMX; code at {sha_groups(d['stage_git_sha']['after'])}), each alone on its machine "
        f"(`{rel(amx.with_suffix('.md'))}` also compares the method's numbers)", LEVEL)


def _qad_step_profiles(reads: list[Path], root: Path) -> str:
    from .gpu_results import qad_profile
    q = {k: qad_profile(p) for k, p in zip(("no AMX", "AMX"), reads)}
    return ("\nOne `smol` QAD step (4 x 256 tokens, `benchmarks/qad_step_profile.py`, "
            f"`{rel(reads[0].parent)}/qad-step-profile*.txt`), median step and the profiled step's self time split "
            "into matmuls / the rest (elementwise fake-quant, norms and activations, attention, softmax, optimizer): "
            + "; ".join(f"{k} {v['step_s']:.1f} s, {v['mm_s']:.2f} / {v['rest_s']:.2f} s" for k, v in q.items())
            + f". The AMX machine runs the matmuls {q['no AMX']['mm_s'] / q['AMX']['mm_s']:.2f}x as fast and "
            f"the rest {q['no AMX']['rest_s'] / q['AMX']['rest_s']:.2f}x as fast.\n")


def _drafter_scaling(reads: list[Path], root: Path) -> str:
    from .figures import table_markdown
    from .scaling import cpu_minutes_table, scaling_table
    run_dir = reads[0].parent
    out = ("\n" + table_markdown(scaling_table(run_dir), "Drafter scaling on one H200 (`smol-gpu` data, "
                                  "`benchmarks/drafter_scaling.py`; block-level tau estimate, 95% CI over "
                                  "held-out conversations)", LEVEL)
           + "\n![tau against conversations and epochs](../figures/smol/fig-drafter-scaling.png)\n")
    if (root / "02_drafter_pretrain" / "metrics.json").exists():
        out += "\n" + table_markdown(cpu_minutes_table(root, run_dir), "The sweep's points in minutes of this 2-core "
                                      "CPU (projection: stage 00's vLLM rate and stage 02's drafter rate of this run; "
                                      "`scaling.cpu_minutes_table`)", LEVEL)
    return out


def _gpu_drafters_decoded(reads: list[Path], root: Path) -> str:
    from .figures import table_markdown
    from .scaling import decode_table
    return "\n" + table_markdown(decode_table(reads[0].parent), "`smol-gpu` drafters on held-out prompts (one H200, "
                                  "reference decoder, greedy, 128 new tokens; 95% CI over prompts)", LEVEL)


def _gpu_stage03(reads: list[Path], root: Path) -> str:
    from .figures import decoding_table, table_markdown
    run, = reads
    m3 = read_json(run)
    return "\n" + table_markdown(decoding_table(None, m3).drop(columns=["steps"]).round(3),
                                  f"`smol-gpu` stage 03 on one H200 (run of 2026-12-04, "
                                  f"`{rel(run.parent)}/`): {m3['eval_prompts']} held-out prompts "
                                  f"x {m3['eval_new_tokens']} tokens, greedy, fp32, CUDA-graph decoder; 95% CI "
                                  "over prompts", LEVEL)


def _gpu_xl(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_summary
    xl = reads[0].parent
    return (f"\n`smol-gpu-xl` on one GPU (`benchmarks/gpu_xl.sh`, `{rel(xl)}/`):\n\n"
            + gpu_xl_summary(xl))


def _gpu_xl_training(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_training_summary
    run, earlier = reads[0].parent, reads[1].parent
    return (f"\n`smol-gpu-xl`, the drafter step and more epochs (`{rel(run)}/`):\n\n"
            + gpu_xl_training_summary(run, earlier))


def _gpu_xl_two_stage(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_two_stage_summary
    run, earlier = reads[0].parent, reads[1].parent
    return (f"\n`smol-gpu-xl` through stage 03: compiled features, batch 128, the two-stage drafter (`{rel(run)}/`):\n\n"
            + gpu_xl_two_stage_summary(run, earlier))


def _gpu_xl_depth(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_depth_summary
    run, earlier = reads[0].parent, reads[1].parent
    return (f"\n`smol-gpu-xl` stages 00-04 with a 4-layer drafter (`{rel(run)}/`):\n\n"
            + gpu_xl_depth_summary(run, earlier))


def _gpu_xl_steps(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_steps_summary
    run, earlier = reads[0].parent, reads[1].parent
    return (f"\n`smol-gpu-xl` with fewer drafter training steps, the 4-layer drafter (`{rel(run)}/`):\n\n"
            + gpu_xl_steps_summary(run, earlier))


def _gpu_xl_epochs(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_epochs_summary
    run, three, two = (r.parent for r in reads)
    epochs = read_json(run / "metrics-02_drafter_pretrain.json")["train"]["epochs"]
    return (f"\n`smol-gpu-xl` with {epochs} drafter epochs (`{rel(run)}/`):\n\n"
            + gpu_xl_epochs_summary(run, three, two))


def _gpu_xl_vocab(reads: list[Path], root: Path) -> str:
    from .gpu_results import gpu_xl_vocab_summary
    run, whole, timing = (r.parent for r in reads)
    return (f"\n`smol-gpu-xl` with a reduced draft vocabulary (`{rel(run)}/`):\n\n"
            + gpu_xl_vocab_summary(run, whole, timing))


def _gpu_xl_speed(reads: list[Path], root: Path) -> str:
    """Stages 00-01 and the batch-1 speed pass in fair rounds (reads: its ``speed-qad-pretrain.json``, then the
    metrics-01_qad.json of the run whose drafter it timed)."""
    from .gpu_results import gpu_xl_speed_summary
    run, earlier = (r.parent for r in reads)
    return (f"\n`smol-gpu-xl`: batch-1 speed in fair rounds (`{rel(run)}/`):\n\n" + gpu_xl_speed_summary(run, earlier))


def _gpu_xl_repeat(reads: list[Path], root: Path) -> str:
    """A second run of the preset's recipe, stages 00-04 and the speed pass (reads: its ``decode-qad.json``, then the
    earlier run's): the summary lines, then stage 04's per-position differences at the regime tau."""
    from .figures import quant_positions_table, table_markdown
    from .gpu_results import gpu_xl_repeat_summary
    run, earlier = (r.parent for r in reads)
    out = (f"\n`smol-gpu-xl` again, stages 00-04 and batch-1 speed (`{rel(run)}/`):\n\n"
           + gpu_xl_repeat_summary(run, earlier))
    qp = quant_positions_table(run)
    return out + ("\n" + table_markdown(qp.iloc[:, :4], "Stage 04 on the GPU at the regime tau: quantized minus fp32 "
                                        "two-stage drafter, acceptance at draft positions 1-4 on the QAD target, paired "
                                        "over the same prompts (95% CI; one training seed)", LEVEL) if not qp.empty else "")


def _regime_drafter_cpu(reads: list[Path], root: Path, title: str = "The regime drafter on this CPU",
                        target: str = "the CPU `smol` QAD W4A16 target") -> str:
    """A GPU-trained regime drafter on this CPU (reads: the GPU run's stage-02 metrics, the CPU stage-04 metrics.json,
    then verify_cost_k.py JSONs and stage-03 folders of gpu_drafter_on_cpu.py --finetune): stage 04's table, the
    finetunes' lines and per-position differences, then per vLLM run its table of k and its timed rounds."""
    from .figures import drafter_quant_table, quant_positions_table, table_markdown
    from .gpu_results import cpu_finetune_text, vllm_rounds_text
    gpu_run, dq = reads[0].parent, reads[1].parent
    runs = [f for f in reads[2:] if f.suffix == ".json"]
    finetunes = [f for f in reads[2:] if f.is_dir()]
    keep = ["mean acceptance length", "tau 95% CI (prompts)", "measured by", "drafter ms/step", "disk MB", "p0", "p1",
            "p2", "p3"]
    m = read_json(reads[1])
    out = (f"\n{title} (`{rel(dq.parent)}/`, README there):\n\n"
           + table_markdown(drafter_quant_table(dq)[keep], f"Stage 04 on this CPU for the GPU-trained drafter of "
                            f"`{rel(gpu_run)}/`: {target}, reference decoder, greedy, fp32, "
                            f"{m['eval_prompts']} held-out prompts x {m['eval_new_tokens']} tokens, one run (fp32: the "
                            f"drafter as it came back in bf16, decoded in fp32; p0-p3: acceptance at draft positions "
                            f"1-4)", LEVEL))
    if finetunes:
        out += ("\nThe same drafter finetuned on this CPU first, against its QAD target (`gpu_drafter_on_cpu.py "
                "--finetune`):\n\n" + "".join(cpu_finetune_text(f) for f in finetunes))
    qp = quant_positions_table(dq)
    if not qp.empty:
        out += "\n" + table_markdown(qp.iloc[:, :4], "Quantized minus fp32 drafter, acceptance at draft positions 1-4, "
                                     "paired over the same prompts (95% CI)", LEVEL)
    for f in runs:
        out += "\n" + _vllm_k_table(f) + "\n" + vllm_rounds_text(f)
    return out


def _vllm_k_table(f: Path, target: str = "the QAD W4A16 target", note: str = "") -> str:
    """A ``verify_cost_k.py`` JSON's table of configurations (``gpu_results.verify_cost_table``, empty columns dropped)
    under its title: the target and how its INT4 layers were served, the drafter, the prompts; ``note`` after them."""
    from .figures import table_markdown
    from .gpu_results import verify_cost_table, vllm_prompt_set
    r = read_json(f)
    n, src = vllm_prompt_set(r)
    vt = verify_cost_table(f)
    vt = vt.loc[:, (vt != "").any()]                # no empty column (e.g. no projection asked for)
    return table_markdown(vt, f"vLLM on this CPU, batch 1: {target}{_int4_clause(r)} + `{Path(r['drafter']).name}`, "
                              f"{n} held-out prompts of {src} x {r['max_tokens']} tokens, one pass per row{note} "
                              f"(`{rel(f)}`)", LEVEL)


def _regime_drafter_cpu_vocab(reads: list[Path], root: Path) -> str:
    """The whole-vocabulary regime drafter on this CPU (reads: its GPU run's stage-02 metrics, its CPU stage-04
    metrics.json and two verify_cost_k.py JSONs, as for ``_regime_drafter_cpu``; last the 8K drafter's stage-04
    metrics.json and its two vLLM JSONs on the same prompts, in the same order): that section, then the two
    vocabularies side by side."""
    from .gpu_results import cpu_vocab_compare_text
    whole, reduced, reduced_vllm = reads[:-3], reads[-3], reads[-2:]
    return (_regime_drafter_cpu(whole, root, "The whole-vocabulary regime drafter on this CPU") + "\n"
            + cpu_vocab_compare_text(whole[1].parent, reduced.parent, list(zip(whole[2:4], reduced_vllm))))


def _regime_drafter_cpu_xlqad(reads: list[Path], root: Path) -> str:
    """The regime drafter on the GPU run's own QAD target, on this CPU (reads: as for ``_regime_drafter_cpu`` with the
    GPU target's stage-04 metrics.json and its vLLM JSON(s); last the CPU target's stage-04 metrics.json and its vLLM
    JSON(s) on the same prompts, in the same order): that section, then the two targets side by side."""
    from .gpu_results import cpu_target_compare_text
    k = (len(reads) - 1) // 2
    gpu, cpu_dq, cpu_vllm = reads[: k + 1], reads[k + 1], reads[k + 2:]
    return (_regime_drafter_cpu(gpu, root, "The regime drafter on the GPU run's QAD target, on this CPU",
                                "the GPU run's QAD W4A16 target (`qad_back.py`)") + "\n"
            + cpu_target_compare_text(gpu[1].parent, cpu_dq.parent, list(zip(gpu[2:], cpu_vllm))))


def _regime_drafter_cpu_int4(reads: list[Path], root: Path) -> str:
    """The regime drafter on vLLM on this CPU with the INT4 layers served as W4A16 (reads: ``verify_cost_k.py
    --compare-w4a8``'s JSON, then a run's rounds against the faster plain target, then an earlier run served as W4A8 on
    the same prompts): its table of k, then ``gpu_results.cpu_int4_kernel_text``."""
    from .gpu_results import cpu_int4_kernel_text
    run, fp_rounds, earlier = reads
    return (f"\nThe regime drafter on vLLM on this CPU, INT4 layers served as W4A16 (`{rel(run.parent)}/`, README there):\n\n"
            + _vllm_k_table(run, "the GPU run's QAD W4A16 target", "; the W4A8 rows for comparison")
            + "\n" + cpu_int4_kernel_text(run, fp_rounds, earlier))


def _regime_curve(reads: list[Path], root: Path) -> str:
    """GPU runs' drafters against data and training steps (reads: each run's saved stage-02 metrics)."""
    from .figures import table_markdown
    from .gpu_results import regime_curve_table
    return ("\n" + table_markdown(regime_curve_table(reads), "Tau against data and drafter training, every GPU run "
                                   "that measured its drafters on held-out real prompts (greedy, fp32, CUDA-graph "
                                   "decoder or the walk along its outputs; 95% CI over prompts; one training seed per "
                                   "run; `gpu_results.regime_curve_table`)", LEVEL)
            + ("\n![tau against the rows each drafter trained on, every GPU run](../figures/smol/fig-regime-curve.png)\n"
               if (REPO_ROOT / "figures" / "smol" / "fig-regime-curve.png").exists() else ""))


def _data_curve_rows(reads: list[Path]) -> tuple[list[tuple], list[Path]]:
    """The README's rows for the data curves trained at equal steps (``drafter_scaling.py --steps``; runs by epochs
    confound steps with data and give none): real + self-prompted minus real only at the same size, and more
    conversations at the same steps, paired over the held-out real prompts; and the run folders they come from."""
    from .scaling import SOURCES, xl_curves, xl_scaling_pairs
    rows, runs = [], []
    for run in dict.fromkeys(p.parent for p in reads if p.name.startswith("scaling-")):
        if not all("steps_target" in p for c in xl_curves(run).values() for p, _ in c):
            continue
        for pr in xl_scaling_pairs(run):
            a, b = pr["a_point"], pr["b_point"]
            if pr["kind"] == "self-prompted vs real":
                what = (f"real + self-prompted minus real-only training conversations ({a['conversations']:,} each, "
                        f"{a['steps']:,} steps each): drafter tau, paired")
            elif pr["kind"] == "more data":
                what = (f"{a['conversations']:,} minus {b['conversations']:,} training conversations, "
                        f"{SOURCES[pr['sources']]} ({a['steps']:,} steps each): drafter tau, paired")
            else:
                continue
            lo, hi = pr["diff_ci95"]
            rows.append((what, "`smol-gpu-xl` 02 data", f"{pr['diff']:+.3f}",
                         f"{lo:+.3f}–{hi:+.3f} ({a['walk_prompts']} prompts)"))
            runs += [run] if run not in runs else []
    return rows, runs


def _cross_run_note(runs: list[Path], grids: list[Path]) -> str:
    """The README note's clause on the other runs' stage-02 drafters at the same steps (``xl_cross_run_pairs``): the
    range of their paired differences and where the intervals lie; empty without such pairs."""
    from .scaling import xl_cross_run_pairs
    pairs = [p for r in runs for p in xl_cross_run_pairs(r, grids)]
    if not pairs:
        return ""
    d = [p["diff"] for p in pairs]
    side = ("below 0" if all(p["diff_ci95"][1] < 0 for p in pairs) else
            "above 0" if all(p["diff_ci95"][0] > 0 for p in pairs) else "not all on one side of 0")
    others = sorted({f"{p['a_point']['run']}'s stage 02 ({p['a_point']['conversations']:,} conversations)" for p in pairs})
    return (f"; across runs, {' and '.join(others)} at the same steps minus each point: {min(d):+.3f} to {max(d):+.3f}, "
            f"paired, every interval {side}")


def _gpu_xl_scaling(reads: list[Path], root: Path) -> str:
    """The data curves of issue 34 (reads: gpu_xl.sh XL_SCALING runs' ``scaling-real.json`` and/or ``scaling-all.json``,
    a part per run folder, and any other run's ``tau-pretrain-fp.grid.json``: its stage-02 drafter, paired across runs
    with the points of equal steps): per run, the table, the points' steps against the preset's stage 02, the paired
    differences on the same held-out real prompts, the run's figure."""
    grids = [p for p in reads if p.name.endswith(".grid.json")]
    runs = dict.fromkeys(p.parent for p in reads if p.name.startswith("scaling-"))
    return "".join(_gpu_xl_scaling_run(run, grids) for run in runs)


def _gpu_xl_scaling_run(run: Path, grids: list[Path]) -> str:
    from .figures import table_markdown
    from .gpu_results import machine_of, paired_text
    from .scaling import SOURCES, xl_cross_run_pairs, xl_curves, xl_scaling_pairs, xl_scaling_table, xl_scaling_trained
    curves = xl_curves(run)
    pts = [p for c in curves.values() for p, _ in c]
    r = read_json(run / f"scaling-{next(iter(curves))}.json")
    where = machine_of(r)
    walked = {p.get("walk_prompts") for p in pts} - {None}
    out = "\n" + table_markdown(xl_scaling_table(run), f"The drafter against its training conversations, "
                                 f"{' and '.join(SOURCES[s] for s in curves)}, the `smol-gpu-xl` drafter trained "
                                 f"{xl_scaling_trained(run)}, one GPU ({where}; `benchmarks/drafter_scaling.py`, "
                                 f"`{rel(run)}/`): the decoder's tau walked on the same {'/'.join(map(str, walked))} "
                                 f"held-out real prompts (95% CI over prompts) and the block-level estimate (CI over "
                                 f"held-out conversations); one training seed a point", LEVEL)
    cfg, m0 = r["config"], run / "metrics-00_data.json"
    if m0.exists():
        n = read_json(m0)["n_train"]
        by_epochs = not any("steps_target" in p for p in pts)
        steps = sorted({p["steps"] for p in pts})
        out += (f"\nSteps per point: {steps[0]:,}" + (f"-{steps[-1]:,}" if len(steps) > 1 else "") + ", against "
                f"{cfg['epochs'] * (n // cfg['batch_size']):,} in the preset's stage 02 ({cfg['epochs']} epochs of all "
                f"{n:,} conversations at batch {cfg['batch_size']})"
                + ("; at a fixed number of epochs steps grow with the data, so these points confound the two "
                   "(`drafter_scaling.py --steps` holds the steps)" if by_epochs and len(steps) > 1
                   else "") + ".\n")
    def listed(pairs):
        return "".join(f"- {p['a']} minus {p['b']}: {paired_text(p)}\n" for p in pairs)
    pairs = xl_scaling_pairs(run)
    if pairs:
        out += "\nPaired over the same held-out real prompts (walked tau):\n" + listed(pairs)
    cross = xl_cross_run_pairs(run, grids)
    if cross:
        out += ("\nAcross runs, paired over the same prompts (the same data split and fp32 target: every prompt's "
                "output equal), another run's stage-02 drafter (decoded; the points walked, the same tau for a lossless "
                "greedy decoder) against the points of equal steps; its training ran in another session and through "
                "stage 02 rather than drafter_scaling.py, and these differences include both:\n" + listed(cross))
    fig = f"fig-xl-scaling-{run.name}"
    if (REPO_ROOT / "figures" / "smol" / f"{fig}.png").exists():
        out += f"\n![tau against training conversations, {run.name}](../figures/smol/{fig}.png)\n"
    return out


def _swa_long(reads: list[Path], root: Path) -> str:
    """The drafter window at long context (``benchmarks/swa_long_context.py``; reads: its JSON files, CPU then GPU):
    per run, the walked tau by drafter and serving window, one drafter step against the context length, and the paired
    differences."""
    from .figures import table_markdown
    from .gpu_results import machine_of, swa_long_summary, swa_long_tables
    out = ""
    for path in reads:
        r = read_json(path)
        where = machine_of(r)
        rows, steps = swa_long_tables(path)
        out += ("\n" + table_markdown(rows, f"The drafter window at long context, W = {r['window']}, {where} "
                                      f"(`{rel(path)}`): tau walked on the same long real prompts (one training seed "
                                      f"per drafter)", LEVEL)
                + "\n" + swa_long_summary(path)
                + "\n" + table_markdown(steps, f"One drafter step against the context in its cache, {where}: median "
                                         f"(quartiles) of interleaved repetitions, ms", LEVEL))
    return out


def _quality_tasks(reads: list[Path], root: Path) -> str:
    """Stage 06's log-likelihood quality tasks and the candidates, the teacher and a run's three INT4 targets
    (``benchmarks/quality_tasks.py``; reads: its JSON): the table and where the paired differences exclude zero."""
    from .figures import table_markdown
    from .gpu_results import machine_of, quality_tasks_summary, quality_tasks_table
    out = ""
    for path in reads:
        out += ("\n" + table_markdown(quality_tasks_table(path), f"Quality kept on stage 06's log-likelihood tasks "
                                       f"and four candidates, {machine_of(read_json(path))} (`{rel(path)}`): "
                                       f"accuracy and paired differences, 95% bootstrap intervals over items", LEVEL)
                + "\n" + quality_tasks_summary(path))
    return out


def _gpu_seeds(reads: list[Path], root: Path) -> str:
    from .figures import table_markdown
    from .gpu_results import seeds_summary, seeds_table
    run = reads[0]
    summary, n = seeds_summary(run), _seeds_conversations(run)
    out = "\n" + table_markdown(seeds_table(run, summary), f"QAD against GPTQ over training seeds, `smol-gpu-xl` recipe "
                                 + (f"at {n:,} conversations" if isinstance(n, int) else "on a smaller data set")
                                 + f", one H100 (`benchmarks/gpu_seeds.sh`; `{rel(run)}/`)", LEVEL)
    t = summary.get("two_stage_minus_direct_tau")
    if t:
        lo, hi = t["ci95"]
        tr = read_json(run / "metrics-s0-02_drafter_pretrain.json")["train"]
        ref = read_json(reads[1])["train"]            # the same recipe's pretrain drafter at the preset's full size
        out += (f"\nThe same run's drafters ({t['seeds']} seed{'s' * (t['seeds'] > 1)}): two-stage minus direct tau on "
                f"the QAD target {t['estimate']:+.3f} ({lo:+.3f}–{hi:+.3f}, {t['items']} prompts), at two-stage tau "
                f"{sum(t['side_a']) / len(t['side_a']):.3f}. Its pretrain drafter trained {tr['steps']} steps (training "
                f"loss {tr['final_loss']:.2f}, accuracy {tr['final_acc']:.3f} at the end) against {ref['steps']} steps "
                f"(loss {ref['final_loss']:.2f}, accuracy {ref['final_acc']:.3f}) at the preset's full size "
                f"(`{rel(reads[1].parent)}/`)"
                + (": an untrained drafter, so this says nothing about the paper's comparison.\n"
                   if tr["final_acc"] < ref["final_acc"] / 2 else ".\n"))
    return out


def _cpu_drafter_steps(reads: list[Path], root: Path) -> str:
    from .gpu_results import cpu_drafter_steps_summary
    folder = reads[0].parent
    return (f"\nThe `smol` drafter with more optimizer steps or a higher learning rate on this 2-core CPU "
            f"(`{rel(folder)}/`):\n\n" + cpu_drafter_steps_summary(folder))


def _draft_vocab(reads: list[Path], root: Path) -> str:
    from .gpu_results import draft_vocab_summary
    folder = reads[0].parent
    return f"\nA reduced draft vocabulary on this 2-core CPU (`{rel(folder)}/`):\n\n" + draft_vocab_summary(folder)


def _int4_clause(r: dict) -> str:
    """" (INT4 layers served as ...)" for a ``verify_cost_k.py`` JSON (``gpu_results.vllm_int4_path``); empty
    where neither the run nor its CPU record says."""
    from .gpu_results import vllm_int4_path
    path = vllm_int4_path(r)
    return "" if path == "?" else f" (INT4 layers served as {path})"


def _table(table: str, title):
    """A section that is one table of a ``gpu_results`` function over the one file (or folder) it reads; ``title``
    gets that path."""
    def section(reads: list[Path], root: Path) -> str:
        from . import gpu_results
        from .figures import table_markdown
        src, = reads
        return "\n" + table_markdown(getattr(gpu_results, table)(src), title(src), LEVEL)
    return section


def _qad_sweep(reads: list[Path], root: Path) -> str:
    from .figures import qad_sweep_table, table_markdown
    sweeps = sorted(reads[0].glob("*.json"))
    if not sweeps:
        return ""
    return "\n" + table_markdown(qad_sweep_table(sweeps), "QAD recipes on the smol data "
                                  "(`benchmarks/qad_sweep.py`, one H200; the same GPTQ start and held-out set)", LEVEL)


SECTIONS = {
    "dag_times": _dag_times,
    "cpu_units": _cpu_units,
    "machine_here": lambda reads, root: _machine_line(reads[0], "The CPU of results/smol"),
    "machine_amx": lambda reads, root: _machine_line(reads[0], "The Intel CPU with AMX"),
    "dag_times_amx": _dag_times_amx,
    "qad_step_profiles": _qad_step_profiles,
    "drafter_scaling": _drafter_scaling,
    "gpu_drafters_decoded": _gpu_drafters_decoded,
    "gpu_stage03": _gpu_stage03,
    "gpu_xl": _gpu_xl,
    "gpu_xl_training": _gpu_xl_training,
    "gpu_xl_two_stage": _gpu_xl_two_stage,
    "gpu_xl_depth": _gpu_xl_depth,
    "gpu_xl_steps": _gpu_xl_steps,
    "gpu_xl_epochs": _gpu_xl_epochs,
    "gpu_xl_vocab": _gpu_xl_vocab,
    "gpu_xl_repeat": _gpu_xl_repeat,
    "gpu_xl_speed": _gpu_xl_speed,
    "regime_curve": _regime_curve,
    "regime_drafter_cpu": _regime_drafter_cpu,
    "regime_drafter_cpu_vocab": _regime_drafter_cpu_vocab,
    "regime_drafter_cpu_xlqad": _regime_drafter_cpu_xlqad,
    "regime_drafter_cpu_int4": _regime_drafter_cpu_int4,
    "draft_vocab": _draft_vocab,
    "cpu_drafter_steps": _cpu_drafter_steps,
    "gpu_seeds": _gpu_seeds,
    "swa_long": _swa_long,
    "quality_tasks": _quality_tasks,
    "gpu_xl_scaling": _gpu_xl_scaling,
    "plain_decode": _table("plain_decode_table", lambda p: (
        "Batch-1 plain decoding of the smol target on one H200, bf16, 128 new tokens "
        f"(`benchmarks/gpu_fast_decode.py`; `{rel(p.parent)}/`)")),
    "spec_decode": _table("spec_decode_table", lambda p: (
        "Batch-1 speculative decoding on one H200, CUDA graphs, bf16, FP smol target, the smol-gpu two-stage drafter "
        "(W4A16 GPTQ / W8A16 RTN de-quantized) and the pretrain drafter, 16 held-out smol prompts x 128 tokens "
        f"(`{rel(p.parent)}/`)")),
    "verify_cost": _table("verify_cost_table", lambda p: (
        f"vLLM on this 2-core CPU, batch 1: QAD W4A16 target{_int4_clause(read_json(p))} + the "
        "smol-gpu two-stage drafter (W4A16 GPTQ) against k "
        "drafted tokens, 12 held-out prompts (4 per length tercile) x 96 tokens (`benchmarks/verify_cost_k.py`)")),
    "walk_check": _table("walk_check_table", lambda p: (
        "Acceptance by teacher forcing (walk) against the reference decoder on this 2-core CPU: the smol-gpu drafters "
        "on this run's FP and QAD W4A16 targets, 8 held-out prompts x 64 tokens, greedy, fp32, eager "
        "(`benchmarks/walk_vs_decoder.py`; walk s: the drafter steps, after the target forwards that all drafters of a "
        "target share)")),
    "projection": _table("projection_table", lambda p: (
        "Qwen3.5-4B shapes on one H200, random weights, eager bf16, batch 1, 1,024-token context: step costs and the "
        "projected speedup tau x t_verify(1) / (t_draft + t_verify(16)), a projection "
        f"(`{rel(p)}/`)")),
    "fsdp": _table("fsdp_table", lambda p: (
        "FSDP steps through torchrun on one H200: SmolLM2-135M (real weights) and Qwen3.5-4B shapes (random weights) "
        "(`benchmarks/gpu_fsdp.sh`; estimate: `memory_plan.py` for the same shapes)")),
    "qad_sweep": _qad_sweep,
}


def read_block(readme: str | Path = README) -> tuple[str, str]:
    """(preset, body) of the README's results block."""
    m = BLOCK_RE.search(Path(readme).read_text())
    if not m:
        raise StageError(f"{readme} has no `<!-- results:begin preset=P -->` ... `<!-- results:end -->` block")
    return m["preset"], m["body"]


def stale_results_files(preset: str | None = None, readme: str | Path = README,
                        root: str | Path | None = None) -> list[Path]:
    """The generated files (the README, ``docs/results-<preset>.md``) that differ from what ``results/<preset>``
    (default: the README block's preset) generates; empty when both are current."""
    shown, body = read_block(readme)
    preset = preset or shown
    doc = results_doc(preset, readme)
    stale = [] if preset == shown and body == readme_block(preset, root) else [Path(readme)]
    return stale + ([] if doc.exists() and doc.read_text() == results_page(preset, root) else [doc])


def update_readme(preset: str | None = None, readme: str | Path = README, root: str | Path | None = None) -> bool:
    """Regenerate the README block (for ``preset``, default the block's own) and ``docs/results-<preset>.md``
    beside it; True when either file changed."""
    readme = Path(readme)
    old_preset, _ = read_block(readme)
    preset = preset or old_preset
    text = readme.read_text()
    body = readme_block(preset, root)
    new = BLOCK_RE.sub(lambda m: f"<!-- results:begin preset={preset} -->\n{body}<!-- results:end -->", text,
                       count=1)
    changed = new != text
    if changed:
        atomic_write_text(readme, new)
    doc, page = results_doc(preset, readme), results_page(preset, root)
    if not doc.exists() or doc.read_text() != page:
        doc.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(doc, page)
        changed = True
    return changed
