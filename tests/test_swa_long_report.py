"""The drafter-window report (gpu_results.swa_long_tables / swa_long_summary) carries swa_long_context.py's numbers to
the right rows."""
import json

from qdflash.gpu_results import swa_long_summary, swa_long_tables


def _run(tmp_path):
    row = lambda tau, ms, tw: {"tau": tau, "tau_ci95": [tau - 0.1, tau + 0.1], "drafter_ms_per_step_median": ms,  # noqa: E731
                               "trained_window": tw, "per_position": [0.5]}
    r = {"window": 128, "prompts": 32, "new_tokens": 128, "prompt_tokens": {"min": 2048, "max": 8000, "median": 4096},
         "rows": {"full @ no window": row(2.5, 3.0, None), "full @ W=128": row(2.2, 2.0, None),
                  "swa128 @ no window": row(2.3, 3.1, 128), "swa128 @ W=128": row(2.6, 2.1, 128)},
         "paired": {"swa128 @ W=128 - full @ no window": {"diff": 0.1, "diff_ci95": [0.02, 0.18]}},
         # saved in an order neither by string nor as written: 4096 sorts before 512 as a string, W=128 before none
         "step_ms": {"4096": {"W=128": {"median_ms": 0.9, "q1_ms": 0.8, "q3_ms": 1.0},
                              "none": {"median_ms": 4.0, "q1_ms": 3.9, "q3_ms": 4.1}},
                     "512": {"W=128": {"median_ms": 0.8, "q1_ms": 0.7, "q3_ms": 0.9},
                             "none": {"median_ms": 1.0, "q1_ms": 0.9, "q3_ms": 1.1}}},
         "provenance": {"gpu": "NVIDIA H100 80GB HBM3", "git_sha": "abc123"}}
    p = tmp_path / "swa-long.json"
    p.write_text(json.dumps(r))
    return p


def test_rows_steps_and_pairs(tmp_path):
    p = _run(tmp_path)
    rows, steps = swa_long_tables(p)
    assert rows.loc[("swa128", "W=128"), "tau"] == 2.6 and rows.loc[("full", "W=128"), "walk: drafter ms/step"] == 2.0
    assert rows.loc[("swa128", "no window"), "trained window"] == 128
    assert list(steps.index) == [512, 4096]                         # by context length, numerically
    assert list(steps.columns) == ["no window ms", "W=128 ms"]      # no window first
    assert steps.loc[4096, "no window ms"] == "4.00 (3.90–4.10)" and steps.loc[4096, "W=128 ms"].startswith("0.90")
    s = swa_long_summary(p)
    assert "32 real multi-turn prompts of 2,048-8,000 tokens (median 4,096, 32 x W = 128)" in s
    assert "NVIDIA H100" in s and "`abc123`" in s
    assert "- swa128 @ W=128 minus full @ no window: +0.100 (+0.020 to +0.180)" in s
