"""The fast CPU paths: the shared feature cache and bf16 training over fp32 master weights with a frozen target."""
import json

import pytest
import torch

from qdflash.config import DrafterConfig, load_config
from qdflash.drafter import new_drafter
from qdflash.drafter_train import drafter_loss, make_batch, precompute_features, train_drafter
from qdflash.features import cached_features
from qdflash.models import load_model, load_tokenizer, mask_token_id, resolve_target


def _rows(n, seed=0, lo=20, hi=60):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        L = int(torch.randint(lo, hi, (1,), generator=g))
        p = L // 3
        rows.append({"input_ids": torch.randint(4, 300, (L,), generator=g).tolist(),
                     "loss_mask": [0] * p + [1] * (L - p), "prompt_len": p})
    return rows


def test_feature_cache_reused_and_invalidated(tmp_path, monkeypatch):
    monkeypatch.setenv("QDFLASH_CACHE", str(tmp_path / "cache"))
    tdir = resolve_target("tiny")           # builds the tiny target inside the temporary cache
    target = load_model("tiny", "float32")
    rows = _rows(5)
    a = cached_features(target, tdir, rows, [0, 2], 48, "float32")
    assert a.computed_rows == 5
    direct = precompute_features(target, rows, [0, 2], 48)
    for i, r in enumerate(rows):
        assert a[i].dtype == torch.bfloat16 and a[i].shape == (min(48, len(r["input_ids"])), 2 * 128)
        assert torch.allclose(a[i].float(), direct[i], rtol=1e-2, atol=1e-2)
    b = cached_features(target, tdir, rows, [0, 2], 48, "float32")          # same inputs: nothing recomputed
    assert b.computed_rows == 0 and b.path == a.path
    assert torch.equal(b[3], a[3])
    rows2 = [dict(r) for r in rows]
    rows2[1] = {**rows2[1], "input_ids": rows2[1]["input_ids"][:-1] + [5]}
    c = cached_features(target, tdir, rows2, [0, 2], 48, "float32")         # data changed -> new key
    assert c.computed_rows == 5 and c.path != a.path
    d = cached_features(target, tdir, rows, [1, 2], 48, "float32")          # other layers -> new key
    assert d.computed_rows == 5 and d.path != a.path
    # target weights changed on disk -> new key
    from safetensors.torch import load_file, save_file
    f = next(iter(sorted((tmp_path / "cache").glob("tiny-qwen3/*.safetensors"))))
    st = load_file(f)
    k = next(k for k in st if k.endswith("q_proj.weight"))
    st[k] = st[k] * 1.5
    save_file(st, f, metadata={"format": "pt"})
    target2 = load_model("tiny", "float32")
    e = cached_features(target2, tdir, rows, [0, 2], 48, "float32")
    assert e.computed_rows == 5 and e.path != a.path


def test_feature_cache_resumes_after_a_killed_run(tmp_path, monkeypatch):
    from qdflash import features as FT
    monkeypatch.setenv("QDFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(FT, "SHARD_ROWS", 2)
    tdir = resolve_target("tiny")
    target = load_model("tiny", "float32")
    rows = _rows(5, seed=1)
    calls = {"n": 0}
    real = FT.compute_features

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)
    monkeypatch.setattr(FT, "compute_features", dying)
    with pytest.raises(KeyboardInterrupt):
        FT.cached_features(target, tdir, rows, [0], 48, "float32")
    monkeypatch.setattr(FT, "compute_features", real)
    s = FT.cached_features(target, tdir, rows, [0], 48, "float32")
    assert s.computed_rows == 3              # the first shard (2 rows) survived; shards 2 and 3 were computed now
    full = precompute_features(target, rows, [0], 48)
    for i in range(5):
        assert torch.allclose(s[i].float(), full[i], rtol=1e-2, atol=1e-2)


def test_bf16_drafter_training_lowers_loss_and_leaves_target_frozen(tmp_path):
    tok = load_tokenizer("tiny")
    target = load_model("tiny", "bfloat16")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    cfg = load_config(DrafterConfig, "tiny", dtype="bfloat16", epochs=6, lr=3e-3, batch_size=4)
    rows = _rows(8, seed=2)
    feats = precompute_features(target, rows, cfg.target_layer_ids, cfg.max_len, store_dtype=torch.bfloat16)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok))
    assert next(d.parameters()).dtype == torch.bfloat16       # built in the target's dtype ...
    b = make_batch(rows, feats, [0, 1, 2, 3], cfg, d.mask_token_id, torch.Generator().manual_seed(0), 2.0)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        loss0 = float(drafter_loss(d.float(), emb, head, b, torch.bfloat16)[0])
    log = train_drafter(d, target, rows, feats, cfg, cfg.epochs, tmp_path / "d.pt", tmp_path / "log.jsonl", "t",
                        progress=False)
    assert next(d.parameters()).dtype == torch.float32        # ... trained on fp32 master weights
    with torch.no_grad():
        loss1 = float(drafter_loss(d, emb, head, b, torch.bfloat16)[0])
    assert loss1 < 0.9 * loss0, (loss0, loss1, [r["loss"] for r in log])
    assert all(p.grad is None for p in target.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_drafter_training_resumed_mid_epoch_equals_uninterrupted(tmp_path, monkeypatch):
    """Kill training mid-epoch (after a mid-epoch checkpoint), resume: same weights as one uninterrupted run."""
    import qdflash.drafter_train as DT
    tok = load_tokenizer("tiny")
    target = load_model("tiny", "float32")
    cfg = load_config(DrafterConfig, "tiny", epochs=2, batch_size=2, save_every=2)
    rows = _rows(10, seed=3)                     # 5 steps per epoch: checkpoints at steps 2, 4 (mid-epoch), 5, ...
    feats = precompute_features(target, rows, cfg.target_layer_ids, cfg.max_len)

    def fresh():
        return new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok), seed=1)
    a = fresh()
    train_drafter(a, target, rows, feats, cfg, 2, tmp_path / "a.pt", tmp_path / "a.jsonl", "a", progress=False)
    b = fresh()
    real, calls = DT.make_batch, {"n": 0}

    def dying(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 8:                      # epoch 1, step 3 of 5: the last checkpoint is step 6 (mid-epoch)
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(DT, "make_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(b, target, rows, feats, cfg, 2, tmp_path / "b.pt", tmp_path / "b.jsonl", "b", progress=False)
    monkeypatch.setattr(DT, "make_batch", real)
    st = torch.load(tmp_path / "b.pt", weights_only=False)
    assert st["step"] == 6 and st["step"] % 5 != 0            # really a mid-epoch resume point
    b2 = fresh()
    log = train_drafter(b2, target, rows, feats, cfg, 2, tmp_path / "b.pt", tmp_path / "b.jsonl", "b", progress=False)
    assert len(log) == 10
    for (n, p), q in zip(a.named_parameters(), b2.parameters()):
        assert torch.equal(p, q), n


def test_drafter_training_for_a_number_of_steps_cuts_the_last_epoch(tmp_path):
    """train_drafter(steps=N) runs exactly N optimizer steps (here 7 at 5 a epoch: one epoch and part of the next), its
    learning-rate schedule spanning the N steps (the last step's lr is the schedule's end, not a point inside 10
    steps)."""
    from qdflash.drafter_train import lr_at
    tok = load_tokenizer("tiny")
    target = load_model("tiny", "float32")
    cfg = load_config(DrafterConfig, "tiny", batch_size=2)
    rows = _rows(10, seed=3)                     # 5 steps per epoch
    feats = precompute_features(target, rows, cfg.target_layer_ids, cfg.max_len)
    d = new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok), seed=1)
    log = train_drafter(d, target, rows, feats, cfg, 1, tmp_path / "s.pt", tmp_path / "s.jsonl", "s", progress=False,
                        steps=7)
    assert [r["step"] for r in log] == list(range(1, 8)) and [r["epoch"] for r in log] == [0] * 5 + [1] * 2
    assert [r["lr"] for r in log] == [lr_at(i, 7, cfg.warmup_frac, cfg.lr) for i in range(7)]
    assert log[-1]["lr"] != lr_at(6, 10, cfg.warmup_frac, cfg.lr)


def test_features_equal_a_plain_forwards_hidden_states():
    """compute_features (batched, right-padded, no logits computed) gives each row's hidden states of a forward of
    that row alone, the last layer's after the final norm as transformers returns it."""
    from qdflash.drafter import target_features
    from qdflash.features import compute_features
    target = load_model("tiny", "float64")
    rows = _rows(4)
    got = compute_features(target, rows, [0, 2], 48, bs=4)
    for r, g in zip(rows, got):
        ids = torch.tensor([r["input_ids"][:48]])
        with torch.no_grad():
            hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        assert torch.allclose(g, target_features(hs, [0, 2])[0], atol=1e-9)


def test_drafter_training_seconds_carry_over_a_resume(tmp_path, monkeypatch):
    """The log's training seconds (a clock that ticks 1 s per read) go on from the killed run's last checkpoint: the
    resumed steps count on from it, not from 0; a checkpoint whose log carries none (older code) gets none added, and
    train_and_save then reports its own wall time and no wall_s."""
    import types

    import qdflash.drafter_train as DT
    tok = load_tokenizer("tiny")
    target = load_model("tiny", "float32")
    cfg = load_config(DrafterConfig, "tiny", epochs=2, batch_size=2, save_every=2)
    rows = _rows(10, seed=3)
    feats = precompute_features(target, rows, cfg.target_layer_ids, cfg.max_len)
    clock = {"t": 0.0}

    def tick():
        clock["t"] += 1.0
        return clock["t"]
    monkeypatch.setattr(DT, "time", types.SimpleNamespace(time=tick))

    def fresh():
        return new_drafter(target, cfg.num_layers, cfg.block_size, cfg.target_layer_ids, mask_token_id(tok), seed=1)
    real, calls = DT.make_batch, {"n": 0}

    def dying(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(DT, "make_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(fresh(), target, rows, feats, cfg, 2, tmp_path / "b.pt", tmp_path / "b.jsonl", "b", progress=False)
    monkeypatch.setattr(DT, "make_batch", real)
    st = torch.load(tmp_path / "b.pt", weights_only=False)
    before = st["log"][-1]["train_s"]
    assert len(st["log"]) == 6 and before > 1
    log = train_drafter(fresh(), target, rows, feats, cfg, 2, tmp_path / "b.pt", tmp_path / "b.jsonl", "b", progress=False)
    t = [r["train_s"] for r in log]
    assert t[:6] == [r["train_s"] for r in st["log"]] and t == sorted(t) and t[6] > before
    # a log begun by older code: no training seconds in it, none added; train_and_save falls back to its wall time
    for r in st["log"]:
        del r["train_s"]
    torch.save(st, tmp_path / "old.ckpt.pt")
    monkeypatch.setattr(DT, "save_drafter", lambda drafter, path, meta: path)
    _, m = DT.train_and_save("old", fresh(), target, rows, feats, cfg, 2, tmp_path, progress=False)
    assert m["steps"] == 10 and "wall_s" not in m and m["train_s"] > 0
    assert not any("train_s" in json.loads(x) for x in (tmp_path / "train_log-old.jsonl").read_text().splitlines())
