"""Stage 03's decoding grid resumes run by run (decode_grid): a cut grid decodes only what is missing, and a saved
run is never reused for other weights or other settings."""
import pytest
import torch

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
    real = speculative.run_decoding

    def counting(target, prompts, n, drafter=None, *a, **k):
        seen.append(a[5])
        return real(target, prompts, n, drafter, *a, **k)
    monkeypatch.setattr(speculative, "run_decoding", counting)
    return seen


def test_cut_grid_resumes_with_the_missing_runs_only(grid, tmp_path, monkeypatch):
    target, tok, drafters, settings = grid
    full = decode_grid(tmp_path / "full.json", target, settings, drafters, tok.eos_token_id)
    path = tmp_path / "decode-fp.json"

    class Cut(RuntimeError):
        pass
    calls = []

    def cut_on_b(*a, **k):
        calls.append(1)
        if len(calls) == 3:                  # plain, a, then the cut in b
            raise Cut()
        return real(*a, **k)
    real = speculative.run_decoding
    monkeypatch.setattr(speculative, "run_decoding", cut_on_b)
    with pytest.raises(Cut):
        decode_grid(path, target, settings, drafters, tok.eos_token_id)
    monkeypatch.setattr(speculative, "run_decoding", real)
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


def test_fingerprint_follows_the_weights(tiny_target):
    target, tok = tiny_target
    a = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=0)
    b = new_drafter(target, 1, 4, [0, 3], tok.mask_token_id, seed=0)
    assert fingerprint(a) == fingerprint(b)
    with torch.no_grad():
        next(iter(b.parameters())).view(-1)[0] += 1e-6
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) != fingerprint(a.to(torch.bfloat16))
