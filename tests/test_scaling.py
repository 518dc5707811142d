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
    """Two XL_SCALING curves on 4 prompts: real-only and real + self-prompted points at 100 and 200 conversations and
    a 300-conversation real + self-prompted point; each walked point's accept lengths set so that its tau is known."""
    def point(src, n, lengths):
        res = [{"tokens": [0] * sum(lengths), "accept_lengths": lengths}] * 4
        tau = sum(lengths) / len(lengths)
        return {"conversations": n, "epochs": 1, "sources": src, "steps": n // 10, "train_s": 1.0, "tau_est": tau + 0.2,
                "tau_est_ci95": [tau, tau + 0.4], "tau_walk": tau, "tau_walk_ci95": [tau - 0.1, tau + 0.1],
                "walk_prompts": 4, "walk_results": res}
    real = [point("real", 100, [1, 2]), point("real", 200, [2, 2])]                  # tau 1.5, 2.0
    allp = [point("all", 100, [1, 1]), point("all", 200, [2, 3]), point("all", 300, [3, 3])]   # 1.0, 2.5, 3.0
    (tmp_path / "scaling-real.json").write_text(json.dumps({"points": real}))
    (tmp_path / "scaling-all.json").write_text(json.dumps({"points": allp}))
    return tmp_path


def test_xl_curves_pair_equal_sizes_and_the_largest_points(tmp_path):
    from qdflash.scaling import xl_scaling_pairs, xl_scaling_table
    run = _xl_run(tmp_path)
    pairs = xl_scaling_pairs(run)
    got = [(p["a"], p["b"], round(p["diff"], 6)) for p in pairs]
    assert got == [("real + self-prompted, 100", "real only, 100", -0.5),
                   ("real + self-prompted, 200", "real only, 200", 0.5),
                   ("real + self-prompted, 300", "real only, 200", 1.0)]     # largest against largest
    assert all(p["diff_ci95"][0] <= p["diff"] <= p["diff_ci95"][1] for p in pairs)
    t = xl_scaling_table(run)
    assert t.loc[("real only", 200), "tau (walked)"] == 2.0 and len(t) == 5


def test_xl_figure_draws_both_curves(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from qdflash.scaling import xl_scaling_plot
    ax = xl_scaling_plot(_xl_run(tmp_path)).axes[0]
    ys = [line.get_ydata().tolist() for line in ax.get_lines()]
    assert [1.5, 2.0] in ys and [1.0, 2.5, 3.0] in ys
