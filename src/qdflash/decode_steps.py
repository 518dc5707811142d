"""The steps every decoder shares (reference, fast, walk): device sync for timing, sampling the target's token,
the acceptance rule, emitting tokens up to EOS / the budget, and rolling back a hybrid target's recurrent state."""
from __future__ import annotations

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def sample_tokens(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """logits [n, V] -> tokens [n]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def is_recurrent(layer_or_class) -> bool:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    cls = layer_or_class if isinstance(layer_or_class, type) else type(layer_or_class)
    return issubclass(cls, LinearAttentionCacheLayerMixin)


def snapshot_recurrent(cache) -> list | None:
    """Copies of the conv and recurrent states of every linear-attention layer of ``cache``; None when it has none
    (a plain-attention cache, which ``crop`` rolls back)."""
    snap = [(i, {k: None if v is None else v.clone() for k, v in layer.conv_states.items()},
             {k: None if v is None else v.clone() for k, v in layer.recurrent_states.items()},
             dict(layer.has_previous_state)) for i, layer in enumerate(cache.layers) if is_recurrent(layer)]
    return snap or None


def rollback_block(cache, snapshot: list, n_block: int) -> None:
    """Undo the last forward of ``n_block`` tokens: crop them from every attention layer's KV and put the
    linear-attention states back to ``snapshot`` (taken just before that forward)."""
    from transformers.cache_utils import CacheLayerMixin
    for i, conv, rec, prev in snapshot:
        layer = cache.layers[i]
        for states, saved in ((layer.conv_states, conv), (layer.recurrent_states, rec)):
            for k, v in saved.items():
                if v is not None and states[k] is not None and states[k].shape == v.shape:
                    states[k].copy_(v)          # in place: transformers keeps these tensors at a static address
                else:
                    states[k] = None if v is None else v.clone()
        layer.has_previous_state.update(prev)
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin):
            continue
        # a layer holding both kinds crops only its attention part (the first non-recurrent crop in its MRO)
        crop = next(c.crop for c in type(layer).__mro__
                    if "crop" in c.__dict__ and issubclass(c, CacheLayerMixin) and not is_recurrent(c))
        crop(layer, -n_block)


def accept_drafts(block: list[int], post: list[int]) -> tuple[int, list[int]]:
    """Verification of one block (shared by this decoder and ``fast_decode``). ``block`` = [anchor, drafts...];
    ``post[i]`` is the target's token (argmax or sample) after ``block[: i + 1]``. Returns the number of accepted
    drafts (the longest prefix of drafts equal to the target's tokens) and the tokens this step emits: the accepted
    drafts plus the target's token at the first mismatch (correction) or after the block (bonus)."""
    acc = 0
    while acc < len(block) - 1 and block[acc + 1] == post[acc]:
        acc += 1
    return acc, block[1: acc + 1] + [post[acc]]


def emit_tokens(tokens: list[int], new: list[int], eos_token_id: int | None, max_new_tokens: int) -> bool:
    """Append ``new`` to ``tokens``, stopping at EOS or at ``max_new_tokens``; True when decoding is over."""
    for t in new:
        tokens.append(t)
        if t == eos_token_id or len(tokens) >= max_new_tokens:
            return True
    return False
