"""What the figures show, on the committed smol results (seconds, no run): no plot of curves that lie on each other,
no drafter-only bar beside decoded rows, training curves of stage 03 aligned by the drafter steps trained in all."""
import json

import matplotlib
import pytest

from conftest import REPO

matplotlib.use("Agg")
RES = REPO / "results" / "smol"


def test_per_position_plots_distinct_curves_and_the_quantized_drafters_as_paired_differences():
    from qdflash.figures import per_position_plot
    tab = json.loads((RES / "04_drafter_quant" / "metrics.json").read_text())["table"]
    fig = per_position_plot(RES / "04_drafter_quant")
    curves = [ln.get_label() for ln in fig.axes[0].lines]
    assert curves and not any(c.startswith(("w4a16", "w8a16")) for c in curves)
    quantized = [k for k in tab if k.split("-swa")[0] in ("w4a16", "w8a16")]
    assert len(fig.axes) == 2 and len(fig.axes[1].get_yticklabels()) == len(quantized)
    # the right panel's points are each quantized row's paired difference to the fp32 drafter of its group
    xs = sorted(float(x) for x in fig.axes[1].lines[0].get_xdata())
    assert xs == pytest.approx(sorted(tab[k]["paired_tau_diff"]["fp32"]["diff"] for k in quantized))


def test_time_split_leaves_out_walked_rows_and_the_repeated_plain_row():
    from qdflash.figures import time_split_plot
    tab = json.loads((RES / "04_drafter_quant" / "metrics.json").read_text())["table"]
    shown = {t.get_text() for t in time_split_plot(RES / "04_drafter_quant").axes[0].get_yticklabels()}
    assert shown == {k for k, v in tab.items() if v.get("measured_by") != "walk" and not k.startswith("plain_")}
    assert any(v.get("measured_by") == "walk" for v in tab.values())     # there was something to leave out


def test_stage_03_training_curves_continue_the_two_stage_drafter_after_its_pretraining():
    from qdflash.figures import training_curves, training_frame
    pre = json.loads((RES / "02_drafter_pretrain" / "metrics.json").read_text())["train"]["steps"]
    df, offset = training_frame(RES / "03_drafter_finetune")
    first = df.groupby("run")["step"].min()
    assert offset == pre and first["two_stage"] == pre + 1 and first["direct"] == 1
    assert df.groupby("run")["step"].max()["pretrain (stage 02)"] == pre
    assert "after its pretraining" in training_curves(RES / "03_drafter_finetune").axes[0].get_xlabel()


def test_the_readme_states_where_decoding_is_lossless_from_the_saved_counts():
    from qdflash.results import _lossless_note, _metrics, readme_block
    m3, m5, m6 = (_metrics(RES, s) for s in ("03_drafter_finetune", "05_serving", "06_evaluation"))
    note = _lossless_note(m3, m5, m6)
    dec = [st for res in m3["decoding"].values() for d, st in res.items() if st.get("measured_by") == "decoder"
           and d != "plain"]
    assert f"(stage 03): {sum(s['mismatched_outputs'] for s in dec)} of {sum(s['prompts'] for s in dec)} differ" in note
    vllm = sum(v["greedy_mismatches_vs_plain"] for v in m5["offline"].values()
               if v.get("greedy_mismatches_vs_plain") is not None)
    assert f"(stage 05): {vllm} of " in note
    assert f"(stage 06): {m6['speculation_check'].get('mismatched_token_outputs', m6['speculation_check']['mismatched_outputs'])} of" in note
    assert " ".join(note.split()) in " ".join(readme_block("smol").split())


def test_the_readme_quotes_the_served_speedup_as_the_median_of_its_rounds(tmp_path):
    """The stage 05 row is the median of the per-round ratios with their range, and the timing table holds the same
    numbers; a run without rounds shows no such row."""
    import shutil

    from qdflash.figures import timing_table
    from qdflash.results import readme_block
    root = tmp_path / "smol"
    shutil.copytree(RES, root)
    m5 = json.loads((root / "05_serving" / "metrics.json").read_text())
    m5["timing"] = {"plain": "qad-plain", "spec": "qad-w4a16", "prompts": 4, "max_tokens": 64, "rounds": 5,
                    "rounds_failed": 0, "speedup_per_round": [0.7, 0.9, 0.8, 0.75, 0.85],
                    "speedup": {"median": 0.8, "min": 0.7, "max": 0.9},
                    "plain_tokens_per_s": {"median": 20.0, "min": 19.0, "max": 21.0},
                    "spec_tokens_per_s": {"median": 16.0, "min": 15.0, "max": 17.0}}
    (root / "05_serving" / "metrics.json").write_text(json.dumps(m5))
    block = " ".join(readme_block("smol", root).split())
    assert "| 0.80x | range 0.70–0.90 (5 rounds of 4 prompts; not a CI) |" in block
    assert timing_table(root / "05_serving").loc["speed-up (ratio within a round)", "median"] == 0.8
    m5["timing"] = {}
    (root / "05_serving" / "metrics.json").write_text(json.dumps(m5))
    assert "median of rounds" not in readme_block("smol", root)


def test_the_readme_wall_time_names_the_machine_only_where_every_stage_ran_on_one(tmp_path):
    """The committed run's stages all recorded one CPU model (AMD EPYC): the wall-time line names it; a stage on another
    CPU leaves the line with no machine."""
    import shutil

    from qdflash.results import readme_block
    root = tmp_path / "smol"
    shutil.copytree(RES, root)
    import re
    assert re.search(r"all stages: \d+ s on AMD EPYC, 2 cores, one run\.", " ".join(readme_block("smol", root).split()))
    r = json.loads((root / "04_drafter_quant" / "run.json").read_text())
    r["cpu"]["model"] = "Intel Xeon"
    (root / "04_drafter_quant" / "run.json").write_text(json.dumps(r))
    assert re.search(r"all stages: \d+ s \(one run\)\.", " ".join(readme_block("smol", root).split()))


def test_quant_positions_table_pairs_each_quantized_row_with_the_fp32_row_of_its_window(tmp_path):
    """On a hand-made decode-04.json whose rows differ by known rates at known positions: each cell is the quantized
    row minus the fp32 row with the same window (pairing with the other window's fp32 row, a flipped sign or a shifted
    position would give other cells), and no grid gives an empty table."""
    from qdflash.decode_stats import GenResult, results_to_json
    from qdflash.figures import quant_positions_table
    assert quant_positions_table(tmp_path).empty

    def rows(lens):           # 3 prompts, block size 4: every prompt's verify steps accept these lengths
        return results_to_json([GenResult(tokens=[1, 2], accept_lengths=list(lens), block_size=4) for _ in range(3)])
    grid = {"prompts": [[1], [2], [3]], "max_new_tokens": 8, "swa_window": 2, "results": {
        "plain": rows([1, 1]), "fp32": rows([4, 4]), "w8a16": rows([4, 4]), "w4a16": rows([3, 3]),
        "fp32-swa2": rows([2, 2]), "w8a16-swa2": rows([2, 2]), "w4a16-swa2": rows([1, 1])}}
    (tmp_path / "decode-04.json").write_text(json.dumps(grid))
    t = quant_positions_table(tmp_path)
    assert list(t.index) == [("fp32", "off"), ("w8a16 - fp32", "off"), ("w4a16 - fp32", "off"), ("fp32", "2"),
                             ("w8a16 - fp32", "2"), ("w4a16 - fp32", "2")]
    assert list(t.loc[("fp32", "off")]) == ["1.000", "1.000", "1.000"]
    assert list(t.loc[("fp32", "2")]) == ["1.000", "0.000", "0.000"]
    zero, minus = "+0.000 (+0.000 to +0.000)", "-1.000 (-1.000 to -1.000)"
    assert list(t.loc[("w4a16 - fp32", "off")]) == [zero, zero, minus]
    assert list(t.loc[("w4a16 - fp32", "2")]) == [minus, zero, zero]
    assert list(t.loc[("w8a16 - fp32", "2")]) == [zero, zero, zero]
