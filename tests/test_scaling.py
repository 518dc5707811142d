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
