"""The static-cache batched generator (stage 00's ``backend="fast"``, the magpie writer) against transformers'
``generate``, and the magpie source (issue 34)."""
import pytest
import torch

from qdflash.batch_generate import BatchGenerator
from qdflash.data import generate_batch
from qdflash.config import DataConfig, load_config


PROMPTS = ["hello there how are you", "a", "tell me about the sea and the sky please now", "one two", "x y z w v"]


def _hf_greedy(model, prompts, max_new, eos, pad):
    """transformers' generate on left-padded prompts, each row cut after its first EOS (the reference path)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, do_sample=False, max_new_tokens=max_new,
                             eos_token_id=eos, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
    rows = []
    for r in out[:, width:].tolist():
        rows.append(r[: r.index(eos) + 1] if eos in r else r)
    return rows


@pytest.fixture(scope="module")
def tiny():
    from qdflash.models import load_model, load_tokenizer
    tok = load_tokenizer("tiny")
    return load_model("tiny", "float64"), tok, [tok.encode(s) for s in PROMPTS]


@pytest.mark.parametrize("key_bucket", [4, 64])
def test_greedy_tokens_equal_transformers_generate(tiny, one_thread, key_bucket):
    model, tok, prompts = tiny
    cfg = load_config(DataConfig, "tiny")
    ref = generate_batch(model, tok, prompts, cfg, seed=0)
    # batch 2 < 5 prompts: several batches, a short last batch filled with copies, rows of different widths; keys
    # read in buckets of 4 slots (a step reads only the slots that can be valid) or 64 (all of them here)
    g = BatchGenerator(model, batch_size=2, max_len=80, key_bucket=key_bucket)
    out, st = g.generate(prompts, cfg.max_new_tokens, tok.eos_token_id, pad_token_id=tok.pad_token_id)
    assert out == ref
    assert st.batches == 3 and st.output_tokens == sum(map(len, ref))


def test_mid_batch_eos_cuts_that_row_only(tiny, one_thread):
    model, tok, prompts = tiny
    free, _ = BatchGenerator(model, batch_size=8, max_len=80).generate(prompts, 20, None, pad_token_id=0)
    # an EOS that row 0 emits at step 6 (and not before): row 0 stops there, the others go on as transformers does
    row = free[0]
    j = next(j for j in range(5, 15) if row[j] not in row[:j])
    eos = row[j]
    ref = _hf_greedy(model, prompts, 20, eos, pad=0)
    out, st = BatchGenerator(model, batch_size=8, max_len=80).generate(prompts, 20, eos, pad_token_id=0)
    assert out == ref
    assert out[0] == row[: j + 1] and out[0][-1] == eos
    assert any(len(r) == 20 for r in out)                   # some row ran to the cap: the batch did not stop early


def test_sampling_is_seeded_and_top_p_one_token_is_greedy(tiny, one_thread):
    model, tok, prompts = tiny
    g = BatchGenerator(model, batch_size=4, max_len=80)
    a, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=0.9, seed=3)
    b, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=0.9, seed=3)
    c, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=0.9, seed=4)
    assert a == b and a != c
    d, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=1.0, seed=3)    # the Gumbel-max path
    e, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=1.0, seed=3)
    assert d == e
    greedy, _ = g.generate(prompts, 12, None)
    tiny_p, _ = g.generate(prompts, 12, None, temperature=1.0, top_p=1e-6, seed=5)   # nucleus of one token
    assert tiny_p == greedy


def test_too_long_and_empty_prompts_are_refused(tiny):
    model, _, prompts = tiny
    g = BatchGenerator(model, batch_size=2, max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        g.generate(prompts, 12, None)
    with pytest.raises(ValueError, match="empty prompt"):
        g.generate([[]], 2, None)


def test_fast_backend_regenerates_like_hf_and_resumes(tmp_path, one_thread):
    from qdflash.data import regenerate_with, select_prompts, synthetic_prompts
    from qdflash.models import load_tokenizer
    cfg_hf = load_config(DataConfig, "tiny", dtype="float64")
    cfg_fast = load_config(DataConfig, "tiny", dtype="float64", backend="fast", batch_size=4)
    tok = load_tokenizer("tiny")
    items, _ = select_prompts(cfg_hf, tok, synthetic_prompts(10, 0)[0])
    ref, _ = regenerate_with("tiny", tok, items, cfg_hf, tmp_path / "hf.jsonl", progress=False)
    part = tmp_path / "fast.jsonl"
    got, info = regenerate_with("tiny", tok, items[:5], cfg_fast, part, progress=False)
    assert info["backend"] == "fast" and info["output_tokens"] > 0
    got, info = regenerate_with("tiny", tok, items, cfg_fast, part, progress=False)      # resumes the first five
    assert info["resumed"] == 5
    assert [r["gen_ids"] for r in got] == [r["gen_ids"] for r in ref]


# ----------------------------------------------------------------------------------------------- magpie
def test_pre_query_template_comes_from_the_chat_template():
    from qdflash.magpie import end_of_query_ids, pre_query_template
    from qdflash.models import load_tokenizer
    tok = load_tokenizer("smol")
    before, after = pre_query_template(tok)
    assert before.endswith("<|im_start|>user\n") and "system" in before      # SmolLM2's default system prompt
    assert after.startswith("<|im_end|>")
    assert end_of_query_ids(tok, after) == sorted({tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id})


def test_near_duplicates_are_removed_and_distinct_texts_kept():
    from qdflash.magpie import drop_near_duplicates
    base = ["Can you give me some tips for a new employee on how to manage their personal life efficiently?",
            "I am a new developer wanting to get better at using MongoDB. Can you guide me through its syntax?",
            "How do I build a small neural network in C# to predict house prices from location and age?"]
    planted = [base[0].replace("some tips", "a few tips"),                  # one word changed
               base[1] + " Thanks!",                                        # a word appended
               base[2].lower()]                                             # case only (exact match misses it)
    kept, dropped = drop_near_duplicates(base + planted + ["What is the capital of Peru and why is it there?"])
    assert kept == base + ["What is the capital of Peru and why is it there?"] and dropped == 3


def test_magpie_is_deterministic_for_a_seed_and_drops_unfinished(one_thread):
    from qdflash.magpie import magpie_prompts
    kw = dict(max_new_tokens=24, batch_size=16, max_rounds=2, progress=False, dtype="float64")
    a, ma = magpie_prompts("tiny", 6, seed=1, **kw)
    b, _ = magpie_prompts("tiny", 6, seed=1, **kw)
    c, _ = magpie_prompts("tiny", 6, seed=2, **kw)
    assert a == b and a != c
    assert ma["unfinished"] > 0                    # the random tiny model rarely closes its turn within 24 tokens


def test_magpie_in_a_mix_never_reaches_the_held_out_split(tmp_path, monkeypatch):
    import qdflash.magpie as mp
    from qdflash import data
    fake = [f"Self-written question number {i} about topic {i * 7}?" for i in range(200)]
    monkeypatch.setattr(mp, "magpie_prompts", lambda target, n, **kw: (fake[:n], {"generator": "magpie"}))
    cfg = load_config(DataConfig, "tiny", source="mix:reasoning=0.5,magpie=0.5", n_prompts=40, val_prompts=6)
    prompts, meta, names = data.mix_prompts(cfg)
    assert set(names) == {"reasoning", "magpie"} and 0.4 < names.count("magpie") / len(names) < 0.6
    examples = [{"id": f"{n}-{i}"} for i, n in enumerate(names[:40])]
    val = data.held_out_split(examples, cfg)
    assert len(val) == 6 and all(examples[i]["id"].startswith("reasoning-") for i in val)
    # the split is the first real prompts: the same with twice the data and another magpie share
    cfg2 = load_config(DataConfig, "tiny", source="mix:reasoning=0.3,magpie=0.7", n_prompts=80, val_prompts=6)
    p2, _, n2 = data.mix_prompts(cfg2)
    ex2 = [{"id": f"{n}-{i}"} for i, n in enumerate(n2[:80])]
    assert sorted(prompts[i] for i in val) == sorted(p2[i] for i in data.held_out_split(ex2, cfg2))


def test_nucleus_sampling_stays_in_the_nucleus_also_past_the_top_1024():
    """Rows whose top 1024 tokens hold less than top_p take the full sort; samples never leave the nucleus."""
    V = 3000
    flat = torch.zeros(V)                                  # uniform: the nucleus of 0.9 is 2700 tokens (full sort)
    peaked = torch.full((V,), -30.0)
    peaked[[5, 17, 2999]] = torch.tensor([3.0, 2.0, 0.0])  # nucleus of 0.9: tokens 5 and 17
    logits = torch.stack([flat, peaked] * 200)
    gen = torch.Generator().manual_seed(0)
    got = BatchGenerator._sample_host(logits, 1.0, 0.9, gen)
    assert set(got[1::2].tolist()) == {5, 17}
    assert len(set(got[0::2].tolist())) > 150                  # uniform draws from the flat row's wide nucleus


def test_step_profile_splits_a_decode_step_by_kind_of_kernel(one_thread):
    """``benchmarks/batch_generate_bench.py --profile-step`` (issue 34 item 2: where the generator's step goes): on
    the CPU with a matmul-heavy model the projections show as matmul, the kinds add up to the total, and the
    costliest op is a matrix multiply."""
    import importlib.util
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "batch_generate_bench.py"
    spec = importlib.util.spec_from_file_location("batch_generate_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=8192,
                                         tie_word_embeddings=True)).eval()
    r = mod.step_profile(model, batch=16, context=48, steps=6)
    assert (r["batch"], r["context"], r["steps"]) == (16, 48, 6) and r["unit"].startswith("CPU")
    assert sum(r["by_kind_ms"].values()) == pytest.approx(r["total_ms"], abs=0.01)
    assert r["by_kind_ms"]["matmul"] > 0 and r["top_kernels_ms"][0][0] in ("aten::mm", "aten::addmm", "aten::bmm")
