"""Stage 03's decoding grid resumes run by run (decode_grid): a cut grid decodes only what is missing, and a saved
run is never reused for other weights or other settings."""
import pytest
import torch

from qdflash import decode_grid as G
from qdflash import speculative
from qdflash.decode_grid import decode_grid, fingerprint
from qdflash.drafter import new_drafter


@pytest.fixture
def grid(tiny_target, one_thread):
    target, tok = tiny_target
    drafters = {name: new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=i).double()
                for i, name in enumerate(("a", "b", "c"))}
    prompts = [tok("the red cat and the blue dog")["input_ids"], tok("tell me about the moon")["input_ids"]]
    settings = {"target": "tiny", "prompts": prompts, "max_new_tokens": 12, "dtype": "float64", "temperature": 0.0,
                "seed": 0, "decoder": "eager"}
    return target, tok, drafters, settings


def _count_decodes(monkeypatch):
    seen = []
    real = speculative.decode_prompts

    def counting(target, prompts, n, drafter=None, *a, **k):
        seen.append(a[5])
        return real(target, prompts, n, drafter, *a, **k)
    monkeypatch.setattr(speculative, "decode_prompts", counting)
    return seen


def _cut_grid(monkeypatch, at: int, *args) -> None:
    """``decode_grid(*args)`` killed during its ``at``-th decoding run (1 = plain), as a cut device call would."""
    real, calls = speculative.decode_prompts, []

    def cut(*a, **k):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(speculative, "decode_prompts", cut)
    with pytest.raises(KeyboardInterrupt):
        decode_grid(*args)
    monkeypatch.setattr(speculative, "decode_prompts", real)


def test_cut_grid_resumes_with_the_missing_runs_only(grid, tmp_path, monkeypatch):
    target, tok, drafters, settings = grid
    full = decode_grid(tmp_path / "full.json", target, settings, drafters, tok.eos_token_id)
    path = tmp_path / "decode-fp.json"
    _cut_grid(monkeypatch, 3, path, target, settings, drafters, tok.eos_token_id)     # plain, a, then cut in b
    seen = _count_decodes(monkeypatch)
    again = decode_grid(path, target, settings, drafters, tok.eos_token_id)
    assert seen == ["b", "c"]                                  # plain and a came from the file
    assert again["plain"]["reused"] and again["a"]["reused"] and "reused" not in again["b"]
    for name in ("a", "b", "c"):
        assert again[name]["tau"] == full[name]["tau"] and again[name]["steps"] == full[name]["steps"]
        assert again[name]["mismatched_outputs"] == 0
    seen.clear()
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    assert seen == []                                          # a whole saved grid decodes nothing


def test_saved_runs_need_the_same_weights_and_settings(grid, tmp_path, monkeypatch):
    target, tok, drafters, settings = grid
    path = tmp_path / "decode-fp.json"
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    seen = _count_decodes(monkeypatch)
    with torch.no_grad():
        next(iter(drafters["b"].parameters())).add_(0.01)    # other weights under the same name
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    assert seen == ["b"]
    seen.clear()
    decode_grid(path, target, {**settings, "max_new_tokens": 10}, drafters, tok.eos_token_id)
    assert seen == ["plain", "a", "b", "c"]                   # other settings: nothing reused


def test_a_rewritten_target_or_other_code_reuses_nothing(grid, tmp_path, monkeypatch):
    """The saved runs name the target's weight files (size, mtime) and the code's git SHA: a stage 01 that rewrote
    the target, or a code change, decodes everything again; a reused run timed in another process says so."""
    target, tok, drafters, settings = grid
    tdir = tmp_path / "qad-target"
    tdir.mkdir()
    (tdir / "model.safetensors").write_bytes(b"x" * 10)
    settings = {**settings, "target": str(tdir)}
    path = tmp_path / "decode-qad.json"
    monkeypatch.setattr(G, "git_sha", lambda: "abc")
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    seen = _count_decodes(monkeypatch)
    monkeypatch.setattr(G, "SESSION", "another process")
    again = decode_grid(path, target, settings, {**drafters, "d": drafters["a"]}, tok.eos_token_id)
    assert seen == ["d"]
    assert again["plain"]["reused"] and again["a"]["reused"] and "reused" not in again["d"]
    assert again["d"]["speedup_across_sessions"]               # timed here, against a plain run of the first process
    assert "speedup_across_sessions" not in again["a"]         # both from the first process
    (tdir / "model.safetensors").write_bytes(b"y" * 11)        # stage 01 rewrote the target
    seen.clear()
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    assert seen == ["plain", "a", "b", "c"]
    monkeypatch.setattr(G, "git_sha", lambda: "def")
    seen.clear()
    decode_grid(path, target, settings, drafters, tok.eos_token_id)
    assert seen == ["plain", "a", "b", "c"]


def test_fingerprint_follows_the_weights(tiny_target):
    target, tok = tiny_target
    a = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=0)
    b = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=0)
    assert fingerprint(a) == fingerprint(b)
    with torch.no_grad():
        next(iter(b.parameters())).view(-1)[0] += 1e-6
    assert fingerprint(a) != fingerprint(b)
    c = new_drafter(target, 1, 4, [0, 2], tok.mask_token_id, seed=0)      # other layers, the same weights
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))
    assert fingerprint(a) != fingerprint(c)
    assert fingerprint(a) != fingerprint(a.to(torch.bfloat16))


def test_stage04_reads_a_grid_file_and_ignores_a_cut_one(grid, tmp_path, monkeypatch):
    """Stage 04 takes plain and the two-stage drafter from stage 03's grid file only when both runs are in it."""
    from qdflash.config import DrafterQuantConfig, load_config
    from qdflash.drafter_quant import reusable_decodes
    target, tok, drafters, settings = grid
    cfg = load_config(DrafterQuantConfig, "tiny", eval_new_tokens=settings["max_new_tokens"])
    tdir = tmp_path / "qad"
    tdir.mkdir()
    settings = {**settings, "target": str(tdir), "dtype": "float32"}
    path = tmp_path / "decode-qad.json"
    two = {"pretrain": drafters["a"], "two_stage": drafters["b"]}
    _cut_grid(monkeypatch, 3, path, target, settings, two, tok.eos_token_id)          # plain, pretrain, cut
    assert reusable_decodes(path, str(tdir), settings["prompts"], cfg) == {}      # no two-stage run yet
    stats = decode_grid(path, target, settings, two, tok.eos_token_id)
    got = reusable_decodes(path, str(tdir), settings["prompts"], cfg)
    assert set(got) == {"plain", "fp32"} and len(got["fp32"]) == len(settings["prompts"])
    assert speculative.run_stats(got["fp32"], True)["tau"] == stats["two_stage"]["tau"]


def test_walked_runs_are_saved_and_never_stand_for_decoded_ones(grid, tmp_path, monkeypatch):
    """A grid that walks some drafters (walk.Walker) saves them as walked: a rerun reuses them, and a drafter decoded
    before is decoded again when asked to walk, and the other way round."""
    target, tok, drafters, settings = grid
    path = tmp_path / "decode-fp.json"
    first = decode_grid(path, target, settings, drafters, tok.eos_token_id, walk=["b", "c"])
    assert first["b"]["measured_by"] == "walk" and first["b"]["tokens_per_s"] is None
    assert "speedup" not in first["b"] and "mismatched_outputs" not in first["b"]
    assert first["a"]["measured_by"] == "decoder" and first["a"]["walk_check"]["prompts"] == 2
    assert first["a"]["walk_check"]["prompts_identical"] == 2
    seen = _count_decodes(monkeypatch)
    again = decode_grid(path, target, settings, drafters, tok.eos_token_id, walk=["a", "b"])
    assert seen == ["c"]                                        # c was walked before, now it is decoded
    assert again["b"]["reused"] and again["b"]["tau"] == first["b"]["tau"]
    assert "reused" not in again["a"] and again["a"]["measured_by"] == "walk"
    with pytest.raises(ValueError, match="greedy"):
        decode_grid(tmp_path / "t.json", target, {**settings, "temperature": 0.7}, drafters, tok.eos_token_id,
                    walk=["a"])
