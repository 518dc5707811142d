"""The fast decoding path (issue 19) on the tiny target in fp32 on the CPU: token-identical to plain greedy decoding and
to the eager reference decoder with partial acceptances (same acceptance lengths, same drafter states step by step,
with and without the drafter's sliding window), rollback of the static target cache by position, and the clear
error for hybrid targets."""
import pytest
import torch

from qdflash.data import prompt_ids
from qdflash.drafter import new_drafter
from qdflash.fast_decode import FastDecoder, PositionedCache, PositionedLayer, check_plain_attention
from qdflash.speculative import generate
from test_speculative import _expected_lengths

pytestmark = pytest.mark.usefixtures("one_thread")
N = 30
PROMPTS = ("tell me about the moon", "write a song about cats and dogs")


@pytest.fixture(scope="module")
def tiny32():
    from qdflash.models import load_model, load_tokenizer
    return load_model("tiny", "float32", "cpu"), load_tokenizer("tiny")


class ScheduledOracleNorm(torch.nn.Module):
    """Stands in for a real drafter's final norm (both decoders end the drafter with ``drafter.norm(h)``). It records
    the drafter's pre-norm hidden states ``h`` of every call (the real layers over the real context K/V), and returns
    hidden states that make the target's lm_head propose the target's own greedy tokens for the first ``k`` draft
    positions and a wrong one after that (the negated target state: its argmin), ``k`` cycling through
    ``schedule``. Exactly ``k`` drafts are then accepted, so the block start advances by ``k + 1`` per step, which
    this module tracks itself; a decoder that emits anything else desynchronises it and fails the comparisons."""

    def __init__(self, states: torch.Tensor, prompt_len: int, block: int, schedule: list[int]):
        super().__init__()
        self.states, self.start, self.block, self.schedule = states, prompt_len, block, schedule
        self.seen: list[torch.Tensor] = []

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.seen.append(h.detach().clone())
        k = min(self.schedule[(len(self.seen) - 1) % len(self.schedule)], self.block - 1)
        last = self.states.shape[0] - 1
        rows = [self.states[min(self.start + j - 1, last)] * (1 if j <= k else -1) for j in range(1, self.block)]
        self.start += k + 1
        return torch.stack([h[0, 0]] + rows)[None]


def _fused_only(fd: FastDecoder) -> FastDecoder:
    """``fd`` with its unfused steps made to raise: a greedy decode that does not take the fused step fails."""
    def boom():
        raise AssertionError("an unfused step ran")
    fd._plain = fd._verify = boom
    fd._draft = boom if fd._draft is not None else None
    return fd


def _target_states(target, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Plain greedy continuation of ``prompt`` (n tokens) and the target's final hidden states over prompt + it."""
    plain = generate(target, prompt, n).tokens
    with torch.no_grad():
        states = target.model(torch.tensor([prompt + plain])).last_hidden_state[0]
    return plain, states


def test_shared_acceptance_rule():
    from qdflash.decode_steps import accept_drafts, emit_tokens
    assert accept_drafts([5, 1, 2, 3], [1, 2, 9, 7]) == (2, [1, 2, 9])      # 2 drafts, then the correction
    assert accept_drafts([5, 1, 2], [1, 2, 8]) == (2, [1, 2, 8])            # all drafts, then the bonus
    assert accept_drafts([5, 1, 2], [4, 2, 8]) == (0, [4])
    assert accept_drafts([5], [6]) == (0, [6])                              # plain decoding
    toks = [0]
    assert not emit_tokens(toks, [1, 2], None, 5) and toks == [0, 1, 2]
    assert emit_tokens(toks, [3, 9, 4], 9, 10) and toks == [0, 1, 2, 3, 9]  # EOS
    assert emit_tokens(toks, [7, 7], None, 6) and len(toks) == 6            # budget


@pytest.mark.parametrize("fused", [False, True])
def test_plain_fast_path_is_plain_greedy(tiny32, fused):
    target, tok = tiny32
    with FastDecoder(target, None, max_len=128, fused=fused) as fd:
        if fused:
            _fused_only(fd)
        for text in PROMPTS:
            p = prompt_ids(tok, text)
            ref = target.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False, eos_token_id=None,
                                  pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
            fast = fd.generate(p, N)                     # the decoder (and its static cache) reused across prompts
            assert fast.tokens == generate(target, p, N).tokens == ref
            assert fast.accept_lengths == [1] * (N - 1) and fast.block_size == 1
            # EOS and the token budget stop it as they stop the eager decoder
            eos = ref[5]
            stopped = fd.generate(p, N, eos_token_id=eos).tokens
            assert stopped == generate(target, p, N, eos_token_id=eos).tokens == ref[: ref.index(eos) + 1]
            assert fd.generate(p, 1).tokens == ref[:1]


@pytest.mark.parametrize("B,schedule,window,fused", [(4, [2], None, False), (5, [0, 3, 1, 4, 2], None, False),
                                                     (6, [5, 0, 0, 4], 7, False), (5, [0, 3, 1, 4, 2], None, True),
                                                     (6, [5, 0, 0, 4], 7, True)])
def test_partial_acceptance_fast_equals_eager_and_plain(tiny32, B, schedule, window, fused):
    """A real (random) DFlash drafter whose final norm is the scheduled oracle: right for k positions, then wrong.
    The fast path is token-identical to plain greedy and to the eager decoder, accepts exactly k drafts per step as
    the eager decoder does, and its static drafter context (append by position, trim by mask, window by index)
    gives the same drafter hidden states as the eager drafter's DraftCache at every step; the same with the draft,
    the verify and the target's argmax in one call (``fused``)."""
    target, tok = tiny32
    drafter = new_drafter(target, 1, B, [0, 3], tok.mask_token_id, seed=B)
    with FastDecoder(target, drafter, max_len=128, window=window, fused=fused) as fd:
        if fused:
            _fused_only(fd)
        for text in PROMPTS:
            p = prompt_ids(tok, text)
            plain, states = _target_states(target, p, N + B)
            runs = {}
            for name in ("eager", "fast"):
                drafter.norm = ScheduledOracleNorm(states, len(p), B, schedule)
                res = generate(target, p, N, drafter, window=window) if name == "eager" else fd.generate(p, N)
                runs[name] = (res, drafter.norm.seen)
            (eager, seen_e), (fast, seen_f) = runs["eager"], runs["fast"]
            assert fast.tokens == eager.tokens == plain[:N]
            assert fast.accept_lengths == eager.accept_lengths == _expected_lengths(schedule, B, N)
            assert len(seen_f) == len(seen_e) == len(eager.accept_lengths)
            for step, (hf, he) in enumerate(zip(seen_f, seen_e)):
                torch.testing.assert_close(hf, he, atol=2e-5, rtol=1e-4, msg=f"drafter states differ at step {step}")


def test_reduced_vocabulary_fused_equals_eager(tiny32):
    """A drafter with a reduced draft vocabulary (its draft indices mapped to token ids inside the step) decodes in the
    fused step as the eager decoder does (same tokens, same accept lengths)."""
    from qdflash.drafter import set_draft_vocab
    target, tok = tiny32
    p = prompt_ids(tok, PROMPTS[1])
    d = set_draft_vocab(new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=5), range(3, 380, 2))
    with FastDecoder(target, d, max_len=128, fused=True) as fd:
        fast = _fused_only(fd).generate(p, N)
    eager = generate(target, p, N, d)
    assert fast.tokens == eager.tokens == generate(target, p, N).tokens
    assert fast.accept_lengths == eager.accept_lengths


def test_window_changes_the_drafter_states(tiny32):
    """Power of the comparison above: the drafter's hidden states with a 7-token window differ from those without
    one once the context is longer than the window (so a window applied wrongly would be caught)."""
    target, tok = tiny32
    B = 4
    drafter = new_drafter(target, 1, B, [0, 3], tok.mask_token_id, seed=0)
    p = prompt_ids(tok, PROMPTS[0])
    _, states = _target_states(target, p, 8 + B)
    seen = []
    for window in (None, 7):
        with FastDecoder(target, drafter, max_len=64, window=window) as fd:
            drafter.norm = ScheduledOracleNorm(states, len(p), B, [1])
            fd.generate(p, 8)
            seen.append(drafter.norm.seen)
    assert all(not torch.allclose(a, b, atol=1e-3) for a, b in zip(*seen))


def test_random_drafter_fast_equals_eager(tiny32):
    """An untouched random drafter (its own argmax drafts, mostly rejected): same drafts, so same acceptance."""
    target, tok = tiny32
    drafter = new_drafter(target, 2, 4, [1, 2], tok.mask_token_id, seed=3)
    p = prompt_ids(tok, PROMPTS[1])
    with FastDecoder(target, drafter, max_len=128) as fd:
        fast = fd.generate(p, N)
    eager = generate(target, p, N, drafter)
    assert fast.tokens == eager.tokens == generate(target, p, N).tokens
    assert fast.accept_lengths == eager.accept_lengths


def test_sampling_fast_equals_eager_under_the_same_seed(tiny32):
    """Temperature 0.7: the fast path samples from the same logits with the same generator and acceptance rule, so
    under one seed it emits the eager decoder's tokens (plain and speculative; a fused decoder samples through its
    unfused steps)."""
    target, tok = tiny32
    drafter = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=2)
    p = prompt_ids(tok, PROMPTS[0])
    with FastDecoder(target, drafter, max_len=128) as fd, FastDecoder(target, None, max_len=128, fused=True) as fp:
        for seed in range(3):       # (fp: fused, which samples through the unfused steps)
            spec, ref = fd.generate(p, N, temperature=0.7, seed=seed), generate(target, p, N, drafter, 0.7, seed=seed)
            assert spec.tokens == ref.tokens and spec.accept_lengths == ref.accept_lengths
            assert fp.generate(p, N, temperature=0.7, seed=seed).tokens == generate(target, p, N, None, 0.7,
                                                                                    seed=seed).tokens
        assert fd.generate(p, N, temperature=0.7, seed=0).tokens != fd.generate(p, N, temperature=0.7, seed=1).tokens


def test_steps_are_whole_graphs_without_recompiles(tiny32):
    """What CUDA graphs need, checked on the CPU with dynamo's eager backend: the verify and draft steps each trace
    as one graph (fullgraph: no graph break), and neither recompiles across steps, positions or prompts."""
    import torch._dynamo
    target, tok = tiny32
    drafter = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=1)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True), \
            FastDecoder(target, drafter, max_len=128, compile=True, compile_backend="eager", fullgraph=True) as fd:
        for text in PROMPTS:
            p = prompt_ids(tok, text)
            assert fd.generate(p, 12).tokens == generate(target, p, 12, drafter).tokens
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_fused_steps_are_one_graph_each(tiny32):
    """``fused``: greedy speculative decoding traces one graph (draft, verify and the target's argmax), plain decoding
    one (forward and argmax), without graph breaks or recompiles, and both give the unfused decoder's tokens."""
    import torch._dynamo
    target, tok = tiny32
    drafter = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=1)
    for d in (drafter, None):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        with torch._dynamo.config.patch(error_on_recompile=True), FastDecoder(
                target, d, max_len=128, compile=True, compile_backend="eager", fullgraph=True, fused=True) as fd:
            _fused_only(fd)
            for text in PROMPTS:
                p = prompt_ids(tok, text)
                assert fd.generate(p, 12).tokens == generate(target, p, 12, d).tokens
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_rollback_by_position_hides_rejected_kv(tiny32, monkeypatch):
    """Write a rejected block into the static cache, seek back to its start and decode one token: the logits equal
    those of a cache that never saw the block, while the rejected K/V are still in the buffer (no crop, no copy).
    Negative control: if the mask's offset did not follow the seek (the stale entries visible), they differ."""
    target, tok = tiny32
    p = prompt_ids(tok, PROMPTS[0])
    P, dev, dt = len(p), torch.device("cpu"), torch.float32

    def run(rejected: list[int] | None) -> tuple[torch.Tensor, PositionedCache]:
        cache = PositionedCache(target.config, 64, dev, dt)
        with torch.no_grad():
            cache.seek(0)
            target(input_ids=torch.tensor([p]), past_key_values=cache, use_cache=True)
            if rejected:
                cache.seek(P)
                target(input_ids=torch.tensor([rejected]), position_ids=torch.arange(P, P + len(rejected))[None],
                       past_key_values=cache, use_cache=True)
            cache.seek(P)
            out = target(input_ids=torch.tensor([[7]]), position_ids=torch.tensor([[P]]), past_key_values=cache,
                         use_cache=True)
        return out.logits[0, -1], cache

    clean, _ = run(None)
    rolled, cache = run([11, 12, 13, 14])
    torch.testing.assert_close(rolled, clean, atol=1e-5, rtol=1e-5)
    k = cache.layers[0].keys
    assert k[0, :, P + 1: P + 4].abs().sum(-1).min() > 0 and not k[0, :, P + 4:].any()   # stale K/V still there

    monkeypatch.setattr(PositionedLayer, "get_seq_length", lambda self: self.position + 3)
    leaky, _ = run([11, 12, 13, 14])
    assert not torch.allclose(leaky[None], clean[None], atol=1e-3)


def test_hybrid_target_is_refused():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                            linear_num_value_heads=1, linear_key_head_dim=16, linear_value_head_dim=16,
                            full_attention_interval=4)
    with pytest.raises(ValueError, match=r"linear_attention.*qdflash\.speculative\.generate"):
        check_plain_attention(Qwen3_5ForCausalLM(cfg))


def test_stage_grids_decode_with_the_fast_path_and_fall_back_on_hybrids(tiny32, monkeypatch):
    """``compare_with_plain(decoder="fast")`` (what stages 03/04 call) runs every prompt through one FastDecoder per run
    and gives the eager grid's tokens and acceptance lengths; a hybrid target falls back to eager and says so; an
    unknown decoder is a one-line error."""
    from qdflash import fast_decode
    from qdflash.speculative import compare_with_plain, decode_prompts
    target, tok = tiny32
    drafter = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=2)
    prompts = [prompt_ids(tok, t) for t in PROMPTS]
    runs = {}
    for dec in ("eager", "fast"):
        runs[dec] = {}
        grid = compare_with_plain(target, prompts, 20, {"d": drafter}, results=runs[dec], decoder=dec)
        assert grid["plain"]["decoder"] == grid["d"]["decoder"] == dec and grid["d"]["mismatched_outputs"] == 0
    for name in ("plain", "d"):
        assert [r.tokens for r in runs["fast"][name]] == [r.tokens for r in runs["eager"][name]]
        assert [r.accept_lengths for r in runs["fast"][name]] == [r.accept_lengths for r in runs["eager"][name]]

    # drafters of one shape share one FastDecoder (its own copy, weights copied in per run): two drafters, plus
    # plain, build two decoders, and the second drafter still decodes as eager does with its own weights
    built, used = [], []
    real_init, real_generate = fast_decode.FastDecoder.__init__, fast_decode.FastDecoder.generate

    def counting_init(self, *a, **k):
        built.append(1)
        real_init(self, *a, **k)

    def recording_generate(self, *a, **k):         # the weights the decoder's drafter holds at each call
        if self.drafter is not None:
            used.append(torch.cat([t.flatten() for t in self.drafter.state_dict().values()]).clone())
        return real_generate(self, *a, **k)
    monkeypatch.setattr(fast_decode.FastDecoder, "__init__", counting_init)
    monkeypatch.setattr(fast_decode.FastDecoder, "generate", recording_generate)
    other = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=5)
    pooled, ref = {}, {}
    compare_with_plain(target, prompts, 20, {"d": drafter, "e": other}, results=pooled, decoder="fast")
    compare_with_plain(target, prompts, 20, {"e": other}, results=ref, decoder="eager")
    assert len(built) == 2
    flat = lambda d: torch.cat([t.flatten() for t in d.state_dict().values()])   # noqa: E731
    assert [torch.equal(w, flat(drafter)) for w in used] == [True] * len(prompts) + [False] * len(prompts)
    assert all(torch.equal(w, flat(other)) for w in used[len(prompts):])
    assert [r.accept_lengths for r in pooled["e"]] == [r.accept_lengths for r in ref["e"]]
    assert [r.accept_lengths for r in pooled["d"]] == [r.accept_lengths for r in runs["eager"]["d"]]
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(),
                                                 new_drafter(target, 1, 4, [0, 3], tok.mask_token_id,
                                                             seed=2).state_dict().values()))   # caller's untouched
    monkeypatch.setattr(fast_decode.FastDecoder, "__init__", real_init)
    monkeypatch.setattr(fast_decode.FastDecoder, "generate", real_generate)

    def refuse(_):
        raise ValueError("hybrid")
    monkeypatch.setattr(fast_decode, "check_plain_attention", refuse)
    _, st = decode_prompts(target, prompts[:1], 8, drafter, decoder="fast")
    assert st["decoder"] == "eager (recurrent target)"
    with pytest.raises(ValueError, match="decoder must be one of"):
        decode_prompts(target, prompts[:1], 8, drafter, decoder="cuda-graphs")


def test_reduced_draft_vocabulary_fast_equals_eager(tiny32):
    """The static-buffer drafter step with a draft vocabulary (drafter.set_draft_vocab) drafts what the eager
    decoder drafts: the same tokens and acceptance, and the plain target's output."""
    from qdflash.drafter import set_draft_vocab
    target, tok = tiny32
    p = prompt_ids(tok, PROMPTS[1])
    plain = generate(target, p, N)
    drafter = set_draft_vocab(new_drafter(target, 2, 4, [1, 2], tok.mask_token_id, seed=3), sorted(set(plain.tokens)))
    with FastDecoder(target, drafter, max_len=128) as fd:
        fast = fd.generate(p, N)
    eager = generate(target, p, N, drafter)
    assert fast.tokens == eager.tokens == plain.tokens
    assert fast.accept_lengths == eager.accept_lengths


def test_gpu_fast_decode_times_plain_against_the_drafter_in_alternating_rounds(tmp_path, monkeypatch):
    """``benchmarks/gpu_fast_decode.py --rounds`` (the H200 speed-up on the QAD target, issue 35 item 9), on the CPU
    with the tiny target: every round is kept, the median is that of the rounds' speed-ups (each the ratio of its
    round's two runs: ``serving.timing_summary``, tested in test_serving_metrics) and greedy tokens repeat."""
    import importlib.util
    import json
    import statistics
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_fast_decode.py"
    spec = importlib.util.spec_from_file_location("gpu_fast_decode", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr("sys.argv", ["gpu_fast_decode.py"])
    # the rounds' plain decoder runs on a target that carries none of the drafter decoder's capture hooks (a compiled
    # plain step that saw them recompiled with them: run-1207d-h100's rounds)
    seen, rounds = [], mod.timing_rounds

    def checked(plain_fd, spec_fd, *args):
        plain_hooks = {id(m._forward_hooks) for m in plain_fd.target.modules()}
        seen.append(bool(spec_fd._hooks) and all(id(h.hooks_dict_ref()) not in plain_hooks for h in spec_fd._hooks))
        return rounds(plain_fd, spec_fd, *args)
    monkeypatch.setattr(mod, "timing_rounds", checked)
    out = tmp_path / "fd.json"
    mod.main(["--device", "cpu", "--target", "tiny", "--dtype", "float32", "--drafter", "random", "--prompts", "2",
              "--eager-prompts", "1", "--new-tokens", "12", "--modes", "fast", "--rounds", "3", "--out", str(out)])
    assert seen == [True]
    t = json.loads(out.read_text())["timing"]["random"]
    assert t["plain_target"] == "own copy"
    assert t["plain_first_pass_tokens_per_s"] == json.loads(out.read_text())["plain"]["fast"]["tokens_per_s"]
    assert t["plain_rounds_over_first_pass"] == pytest.approx(
        t["plain_tokens_per_s"]["median"] / t["plain_first_pass_tokens_per_s"])
    assert t["graphs_compiled_during_rounds"] == 0           # nothing compiles on the CPU's fast path
    assert t["rounds"] == 3 and t["prompts"] == 2 and t["same_tokens"] == {"plain": True, "spec": True}
    assert t["speedup"]["median"] == pytest.approx(statistics.median(t["speedup_per_round"]))
    assert t["speedup"]["min"] <= t["speedup"]["median"] <= t["speedup"]["max"]
    # the fused decoders (one call a step) beside the unfused ones, no eager rows, rounds on the fused pair
    mod.main(["--device", "cpu", "--target", "tiny", "--dtype", "float32", "--drafter", "random", "--prompts", "2",
              "--eager-prompts", "0", "--new-tokens", "12", "--modes", "fast,fused", "--rounds", "2", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["headline"]["reference_mode"] == "fused" and r["timing"]["random"]["rounds"] == 2
    assert seen == [True, True]                              # the fused rounds' plain decoder has its own target too
    assert "eager" not in r["plain"] and set(r["speculative"]["random"]) >= {"fast", "fused"}
    fused, fast = r["speculative"]["random"]["fused"], r["speculative"]["random"]["fast"]
    assert fused["vs_plain"]["mismatched_outputs"] == 0 and fused["tau"] == fast["tau"]
    assert fused["draft_ms"] is None and fast["draft_ms"] > 0      # a fused step cannot be split
    lo, hi = fused["speedup_ci95"]
    assert lo <= fused["speedup"] <= hi
    # the report tables read a fused headline (no split times, no prediction) and list the fused plain path
    from qdflash.gpu_results import plain_decode_table, spec_decode_table
    assert list(plain_decode_table(out).index) == ["fast", "fused"]
    row = spec_decode_table(out).loc["random"]
    assert row["predicted"] in (None, "") and row["speedup"] == pytest.approx(fused["speedup"], abs=1e-3)
