"""Comparisons over training seeds (issue 35 item 1): the two-level bootstrap over seeds and items, and the summary of
``benchmarks/gpu_seeds.sh``'s outputs (numpy only, seconds)."""
import json

import numpy as np
import pytest

from qdflash.decode_stats import GenResult, results_to_json, seeds_and_items_bootstrap


def test_the_interval_widens_with_the_spread_between_seeds_and_not_without_it():
    rng = np.random.default_rng(1)
    den = rng.integers(10, 30, size=(3, 40)).astype(float)
    same = seeds_and_items_bootstrap(den * 2.0, den, den * 1.5, den)
    assert same["estimate"] == pytest.approx(0.5) and same["ci95"] == pytest.approx([0.5, 0.5])
    num = den * 2.0
    num[1] *= 1.2                                   # seed 1's A is 20% better on every item
    r = seeds_and_items_bootstrap(num, den, den * 1.5, den)
    assert r["per_seed"] == pytest.approx([0.5, 0.9, 0.5]) and r["estimate"] == pytest.approx(1.9 / 3)
    assert r["ci95"][0] == pytest.approx(0.5) and r["ci95"][1] == pytest.approx(0.9)       # all-0 to all-1 resamples
    assert r["ci95_items_only"] == pytest.approx([1.9 / 3] * 2)     # no item noise here: only the seeds spread it
    assert seeds_and_items_bootstrap(den * 2, den, den, den, ratio=True)["estimate"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        seeds_and_items_bootstrap(den, den, den[:, :5], den[:, :5])


def test_seeds_summary_reads_every_seed_of_both_comparisons(tmp_path):
    from qdflash.gpu_results import seeds_summary
    conv = [10, 20, 30]
    for s, (qad, gptq) in enumerate([([1, 2, 3], [2, 4, 6]), ([1, 1, 1], [2, 4, 6])]):
        (tmp_path / f"metrics-q{s}-01_qad.json").write_text(json.dumps(
            {"per_conversation": {"tokens": conv, "kl_sum": {"qad": qad, "gptq": gptq, "rtn": gptq}}}))
    (tmp_path / "metrics-q2-01_qad.json").write_text(json.dumps({"qad_vs_gptq_kl": {}}))   # an older run: skipped
    res = lambda lens: results_to_json([GenResult(tokens=[1], accept_lengths=a, block_size=8) for a in lens])  # noqa: E731
    for s, extra in enumerate((0, 1)):
        (tmp_path / f"s{s}-03_drafter_finetune-decode-qad.json").write_text(json.dumps({"results": {
            "two_stage": res([[3 + extra, 3], [2, 2]]), "direct": res([[2, 2], [1, 1]])}}))
    out = seeds_summary(tmp_path)
    q = out["qad_vs_gptq_kl_ratio"]
    assert q["seed_ids"] == [0, 1] and q["per_seed"] == pytest.approx([0.5, 0.25]) and q["estimate"] == 0.375
    t = out["two_stage_minus_direct_tau"]
    assert t["per_seed"] == pytest.approx([1.0, 1.25]) and t["items"] == 2 and t["statistic"] == "difference"
    assert "two_stage_minus_pretrain_tau" not in out          # no seed decoded its pretrain drafter here


def test_the_drafter_table_per_seed_and_pooled(tmp_path):
    """Every seed's taus and paired differences, from its own files, and the pooled row from seeds_summary."""
    from qdflash.gpu_results import seeds_drafter_table, seeds_summary
    res = lambda lens: results_to_json([GenResult(tokens=[1], accept_lengths=a, block_size=8) for a in lens])  # noqa: E731
    for s, extra in enumerate((0, 2)):
        (tmp_path / f"s{s}-03_drafter_finetune-decode-qad.json").write_text(json.dumps({"results": {
            "two_stage": res([[3 + extra, 3], [2, 2]]), "direct": res([[2, 2], [1, 1]]),
            "pretrain": res([[1, 1], [1, 1]])}}))
        (tmp_path / f"metrics-s{s}-02_drafter_pretrain.json").write_text(json.dumps(
            {"train": {"steps": 100 + s, "final_loss": 3.0}}))
        (tmp_path / f"metrics-s{s}-03_drafter_finetune.json").write_text(json.dumps(
            {"train": {"direct": {"steps": 120}, "two_stage": {"steps": 20}}}))
    out = seeds_summary(tmp_path)
    assert out["two_stage_minus_pretrain_tau"]["per_seed"] == pytest.approx([1.5, 2.0])
    t = seeds_drafter_table(tmp_path, out)
    assert list(t.index) == ["0", "1", "mean of 2"]
    assert t.loc["1", "tau two-stage"].startswith("3.000 ") and t.loc["1", "tau direct"].startswith("1.500 ")
    assert t.loc["1", "two-stage - direct"].startswith("+1.500 ") and t.loc["1", "pretrain steps"] == 101
    assert t.loc["mean of 2", "two-stage - direct"].startswith("+1.250 (")
    assert t.loc["mean of 2", "two-stage - pretrain"].startswith("+1.750 (")
    assert t.loc["1", "tau pretrain"].startswith("1.000 ")


def test_the_committed_seeds_run_is_what_the_readme_and_its_table_show():
    """The README's QAD/GPTQ row over seeds and docs' per-seed table come from the saved gpu_seeds.sh run."""
    from pathlib import Path

    from qdflash.gpu_results import seeds_summary, seeds_table
    repo = Path(__file__).resolve().parents[1]
    run = repo / "benchmarks" / "gpu-seeds" / "run-1206e-h100"
    s = seeds_summary(run)["qad_vs_gptq_kl_ratio"]
    per_file = [json.loads((run / f"metrics-q{k}-01_qad.json").read_text())["qad_vs_gptq_kl"]["ratio"] for k in (0, 1, 2)]
    assert s["seeds"] == 3 and s["per_seed"] == pytest.approx(per_file, rel=1e-9)     # pooled KL sums = stage 01's ratio
    assert s["ci95"][0] < s["estimate"] < s["ci95"][1]
    t = seeds_table(run)
    assert list(t.index) == ["0", "1", "2", "mean of 3"] and t.loc["mean of 3", "QAD / GPTQ"] == f"{s['estimate']:.3f} (mean)"
    lo, hi = s["ci95"]
    assert f"| {s['estimate']:.3f} | {lo:.3f}–{hi:.3f} (3 seeds, then {s['items']} conversations) |" in \
        (repo / "README.md").read_text()
