"""Stage 05's statistics without vLLM: acceptance intervals over prompts (from per-prompt counter deltas), not over
draft steps; latency percentiles only where the sample supports them; why a speculative greedy output differs."""
import pytest

from qdflash.decode_stats import mismatch_causes
from qdflash.serving import latency_summary, vllm_acceptance_ci


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


def test_percentiles_need_two_requests_above_them():
    lat = [float(i) for i in range(1, 20)]                 # 19 requests: p50 yes, p90 no
    s = latency_summary(lat)
    assert s["n"] == 19 and s["max_s"] == 19.0 and s["p50_s"] == 10.0 and "p90_s" not in s
    s = latency_summary(lat + [20.0])                      # 20: p90 by the inclusive method, 1 + 0.9 * 19
    assert s["p90_s"] == pytest.approx(18.1) and "p99_s" not in s and s["mean_s"] == pytest.approx(10.5)
    assert "p50_s" not in latency_summary([1.0, 2.0, 3.0])
    assert latency_summary([]) == {"n": 0, "mean_s": None, "max_s": None}


def test_mismatch_causes_point_at_the_first_differing_token(tiny_target):
    from qdflash.speculative import generate
    target, tok = tiny_target
    prompts = [tok.encode("the cat sat on"), tok.encode("a dog ran to")]
    plain = [generate(target, p, 12).tokens for p in prompts]
    spec = [list(plain[0]), list(plain[1])]
    spec[1][5] = (spec[1][5] + 1) % len(tok)                # one changed token, then the rest as plain
    out = mismatch_causes(target, prompts, plain, spec)
    assert len(out) == 1 and out[0]["prompt"] == 1 and out[0]["position"] == 5
    assert out[0]["plain_token"] == plain[1][5] and out[0]["spec_token"] == spec[1][5]
    # the reference (the same target, float64 here) recomputes plain greedy's choice there, positive top-2 margin
    assert out[0]["reference_agrees_with"] == "plain" and out[0]["margin"] > 0
    assert mismatch_causes(target, prompts, plain, plain) == []


@pytest.mark.parametrize("dies", ["returns", "RuntimeError", "TimeoutExpired"])
def test_jobs_in_one_process_reruns_alone_what_a_crashed_worker_left(tmp_path, monkeypatch, dies):
    """The shared worker wrote the first job's result and stopped (it returned, or job_in_subprocess raised because the worker
    exited or timed out): the finished result is kept, the rest run alone with the caller's environment (not the
    in-process switch) and say so; the shared worker's time limit grows with the number of jobs."""
    import json
    import subprocess

    from qdflash import vllm_jobs
    calls = []

    def fake_job(job, work, name, env=None, timeout=None, **kw):
        calls.append((name, dict(env or {}), timeout))
        if job.get("mode") == "jobs":
            (work / f"result-{name}.json").write_text(json.dumps({"a": {"tokens": [[1]], "engine": "in-process"}}))
            if dies == "RuntimeError":
                raise RuntimeError("vLLM job off exited -11")
            if dies == "TimeoutExpired":
                raise subprocess.TimeoutExpired("worker", timeout)
            return {}
        return {"tokens": [[job["x"]]]}

    monkeypatch.setattr(vllm_jobs, "job_in_subprocess", fake_job)
    got = vllm_jobs.jobs_in_one_process({"a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}}, tmp_path, "off", {"K": "v"},
                           timeout_per_job=10)
    assert got == {"a": {"tokens": [[1]], "engine": "in-process"}, "b": {"tokens": [[2]], "engine": "own process"},
                   "c": {"tokens": [[3]], "engine": "own process"}}
    assert calls == [("off", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "K": "v"}, 30), ("off-b", {"K": "v"}, 10),
                     ("off-c", {"K": "v"}, 10)]


def test_vllm_speedup_interval_is_paired_over_prompts():
    """Speculation 2x as fast on every prompt, prompts of very different lengths: the paired interval is tight
    around 2 (unpaired, the prompts' own spread would widen it); prompt counts that differ give no interval."""
    from qdflash.serving import vllm_speedup_ci
    plain = [{"s": 0.1 * n, "output_tokens": 10 * n} for n in (1, 7, 3, 12, 2, 9, 5, 4)]
    spec = [{"s": p["s"] / 2 * (1.02 if i % 2 else 0.98), "output_tokens": p["output_tokens"]}
            for i, p in enumerate(plain)]
    lo, hi = vllm_speedup_ci(plain, spec)
    assert 1.9 < lo <= 2.0 <= hi < 2.1
    assert vllm_speedup_ci(plain, spec[:-1]) is None


def test_timing_rounds_alternate_and_the_speedup_is_taken_within_each_round():
    """Rounds alternate plain-first and speculative-first; each round's speed-up is the ratio of its own two runs
    (a machine that slows down by half in round 1 leaves that round's ratio at 2), the median is over rounds, a
    failed run drops its round, and a side whose tokens change between rounds is flagged."""
    from qdflash.serving import interleaved_timing_jobs, timing_summary
    jobs = interleaved_timing_jobs({"drafter": None}, {"drafter": "d"}, 3)
    assert list(jobs) == ["timing0-plain", "timing0-spec", "timing1-spec", "timing1-plain", "timing2-plain",
                          "timing2-spec"]
    assert jobs["timing1-spec"] == {"drafter": "d"} and jobs["timing2-plain"] == {"drafter": None}
    res = {"timing0-plain": {"output_tokens_per_s": 10.0, "tokens": [[1]]},
           "timing0-spec": {"output_tokens_per_s": 20.0, "tokens": [[1]]},
           "timing1-spec": {"output_tokens_per_s": 10.0, "tokens": [[1]]},       # the machine at half speed
           "timing1-plain": {"output_tokens_per_s": 5.0, "tokens": [[1]]},
           "timing2-plain": {"output_tokens_per_s": 10.0, "tokens": [[1]]},
           "timing2-spec": {"output_tokens_per_s": 15.0, "tokens": [[1]]},
           "timing3-plain": {"error": "boom"}, "timing3-spec": {"output_tokens_per_s": 99.0, "tokens": [[1]]}}
    t = timing_summary(res)
    assert t["rounds"] == 3 and t["rounds_failed"] == 1
    assert t["speedup_per_round"] == [2.0, 2.0, 1.5]
    assert t["speedup"] == {"median": 2.0, "min": 1.5, "max": 2.0}
    assert t["plain_tokens_per_s"]["median"] == 10.0 and t["same_tokens"] == {"plain": True, "spec": True}
    res["timing2-spec"]["tokens"] = [[2]]
    assert timing_summary(res)["same_tokens"]["spec"] is False
    import pytest
    with pytest.raises(ValueError):
        interleaved_timing_jobs({}, {}, 0)
