"""The scaling tables and figure read the saved GPU run and nothing else."""
import json

from qdflash.scaling import decode_table, scaling_plot, scaling_table


def _run(tmp_path):
    pts = [{"conversations": n, "epochs": e, "steps": n // 10, "train_s": 1.0, "response_tokens": 100 * n,
            "tau_est": t, "tau_est_ci95": [t - 0.1, t + 0.1], "per_position": [t - 1, 0.0]}
           for n, e, t in ((1000, 4, 1.2), (4000, 4, 1.7), (4000, 1, 1.4))]
    (tmp_path / "scaling.json").write_text(json.dumps({"points": pts, "config": {"epochs": 4}}))
    grid = {"plain": {"tau": 1.0}, "pretrain": {"tau": 1.5, "tau_ci95": [1.4, 1.6], "speedup": 1.3,
                                                 "mismatched_outputs": 0}}
    (tmp_path / "eval-fp.json").write_text(json.dumps({"prompts": 32, "grid": grid}))
    (tmp_path / "eval-qad-twostage.json").write_text(json.dumps(
        {"drafter": "two_stage", "prompts": 32, "stats": {"tau": 1.6, "tau_ci95": [1.5, 1.7]}}))
    return tmp_path


def test_tables_carry_the_saved_numbers(tmp_path):
    run = _run(tmp_path)
    t = scaling_table(run)
    assert list(t.index) == [(4000, 1), (1000, 4), (4000, 4)]           # by epochs, then conversations
    assert t.loc[(4000, 4), "tau estimate"] == 1.7 and t.loc[(4000, 4), "95% CI"] == "1.600–1.800"
    d = decode_table(run)
    assert len(d) == 2 and "plain" not in {i[1] for i in d.index}       # plain decoding is the baseline, not a row
    assert d["tau"].tolist() == [1.5, 1.6]


def test_figure_marks_the_reference_decoder_point(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    fig = scaling_plot(_run(tmp_path))
    a, b = fig.axes
    ys = [line.get_ydata().tolist() for line in a.get_lines() if len(line.get_ydata()) == 1]
    assert [1.5] in ys                                                   # the pretrain drafter's true tau
    assert any(line.get_ydata().tolist() == [1.2, 1.7] for line in a.get_lines())


def _xl_run(tmp_path):
    """Two XL_SCALING curves on 4 prompts: real-only points at 100 and 200 conversations, real + self-prompted at 100,
    200 and 300 (twice at 300: 30 and 60 steps). Each walked point's per-prompt accept lengths differ between prompts,
    and its saved tau_walk summary is a decoy (9.0), so only per-prompt pairing gives the expected differences."""
    def point(src, n, per_prompt, steps=None):
        res = [{"tokens": [0] * sum(al), "accept_lengths": al} for al in per_prompt]
        tau = sum(map(sum, per_prompt)) / sum(map(len, per_prompt))
        return {"conversations": n, "epochs": 1, "sources": src, "steps": steps or n // 10, "train_s": 1.0,
                "tau_est": tau + 0.2, "tau_est_ci95": [tau, tau + 0.4], "tau_walk": 9.0, "tau_walk_ci95": [8.9, 9.1],
                "walk_prompts": 4, "walk_results": res}
    real = [point("real", 100, [[1, 1], [2, 2], [3, 3], [4, 4]]),                          # tau 2.5
            point("real", 200, [[2, 2], [2, 2], [2, 2], [2, 2]], steps=40)]                # 2.0
    allp = [point("all", 100, [[2, 2], [2, 2], [4, 4], [4, 4]]),                           # 3.0
            point("all", 200, [[1, 1], [1, 1], [3, 3], [3, 3]], steps=40),                 # 2.0
            point("all", 300, [[3, 3], [3, 3], [3, 3], [3, 3]], steps=30),                 # 3.0, closest in steps
            point("all", 300, [[4, 4], [4, 4], [4, 4], [4, 4]], steps=60)]                 # 4.0
    allp[3]["epochs"] = 2
    (tmp_path / "scaling-real.json").write_text(json.dumps({"points": real}))
    (tmp_path / "scaling-all.json").write_text(json.dumps({"points": allp}))
    return tmp_path


def test_xl_curves_pair_equal_sizes_and_the_largest_points(tmp_path):
    from qdflash.scaling import xl_scaling_pairs, xl_scaling_table
    run = _xl_run(tmp_path)
    pairs = xl_scaling_pairs(run)
    got = [(p["a"], p["b"], round(p["diff"], 6)) for p in pairs]
    assert got == [("real + self-prompted, 100 conversations, 10 steps", "real only, 100 conversations, 10 steps", 0.5),
                   ("real + self-prompted, 200 conversations, 40 steps", "real only, 200 conversations, 40 steps", 0.0),
                   ("real + self-prompted, 300 conversations, 30 steps", "real only, 200 conversations, 40 steps", 1.0)]
    lo, hi = pairs[0]["diff_ci95"]
    assert lo < 0.5 < hi and hi - lo > 0.1            # prompts differ: the paired bootstrap has a width
    lo, hi = pairs[1]["diff_ci95"]
    assert lo < 0 < hi                                 # equal pooled tau, unequal prompts
    t = xl_scaling_table(run)
    assert len(t) == 6 and set(t["tau (walked)"]) == {9.0}       # the table shows the saved summaries as they are


def test_xl_pairs_more_data_at_equal_steps_and_no_largest_pair_when_real_reaches_further(tmp_path):
    """The equal-steps design (drafter_scaling.py --steps): every point trains the same steps, so within a curve the
    largest minus the smallest size is what more conversations add at equal training; where the real-only curve is the
    longer one, there is no "self-prompted on top of every real conversation" pair."""
    from qdflash.scaling import xl_scaling_pairs
    def point(src, n, per_prompt):
        res = [{"tokens": [0] * sum(al), "accept_lengths": al} for al in per_prompt]
        return {"conversations": n, "epochs": 100 / n, "sources": src, "steps": 10, "steps_target": 10,
                "train_s": 1.0, "tau_est": 2.0, "tau_est_ci95": [1.9, 2.1], "tau_walk": 9.0,
                "tau_walk_ci95": [8.9, 9.1], "walk_prompts": 3, "walk_results": res}
    real = [point("real", 400, [[3, 3], [2, 2], [4, 4]]), point("real", 100, [[1, 1], [2, 2], [3, 3]]),
            point("real", 200, [[1, 1], [1, 1], [1, 1]])]
    allp = [point("all", 100, [[2, 2], [2, 2], [2, 2]])]
    (tmp_path / "scaling-real.json").write_text(json.dumps({"points": real}))
    (tmp_path / "scaling-all.json").write_text(json.dumps({"points": allp}))
    got = [(p["a"], p["b"], round(p["diff"], 6)) for p in xl_scaling_pairs(tmp_path)]
    assert got == [("real + self-prompted, 100 conversations, 10 steps", "real only, 100 conversations, 10 steps", 0.0),
                   ("real only, 400 conversations, 10 steps", "real only, 100 conversations, 10 steps", 1.0)]


def test_xl_figure_draws_both_curves(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from qdflash.scaling import xl_scaling_plot
    run = _xl_run(tmp_path)
    for src in ("real", "all"):            # the figure's points: the saved walked tau of each point, by size
        f = run / f"scaling-{src}.json"
        d = json.loads(f.read_text())
        for i, p in enumerate(d["points"]):
            p["tau_walk"] = 1.0 + i / 10
            p["tau_walk_ci95"] = [p["tau_walk"] - 0.05, p["tau_walk"] + 0.05]
        f.write_text(json.dumps(d))
    ax = xl_scaling_plot(run).axes[0]
    ys = [[round(y, 3) for y in line.get_ydata().tolist()] for line in ax.get_lines()]
    assert [1.0, 1.1] in ys and [1.0, 1.1, 1.2, 1.3] in ys
    assert "(1/2 epochs a point," in ax.get_xlabel()
    same = [[0] * n for n in (2, 4, 6, 8)]     # the first walked point's outputs: the same prompts and target
    grid = _other_run(tmp_path, [[3, 3], [3, 3], [3, 3], [3, 3]], tokens=same)   # another run's stage 02, tau 3.0
    ax = xl_scaling_plot(run, (grid,)).axes[0]
    assert [([5000], [3.0])] == [(ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in ax.get_lines()
                                 if ln.get_xdata().tolist() == [5000] and ln.get_marker() == "o"]   # not its caps
    (tmp_path / "x").mkdir()
    other = _other_run(tmp_path / "x", [[3, 3]] * 4, steps=99, tokens=same)
    ax = xl_scaling_plot(run, (other,)).axes[0]          # trained other steps than every point: left out
    assert not [ln for ln in ax.get_lines() if ln.get_xdata().tolist() == [5000]]


def _other_run(tmp_path, per_prompt, steps=10, tokens=None):
    """Another gpu_xl.sh run's stage-02 drafter: its grid on the same prompts, its steps and conversations."""
    run = tmp_path / "other-run"
    run.mkdir(exist_ok=True)
    res = [{"tokens": tokens[i] if tokens else [0] * sum(al), "accept_lengths": al} for i, al in enumerate(per_prompt)]
    (run / "tau-pretrain-fp.grid.json").write_text(json.dumps({"results": {"plain": [], "pretrain": res}}))
    (run / "metrics-02_drafter_pretrain.json").write_text(json.dumps({"train": {"steps": steps}}))
    (run / "metrics-00_data.json").write_text(json.dumps({"n_train": 5000}))
    return run / "tau-pretrain-fp.grid.json"


def test_xl_cross_run_pairs_match_steps_and_refuse_other_prompts(tmp_path):
    """Another run's stage-02 drafter pairs with every walked point of its steps (here the two 10-step points, not the
    40-step ones), per prompt; outputs that differ from the points' (another split or target) raise."""
    import pytest

    from qdflash.scaling import xl_cross_run_pairs
    (tmp_path / "xl").mkdir()
    run = _xl_run(tmp_path / "xl")
    same = [[i] * 9 for i in range(4)]           # a lossless decoder's outputs: each prompt's own, in every point
    for src in ("real", "all"):
        f = run / f"scaling-{src}.json"
        d = json.loads(f.read_text())
        for p in d["points"]:
            for i, r in enumerate(p["walk_results"]):
                r["tokens"] = same[i]
        f.write_text(json.dumps(d))
    grid = _other_run(tmp_path, [[3, 3], [3, 3], [3, 3], [3, 3]], tokens=same)          # tau 3.0
    got = [(p["a"], p["b"], round(p["diff"], 6)) for p in xl_cross_run_pairs(run, [grid])]
    a = "other-run's stage 02, real + self-prompted, 5,000 conversations, 10 steps"
    assert got == [(a, "real only, 100 conversations, 10 steps", 0.5),
                   (a, "real + self-prompted, 100 conversations, 10 steps", 0.0)]
    from qdflash.results import _cross_run_note        # the README's clause: the range and where the intervals lie
    assert _cross_run_note([run], [grid]).startswith("; across runs, other-run's stage 02 (5,000 conversations) at "
                                                     "the same steps minus each point: +0.000 to +0.500, paired")
    bad = _other_run(tmp_path, [[3, 3], [3, 3], [3, 3], [3, 3]], tokens=same[:3] + [[5] * 9])
    with pytest.raises(ValueError, match="prompts or target differ"):
        xl_cross_run_pairs(run, [bad])


def test_readme_rows_come_only_from_curves_at_equal_steps(tmp_path):
    """The README's data rows: a curve trained at equal steps (drafter_scaling.py --steps) gives its paired
    differences; a curve by epochs (steps grow with the data) gives none."""
    from qdflash.results import _data_curve_rows

    def point(src, n, per_prompt, **kw):
        res = [{"tokens": [0] * sum(al), "accept_lengths": al} for al in per_prompt]
        return {"conversations": n, "epochs": 1, "sources": src, "steps": 10, "train_s": 1.0, "tau_est": 2.0,
                "tau_est_ci95": [1.9, 2.1], "tau_walk": 2.0, "tau_walk_ci95": [1.9, 2.1], "walk_prompts": 3,
                "walk_results": res, **kw}
    for name, extra, extra_all in (("steps", {"steps_target": 10}, {"steps_target": 10}), ("epochs", {}, {}),
                                   ("mixed", {"steps_target": 10}, {})):     # mixed: one curve by epochs
        run = tmp_path / name
        run.mkdir()
        (run / "scaling-real.json").write_text(json.dumps({"points": [
            point("real", 100, [[1, 1], [2, 2], [3, 3]], **extra), point("real", 400, [[3, 3], [2, 2], [4, 4]], **extra)]}))
        (run / "scaling-all.json").write_text(json.dumps({"points": [point("all", 100, [[2, 2], [2, 2], [2, 2]],
                                                                           **extra_all)]}))
    rows, runs = _data_curve_rows([tmp_path / d / f"scaling-{c}.json" for d in ("epochs", "mixed", "steps")
                                   for c in ("real", "all")])
    assert runs == [tmp_path / "steps"]
    assert [(r[0].split(":")[0], r[2]) for r in rows] == [
        ("real + self-prompted minus real-only training conversations (100 each, 10 steps each)", "+0.000"),
        ("400 minus 100 training conversations, real only (10 steps each)", "+1.000")]
    assert all(r[3].endswith("(3 prompts)") for r in rows)
