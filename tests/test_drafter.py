import json
from pathlib import Path
import torch
import pytest

from qdflash.data import prompt_ids
from qdflash.drafter import load_drafter, new_drafter, save_drafter
from qdflash.drafter_train import block_mask, make_batch, sample_anchors
from qdflash.config import DrafterConfig, load_config
from qdflash.decode_stats import acceptance_stats
from qdflash.speculative import generate

PROMPTS = ["tell me about the moon", "why is the sky blue", "write a song about cats and dogs", "hello"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(tok):
    return [prompt_ids(tok, p) for p in PROMPTS]


@pytest.mark.parametrize("block,seed", [(2, 0), (4, 1), (6, 2)])
def test_greedy_speculative_equals_greedy_target(tiny_target, block, seed):
    target, tok = tiny_target
    d = new_drafter(target, 1, block, [0, 3], tok.mask_token_id, seed=seed).to(torch.float64).eval()
    ps = _prompts(tok)
    plain = [generate(target, p, 40, None, eos_token_id=tok.eos_token_id).tokens for p in ps]
    spec = [generate(target, p, 40, d, eos_token_id=tok.eos_token_id).tokens for p in ps]
    assert spec == plain
    # and against transformers' own greedy generate
    ids = torch.tensor([ps[0]])
    ref = target.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)[0, len(ps[0]):].tolist()
    assert spec[0] == ref


class CopyDrafter(torch.nn.Module):
    """Test double with the drafter interface whose drafts are the target's own greedy continuation."""

    def __init__(self, target, prompt, block, mask_id):
        super().__init__()
        self.t, self.hist, self.block_size, self.mask_token_id = target, list(prompt), block, mask_id
        self.target_layer_ids, self.prev = [0], None

    def forward(self, noise, ctx, q_pos, ctx_pos, cache=None, window=None):
        emb = self.t.get_input_embeddings().weight
        x = int((emb - noise[0, 0]).abs().sum(-1).argmin())
        if self.prev is not None:
            self.hist += self.prev[: ctx.shape[1]]
        seq = self.hist + [x]
        hs = []
        for _ in range(self.block_size - 1):
            h = self.t.model(torch.tensor([seq])).last_hidden_state[:, -1]
            hs.append(h)
            seq.append(int(self.t.lm_head(h)[0].argmax()))
        self.prev = seq[len(self.hist):]
        return torch.stack([hs[0]] + hs, 1)


def test_copy_drafter_reaches_tau_B(tiny_target):
    target, tok = tiny_target
    for B in (3, 5):
        res = []
        for p in _prompts(tok)[:2]:
            d = CopyDrafter(target, p, B, tok.mask_token_id)
            res.append(generate(target, p, 30, d, eos_token_id=None))
        st = acceptance_stats(res)
        full = [a for r in res for a in r.accept_lengths[:-1]]      # the last step may be cut by max tokens
        assert all(a == B for a in full) and st["tau"] > B - 1


@torch.no_grad()
@pytest.mark.parametrize("window", [None, 6])
def test_training_forward_equals_cached_inference_forward(tiny_target, window):
    """All blocks at once under the training block mask (make_batch) give exactly what the decoder's cached forward
    gives at the same anchors, with the context fed incrementally into one DraftCache as decoding does; with a
    window, the training mask (``train_window``) is the decoders' window (block position k: last W-1-k tokens)."""
    from qdflash.drafter import DraftCache, target_features
    target, tok = tiny_target
    B = 4
    d = new_drafter(target, 2, B, [0, 3], tok.mask_token_id, seed=5).to(torch.float64).eval()
    p = _prompts(tok)[2]
    ids = p + generate(target, p, 24, None).tokens
    row = {"input_ids": ids, "loss_mask": [0] * len(p) + [1] * (len(ids) - len(p))}
    feats = target_features(target(torch.tensor([ids]), output_hidden_states=True).hidden_states, [0, 3])[0]
    cfg = load_config(DrafterConfig, "tiny", num_anchors=4, block_size=B, max_len=len(ids), train_window=window)
    b = make_batch([row], [feats], [0], cfg, tok.mask_token_id, torch.Generator().manual_seed(0), 2.0)
    emb = target.get_input_embeddings()
    ctx = b["ctx"].to(torch.float64)
    train = d(emb(b["noise_ids"]), ctx, b["q_pos"], b["ctx_pos"], attn_mask=b["mask"])
    anchors = b["q_pos"][0, ::B].tolist()
    assert len(set(anchors)) == 4 and anchors == sorted(anchors)
    cache, seen = DraftCache(), 0
    for n, a in enumerate(anchors):
        block = emb(torch.tensor([[ids[a]] + [tok.mask_token_id] * (B - 1)]))
        h = d(block, ctx[:, seen:a], torch.arange(a, a + B)[None], torch.arange(seen, a)[None], cache, window=window)
        seen = a
        assert len(cache) == (a if window is None else min(a, window - 1))   # a window keeps the last W-1
        ref = train[:, n * B:(n + 1) * B]
        assert torch.allclose(h, ref, rtol=0, atol=1e-12), (n, float((h - ref).abs().max()))
    # and the mask matters: without it every block would see the whole context and the other blocks
    free = d(emb(b["noise_ids"]), ctx, b["q_pos"], b["ctx_pos"])
    assert not torch.allclose(free, train, atol=1e-6)
    if window:      # and the window matters: the windowless training mask gives other states
        nowin = make_batch([row], [feats], [0], load_config(DrafterConfig, "tiny", num_anchors=4, block_size=B,
                                                            max_len=len(ids)),
                           tok.mask_token_id, torch.Generator().manual_seed(0), 2.0)
        assert not torch.allclose(d(emb(b["noise_ids"]), ctx, b["q_pos"], b["ctx_pos"], attn_mask=nowin["mask"]),
                                  train, atol=1e-6)


def test_sampled_speculative_decoding_is_seeded(tiny_target):
    target, tok = tiny_target
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id).to(torch.float64).eval()
    p = _prompts(tok)[0]
    a = generate(target, p, 20, d, temperature=0.8, seed=5).tokens
    b = generate(target, p, 20, d, temperature=0.8, seed=5).tokens
    c = generate(target, p, 20, d, temperature=0.8, seed=6).tokens
    greedy = generate(target, p, 20, d).tokens
    assert len(a) == 20 and a == b                  # same seed, same tokens (eos_token_id=None: never cut short)
    assert a != c and a != greedy                   # the seed and the temperature are actually used


def test_training_mask_obeys_strict_anchor_rule():
    anchors = torch.tensor([[3, 7]])
    m = block_mask(anchors, torch.tensor([10]), 10, 4)[0, 0]       # [8, 10 + 8]
    for n, a in enumerate([3, 7]):
        for q in range(n * 4, n * 4 + 4):
            ctx_seen = m[q, :10].nonzero().flatten().tolist()
            assert ctx_seen == list(range(a))                        # strictly before the anchor
            blk_seen = (m[q, 10:].nonzero().flatten()).tolist()
            assert blk_seen == list(range(n * 4, n * 4 + 4))         # its own block, bidirectionally


def test_batch_labels_are_same_position_and_weights_decay():
    cfg = load_config(DrafterConfig, "tiny", num_anchors=3, block_size=4, gamma=2.0)
    ids = list(range(100, 120))
    rows = [{"input_ids": ids, "loss_mask": [0] * 8 + [1] * 12}]
    feats = [torch.zeros(20, 6)]
    b = make_batch(rows, feats, [0], cfg, mask_id=5, gen=torch.Generator().manual_seed(0), gamma=2.0)
    anchors = b["q_pos"][0, ::4]
    assert all(8 <= int(a) <= 18 for a in anchors)
    for n, a in enumerate(anchors.tolist()):
        assert b["noise_ids"][0, n * 4] == ids[a] and (b["noise_ids"][0, n * 4 + 1: n * 4 + 4] == 5).all()
        for k in range(4):
            if a + k < 20:
                assert b["labels"][0, n * 4 + k] == ids[a + k]
        w = b["weights"][0, n * 4: n * 4 + 4]
        assert w[0] == 0 and (w[1] == 1 or a + 1 >= 20)
        if a + 2 < 20:
            assert torch.isclose(w[2], torch.exp(torch.tensor(-0.5)))
    assert sample_anchors([0, 0, 1, 1, 1, 0], 10, torch.Generator()) == [2, 3]


def test_swa_window_larger_than_context_changes_nothing(tiny_target):
    target, tok = tiny_target
    d = new_drafter(target, 2, 4, [0, 3], tok.mask_token_id, seed=4).to(torch.float64).eval()
    p = _prompts(tok)[2]
    a = generate(target, p, 30, d, eos_token_id=tok.eos_token_id)
    b = generate(target, p, 30, d, eos_token_id=tok.eos_token_id, window=10_000)
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths


@torch.no_grad()
def test_window_boundary_is_vllms_per_query_rule(tiny_target):
    """vLLM's rule: block position k sees the last W-1-k context tokens. With 20 context tokens and B=4, W=24 is
    the smallest window that changes nothing; at W=23 only the last position (k=3, now 19 tokens) changes, which a
    one-layer drafter shows position by position (an off-by-one or a per-block window would move other rows)."""
    from qdflash.drafter import DraftCache
    target, tok = tiny_target
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=4).to(torch.float64).eval()
    emb = target.get_input_embeddings()
    ctx = torch.randn(1, 20, 2 * target.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    noise = emb(torch.tensor([[5] + [tok.mask_token_id] * 3]))
    q, c = torch.arange(20, 24)[None], torch.arange(20)[None]
    full = d(noise, ctx, q, c, DraftCache())
    assert torch.allclose(full, d(noise, ctx, q, c, DraftCache(), window=24), rtol=0, atol=1e-12)
    w23 = d(noise, ctx, q, c, DraftCache(), window=23)
    same = [torch.allclose(full[0, k], w23[0, k], rtol=0, atol=1e-12) for k in range(4)]
    assert same == [True, True, True, False]
    w21 = d(noise, ctx, q, c, DraftCache(), window=21)         # k=1 sees 19, k=2 18, k=3 17; k=0 still all 20
    assert [torch.allclose(full[0, k], w21[0, k], rtol=0, atol=1e-12) for k in range(4)] == [True, False, False, False]
    with pytest.raises(ValueError, match="shorter than the block"):
        d(noise, ctx, q, c, DraftCache(), window=3)


@torch.no_grad()
def test_a_windowed_cache_keeps_the_last_w_minus_1_positions_and_changes_no_output(tiny_target):
    """Decoding steps with a window W: the drafter cache holds only the last W - 1 context positions (flat memory and
    work as the context grows) and every step's output equals the cacheless forward over the whole context."""
    from qdflash.drafter import DraftCache
    target, tok = tiny_target
    d = new_drafter(target, 2, 4, [0, 3], tok.mask_token_id, seed=4).to(torch.float64).eval()
    emb, W = target.get_input_embeddings(), 9
    g = torch.Generator().manual_seed(0)
    full = torch.randn(1, 40, 2 * target.config.hidden_size, dtype=torch.float64, generator=g)
    cache, n = DraftCache(), 20
    new = full[:, :n]
    for step in range(6):
        noise = emb(torch.tensor([[5 + step] + [tok.mask_token_id] * 3]))
        q = torch.arange(n, n + 4)[None]
        h = d(noise, new, q, torch.arange(n - new.shape[1], n)[None], cache, window=W)
        ref = d(noise, full[:, :n], q, torch.arange(n)[None], None, window=W)
        assert torch.allclose(h, ref, rtol=0, atol=1e-10), step
        assert len(cache) == W - 1
        new, n = full[:, n: n + 2 + step % 2], n + 2 + step % 2


def test_training_window_mask_is_the_decode_window():
    """block_mask(window=W) restricted to one block is drafter.window_mask over that anchor's context."""
    from qdflash.drafter import window_mask
    W, B, S = 6, 4, 16
    anchors = torch.tensor([[3, 9, 14]])
    m = block_mask(anchors, torch.tensor([S]), S, B, W)[0, 0]
    for n, a in enumerate(anchors[0].tolist()):
        rows = m[n * B:(n + 1) * B]
        ref = window_mask(a, B, W)                                   # keys [context 0..a-1 | block]
        assert torch.equal(rows[:, :a], ref[:, :a]) and not rows[:, a:S].any()
        assert torch.equal(rows[:, S + n * B:S + (n + 1) * B], ref[:, a:])
    assert m[4, :9].nonzero().flatten().tolist() == [4, 5, 6, 7, 8]   # anchor 9, k=0: the last W-1 = 5 tokens
    assert m[7, :9].nonzero().flatten().tolist() == [7, 8]            # k=3: the last W-1-3 = 2


def test_drafter_checkpoint_roundtrip_and_vllm_config(tmp_path, tiny_target):
    import json
    target, tok = tiny_target
    d = new_drafter(target, 2, 4, [0, 3], tok.mask_token_id, seed=1).eval()
    p = save_drafter(d, tmp_path / "drafter-L2-b4")
    cfg = json.loads((p / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4 and cfg["dflash_config"] == {"mask_token_id": tok.mask_token_id,
                                                               "target_layer_ids": [0, 3]}
    from safetensors import safe_open
    keys = set(safe_open(str(p / "model.safetensors"), "pt").keys())
    assert "fc.weight" in keys and "hidden_norm.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "model.")) for k in keys)
    r = load_drafter(p)
    for (k, v), (k2, v2) in zip(d.state_dict().items(), r.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    with pytest.raises(ValueError, match="out of range"):
        new_drafter(target, 1, 4, [0, 99], tok.mask_token_id)
    with pytest.raises(FileNotFoundError):
        load_drafter(tmp_path / "nope")


def test_init_from_target_copies_matching_tensors(tiny_target):
    from qdflash.drafter import init_from_target
    tiny_target, _ = tiny_target
    d = new_drafter(tiny_target, 1, 4, [0, 1], 3, init="target_layers")
    src = tiny_target.model
    assert torch.equal(d.norm.weight, src.norm.weight)
    last = src.layers[-1]
    assert torch.equal(d.layers[0].self_attn.q_proj.weight, last.self_attn.q_proj.weight)
    assert torch.equal(d.layers[0].mlp.down_proj.weight, last.mlp.down_proj.weight)
    r = new_drafter(tiny_target, 1, 4, [0, 1], 3, init="random")
    assert not torch.equal(r.layers[0].self_attn.q_proj.weight, last.self_attn.q_proj.weight)
    with pytest.raises(ValueError, match="unknown drafter init"):
        init_from_target(r, tiny_target, "bogus")


@torch.no_grad()
def test_batched_features_equal_unbatched(tiny_target):
    from qdflash.drafter_train import precompute_features
    tiny_target, _ = tiny_target
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(1, 200, (int(n),), generator=g).tolist()} for n in (5, 31, 17, 40, 9)]
    one = precompute_features(tiny_target, rows, [0, 1], 32, bs=1)
    many = precompute_features(tiny_target, rows, [0, 1], 32, bs=4)
    for a, b in zip(one, many):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-4)


def test_warm_start_copies_the_norm_scale_not_the_parameter():
    """Qwen3.5's final norm is zero-centred (scale = 1 + weight, weights start at 0); the drafter's is standard. A raw
    copy would give the drafter a zero norm; the tiny Qwen3 target's norm is standard and copies as is."""
    import torch

    from qdflash.drafter import new_drafter
    from qdflash.models import load_model
    for spec, layers, shift in (("qwen35-mini", (1, 3), 1.0), ("tiny", (0, 2), 0.0)):
        tgt = load_model(spec, "float32")
        with torch.no_grad():
            tgt.model.norm.weight.uniform_(-0.2, 0.2)
        d = new_drafter(tgt, 1, 4, layers, 0, init="target_layers")
        torch.testing.assert_close(d.norm.weight, tgt.model.norm.weight + shift, rtol=0, atol=1e-5)
        src = tgt.model.layers[-1].post_attention_layernorm
        off = 1.0 if type(src).__name__.startswith("Qwen3_5") else 0.0
        torch.testing.assert_close(d.layers[0].post_attention_layernorm.weight, src.weight + off, rtol=0, atol=1e-5)


def test_explicit_no_window_overrides_the_checkpoints_window(tiny_target, monkeypatch):
    """Stage 04's "no window" rows pass window=0: for a drafter whose checkpoint says use_swa, every decoder path must
    then run without a window (None means "the checkpoint's"), and decoders of the two settings must not be shared."""
    from qdflash import speculative
    from qdflash.drafter import resolve_window
    target, tok = tiny_target
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=4, sliding_window=5).to(torch.float64).eval()
    assert resolve_window(d, None) == 5 and resolve_window(d, 0) is None
    p = _prompts(tok)[2]
    seen = []
    monkeypatch.setattr(speculative, "generate", lambda *a: seen.append(resolve_window(a[3], a[6])))
    for w in (0, None):
        gen, _, close = speculative.decoder_for(target, [p], 8, d, w, "eager")
        gen(p, 8, 0.0, None, 0)
        close()
    assert seen == [None, 5]
    pool = {}
    fds = [speculative.decoder_for(target, [p], 8, d, w, "fast", pool)[0].__self__ for w in (0, None)]
    assert fds[0].window is None and fds[1].window == 5 and fds[0] is not fds[1]
    speculative.close_pool(pool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_linear_ce_equals_autograd_ce(dtype):
    """losses.linear_cross_entropy (gradient made in the forward, chunk by chunk) against autograd through
    F.linear + .float() + F.cross_entropy: the same loss, hit count and input gradient; the weight gets none."""
    import torch.nn.functional as F

    from qdflash.losses import linear_cross_entropy
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g)
    W = torch.randn(50, 16, generator=g)
    y = torch.randint(0, 50, (37,), generator=g)
    y[:5] = (h[:5].to(dtype) @ W.to(dtype).t()).float().argmax(-1)     # some hits
    w = torch.rand(37, generator=g)
    ha = h.clone().requires_grad_(True)
    logits = (ha.to(dtype) @ W.to(dtype).t()).float()
    ref = (F.cross_entropy(logits, y, reduction="none") * w).sum() / 3.0
    ref.backward()
    hb = h.clone().requires_grad_(True)
    Wb = W.clone().requires_grad_(True)
    s, hits = linear_cross_entropy(hb, Wb, y, w, chunk=8, dtype=dtype)
    (s / 3.0).backward()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(s / 3.0, ref.detach(), **tol)
    assert int(hits) == int((logits.argmax(-1) == y).sum()) >= 5
    if dtype == torch.bfloat16:     # one bf16 rounding of the logit gradient, before vs after the 1/3 scale
        tol = dict(rtol=2e-2, atol=2e-2 * float(ha.grad.abs().max()))
    torch.testing.assert_close(hb.grad, ha.grad, **tol)
    assert Wb.grad is None
    with pytest.raises(ValueError):
        linear_cross_entropy(h, W, y, w, chunk=0)


def test_drafter_loss_chunked_equals_one_piece_and_the_masked_reference():
    """drafter_loss on a real batch: host-found supervised rows (sup_idx) give the boolean-mask loss of before, and
    ce_chunk changes neither the loss nor the drafter's gradients (fp32)."""
    import torch.nn.functional as F

    from qdflash.models import load_model
    target = load_model("tiny", "float32")
    cfg = load_config(DrafterConfig, "tiny")
    rows = []
    g = torch.Generator().manual_seed(3)
    for L in (30, 41, 25):
        rows.append({"input_ids": torch.randint(4, 300, (L,), generator=g).tolist(),
                     "loss_mask": [0] * 8 + [1] * (L - 8)})
    from qdflash.drafter_train import drafter_loss
    from qdflash.features import compute_features
    feats = compute_features(target, rows, cfg.target_layer_ids, cfg.max_len)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, 0).float()
    b = make_batch(rows, feats, [0, 1, 2], cfg, 0, torch.Generator().manual_seed(0), 2.0)
    assert torch.equal(b["sup_idx"], (b["weights"].reshape(-1) > 0).nonzero().squeeze(1))
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    grads, losses = [], []
    for chunk in (0, 5):
        d.zero_grad()
        loss, info = drafter_loss(d, emb, head, b, None, ce_chunk=chunk)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in d.parameters()])
        assert info["n_sup"] == len(b["sup_idx"]) and 0 <= float(info["acc"]) <= 1
    with torch.no_grad():                               # the boolean-mask form the loss had before sup_idx
        h = d(emb(b["noise_ids"]), b["ctx"], b["q_pos"], b["ctx_pos"], attn_mask=b["mask"])
        sel = b["weights"] > 0
        ce = F.cross_entropy(head(h[sel]).float(), b["labels"][sel], reduction="none")
        ref = (ce * b["weights"][sel]).sum() / (b["weights"][sel].sum() + 1e-6)
    torch.testing.assert_close(losses[0], ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for a, c in zip(*grads):
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-6)


def test_draft_vocabulary_roundtrips_and_decoding_stays_lossless(tmp_path, tiny_target):
    """A reduced draft vocabulary (set_draft_vocab): the map survives save/load, target_to_draft inverts it, every
    proposal is inside it, and greedy speculative decoding still emits the plain target's tokens (eager and walk)."""
    from qdflash.drafter import draft_tokens, set_draft_vocab, target_to_draft
    from qdflash.walk import Walker
    target, tok = tiny_target
    ps = _prompts(tok)
    plain = [generate(target, p, 30, None, eos_token_id=tok.eos_token_id) for p in ps]
    vocab = sorted({t for r in plain for t in r.tokens} | {5, 7})          # the plain outputs' tokens: drafts can hit
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=1).to(torch.float64).eval()
    set_draft_vocab(d, vocab)
    assert d.draft_vocab.tolist() == vocab and d.config.dflash_config["draft_vocab_size"] == len(vocab)
    t2d = target_to_draft(d, d.config.vocab_size)
    assert torch.equal(t2d[d.draft_vocab], torch.arange(len(vocab))) and int((t2d >= 0).sum()) == len(vocab)
    save_drafter(d, tmp_path / "d")
    back = load_drafter(tmp_path / "d", torch.float64)
    assert back.draft_vocab.tolist() == vocab
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), back.state_dict().values()))
    h = torch.randn(1, 5, target.config.hidden_size, dtype=torch.float64)
    props = draft_tokens(back, target.get_output_embeddings(), h)
    assert set(props.flatten().tolist()) <= set(vocab)
    full = target.get_output_embeddings()(h).argmax(-1)                     # the full-vocabulary argmax differs
    spec = [generate(target, p, 30, back, eos_token_id=tok.eos_token_id) for p in ps]
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    assert sum(sum(a - 1 for a in r.accept_lengths) for r in spec) > 0      # some drafts were accepted
    walked = Walker(target, ps, plain, tok.eos_token_id).walk(back, 30)
    assert [r.accept_lengths for r in walked] == [r.accept_lengths for r in spec]
    with pytest.raises(ValueError):
        set_draft_vocab(d, [target.config.vocab_size])
    assert full.shape == props.shape


def test_draft_vocabulary_batch_drops_labels_it_cannot_propose():
    """make_batch with t2d: labels become draft indices; a label outside the vocabulary weighs 0 (not supervised)."""
    cfg = load_config(DrafterConfig, "tiny")
    rows = [{"input_ids": list(range(10, 40)), "loss_mask": [0] * 5 + [1] * 25}]
    feats = [torch.zeros(30, 8)]
    t2d = torch.full((64,), -1, dtype=torch.long)
    keep = [t for t in range(10, 40) if t % 2 == 0]
    t2d[keep] = torch.arange(len(keep))
    full = make_batch(rows, feats, [0], cfg, 1, torch.Generator().manual_seed(0), 2.0)
    red = make_batch(rows, feats, [0], cfg, 1, torch.Generator().manual_seed(0), 2.0, t2d=t2d)
    inside = t2d[full["labels"]] >= 0
    assert torch.equal(red["weights"], full["weights"] * inside)
    assert bool(((full["weights"] > 0) & ~inside).any())                   # some supervised labels were dropped
    sup = red["weights"] > 0
    assert torch.equal(red["labels"][sup], t2d[full["labels"][sup]])


def test_vllm_serves_a_reduced_vocabulary_drafter_only_exported(tmp_path, tiny_target):
    """This package's reduced-vocabulary checkpoint (``d2t`` = token ids) is refused for vLLM; its export
    (``export_draft_vocab_for_vllm``) carries vLLM's form: offsets with ids = arange + d2t, the target's lm_head rows of
    those ids as the drafter's own head, the top-level size, every other tensor unchanged; the loader refuses the
    export, and a whole-vocabulary drafter needs none. (vLLM serving the export: tests/test_high_accept.py.)"""
    from safetensors.torch import load_file

    from qdflash.drafter import export_draft_vocab_for_vllm, load_drafter, set_draft_vocab
    from qdflash.vllm_jobs import check_servable_drafter
    target, tok = tiny_target
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id)
    save_drafter(d, tmp_path / "full")
    check_servable_drafter(str(tmp_path / "full"))
    head = target.get_output_embeddings().weight
    with pytest.raises(ValueError, match="whole vocabulary"):
        export_draft_vocab_for_vllm(tmp_path / "full", head, tmp_path / "full-vllm")
    ids = list(range(5, 200, 3))
    save_drafter(set_draft_vocab(d, ids), tmp_path / "reduced")
    with pytest.raises(ValueError, match="draft vocabulary"):
        check_servable_drafter(str(tmp_path / "reduced"))
    with pytest.raises(ValueError, match="hidden size"):
        export_draft_vocab_for_vllm(tmp_path / "reduced", head[:, :-1], tmp_path / "bad")
    out = export_draft_vocab_for_vllm(tmp_path / "reduced", head, tmp_path / "reduced-vllm")
    check_servable_drafter(str(out))
    src, got = load_file(tmp_path / "reduced" / "model.safetensors"), load_file(out / "model.safetensors")
    n = len(ids)
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == n
    assert torch.equal(torch.arange(n) + got["d2t"], torch.tensor(ids)) and bool((got["d2t"] != 0).all())
    assert torch.equal(got["lm_head.weight"], head[ids].to(got["lm_head.weight"].dtype))
    assert set(got) == set(src) | {"lm_head.weight"}
    assert all(torch.equal(got[k], v) for k, v in src.items() if k != "d2t")
    with pytest.raises(ValueError, match="vLLM export"):
        load_drafter(out)


def test_served_drafter_exports_a_reduced_vocabulary_drafter_for_each_target(tmp_path, tiny_target):
    """``serving.served_drafter`` (what stage 05 and verify_cost_k.py give vLLM): a whole-vocabulary drafter as it is;
    a reduced one as its export carrying *that* target's lm_head rows (two targets with different heads get two
    exports), written again when the source changed under the same name (never a stale export); an export passes
    through."""
    from safetensors.torch import load_file

    from qdflash.drafter import set_draft_vocab
    from qdflash.models import load_model, resolve_target
    from qdflash.serving import served_drafter
    target, tok = tiny_target
    d = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id)
    full = str(save_drafter(d, tmp_path / "full"))
    t1 = resolve_target("tiny")
    assert served_drafter(full, t1, tmp_path) == full
    t2 = tmp_path / "other-target"                  # the same model with another head (as a QAD target has)
    m = load_model(t1, "float32", "cpu")
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(-2.0)
    m.config.tie_word_embeddings = False
    m.save_pretrained(t2)
    ids = list(range(7, 300, 5))
    red = str(save_drafter(set_draft_vocab(d, ids), tmp_path / "reduced"))
    heads = {}
    e1, e2 = served_drafter(red, t1, tmp_path, heads), served_drafter(red, str(t2), tmp_path, heads)
    assert e1 != e2 and set(heads) == {t1, str(t2)}
    h1 = load_model(t1, "float32", "cpu").get_output_embeddings().weight
    for e, h in ((e1, h1), (e2, -2.0 * h1)):
        got = load_file(f"{e}/model.safetensors")
        assert torch.equal(got["lm_head.weight"].float(), h[ids].to(got["lm_head.weight"].dtype).float())
        assert torch.equal(torch.arange(len(ids)) + got["d2t"], torch.tensor(ids))
    ids2 = list(range(11, 380, 7))                  # another drafter saved under the same name
    save_drafter(set_draft_vocab(d, ids2), tmp_path / "reduced")
    assert served_drafter(red, t1, tmp_path, heads) == e1
    assert torch.equal(torch.arange(len(ids2)) + load_file(f"{e1}/model.safetensors")["d2t"], torch.tensor(ids2))
    assert served_drafter(e1, t1, tmp_path) == e1


def test_head_logits_is_the_linear_head_in_either_order():
    """``head_logits`` is ``F.linear(h, W)`` for every shape it takes (block rows in the transposed order, more rows,
    a batch dimension, another dtype), and ``draft_tokens`` proposes the head's argmax, with a reduced vocabulary too."""
    import torch.nn.functional as F

    from qdflash.drafter import HEAD_GEMM_MAX_ROWS, draft_tokens, head_logits
    g = torch.Generator().manual_seed(0)
    W = torch.randn(1000, 64, generator=g)
    for shape in ((1, 7, 64), (7, 64), (2, 3, 64), (1, HEAD_GEMM_MAX_ROWS + 5, 64), (64,)):
        h = torch.randn(*shape, generator=g)
        assert torch.allclose(head_logits(W, h), F.linear(h, W), atol=1e-4), shape
    hb = torch.randn(1, 7, 64, generator=g).bfloat16()
    assert torch.equal(head_logits(W.bfloat16(), hb), F.linear(hb, W.bfloat16()))
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight.data.copy_(W)

    class D:                                    # what draft_tokens reads of a drafter
        pass
    h = torch.randn(1, 7, 64, generator=g)
    assert torch.equal(draft_tokens(D(), head, h), F.linear(h, W).argmax(-1))
    d = D()
    d.draft_vocab = torch.tensor([5, 17, 400, 999])
    assert torch.equal(draft_tokens(d, head, h), d.draft_vocab[F.linear(h, W[d.draft_vocab]).argmax(-1)])
