"""vLLM acceptance intervals are taken over prompts (from per-prompt counter deltas), not over draft steps."""
from qdflash.serving import vllm_acceptance_ci


def test_vllm_tau_interval_is_over_prompts():
    # two prompts, 50 drafts each: tau 1.0 and 3.0. Resampling prompts gives pooled tau 1, 2 or 3 with
    # probabilities 1/4, 1/2, 1/4, so the 95% interval is exactly [1, 3]; resampling the 100 draft steps instead
    # would give a narrow interval around 2.
    pp = [{"drafts": 50, "accepted": 0, "accepted_per_pos": [0, 0]},
          {"drafts": 50, "accepted": 100, "accepted_per_pos": [50, 50]}]
    ci = vllm_acceptance_ci(pp)
    assert ci["tau_ci95"] == [1.0, 3.0]
    assert ci["per_position_ci95"] == [[0.0, 1.0], [0.0, 1.0]]
    # identical prompts: no spread at all
    same = vllm_acceptance_ci([{"drafts": 10, "accepted": 4, "accepted_per_pos": [3, 1]}] * 5)
    assert same["tau_ci95"] == [1.4, 1.4] and same["per_position_ci95"] == [[0.3, 0.3], [0.1, 0.1]]
    assert vllm_acceptance_ci([{"drafts": 0, "accepted": 0, "accepted_per_pos": []}]) == {}
