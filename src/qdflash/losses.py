"""The drafter's output loss over the target's vocabulary without keeping every logit.

``linear_cross_entropy(h, weight, labels, w)`` is ``sum_i w_i * CE(h_i @ weight.T, labels_i)`` (and the number of rows
whose argmax is the label) computed in chunks of rows: each chunk's logits are made in the compute dtype, reduced in
fp32 (log-sum-exp, the label's logit) and turned at once into the chunk's input gradient
``((softmax - onehot) * w) @ weight``, so that no [rows, vocab] tensor outlives its chunk and nothing of it is saved
for the backward pass (the gradient is computed during the forward; the backward only scales it). ``weight`` (the
target's frozen lm_head) receives no gradient. The same arithmetic as autograd through ``F.linear`` + ``.float()`` +
``F.cross_entropy``: the logits are rounded to the compute dtype, softmax and sums are fp32, the logit gradient is cast
to the compute dtype before its matmul (tests/test_drafter.py compares the two).
"""
from __future__ import annotations

import torch


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, w, chunk: int, dtype: torch.dtype):
        need_grad = ctx.needs_input_grad[0]
        wt = weight.to(dtype)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        hits = torch.zeros((), dtype=torch.float32, device=h.device)
        grad = torch.empty_like(h) if need_grad else None
        with torch.autocast(h.device.type, enabled=False):
            for a in range(0, h.shape[0], chunk):
                hc, y, wc = h[a: a + chunk].to(dtype), labels[a: a + chunk], w[a: a + chunk].float()
                logits = (hc @ wt.t()).float()
                lse = torch.logsumexp(logits, -1)
                loss += ((lse - logits.gather(1, y[:, None]).squeeze(1)) * wc).sum()
                hits += (logits.argmax(-1) == y).sum()
                if need_grad:
                    p = logits.sub_(lse[:, None]).exp_()                          # softmax, in place of the logits
                    p[torch.arange(len(y), device=y.device), y] -= 1.0
                    grad[a: a + chunk] = (p.mul_(wc[:, None]).to(dtype) @ wt).to(h.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(hits)
        return loss, hits

    @staticmethod
    def backward(ctx, g_loss, g_hits):
        (grad,) = ctx.saved_tensors
        return (grad * g_loss.to(grad.dtype) if grad is not None else None), None, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, w: torch.Tensor,
                         chunk: int = 4096, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of w * cross-entropy, count of rows whose argmax is the label) for rows h [n, H] against ``weight``
    [V, H], in chunks of ``chunk`` rows, matmuls in ``dtype`` (default: ``h``'s). Differentiable in ``h`` only."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _ChunkedLinearCE.apply(h, weight.detach(), labels, w, int(chunk), dtype or h.dtype)
