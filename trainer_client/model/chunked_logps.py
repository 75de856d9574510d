"""Token log-probabilities through the LM head, a block of full-vocabulary rows at a time.

``log p(y_i | h_i) = z_{i, y_i} − logsumexp_v z_{i, v}`` with ``z = h · Wᵀ``, never building the
``(N, V)`` logits, and its backward ``∂/∂z_{i,v} = g_i · (1[v = y_i] − p_{i,v})`` recomputing
each block's logits. The trainer's CPU path for :func:`~trainer_client.model.forward.head_logps`.

Our own rather than TRL's: trl 1.16's ``trl.kernels.ChunkedLogProbFunction`` is what
:func:`~trainer_client.model.forward.head_logps` uses wherever TRL runs its Triton kernels (CUDA),
but on other devices its torch tiles make about ten passes over each tile, each allocating a
tile-sized temporary (its backward scales by ``logit_scale`` and ``1/temperature`` even at 1,
and builds the target mask with ``arange == targets``). Here a block costs five in-place passes
in the forward and three in the backward, into one buffer allocated once per call; the
vocabulary-wide products are the same (one in the forward; one to recompute and two for the
gradients in the backward). Measured in ``docs/performance.md`` ("Whole training steps").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["chunked_logps"]


def _block_logits(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``hidden · weightᵀ`` into the float32 buffer ``out`` (``(n, V)``), in place when the weight is float32."""
    if weight.dtype == torch.float32 and hidden.dtype == torch.float32:
        return torch.mm(hidden, weight.t(), out=out)
    return out.copy_(F.linear(hidden, weight))


class _ChunkedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]  # autograd.Function's forward is untyped (*args)
                block_elements: int) -> torch.Tensor:
        rows, vocab = hidden.shape[0], weight.shape[0]
        step = max(1, min(rows, block_elements // vocab))
        buffer = torch.empty((step, vocab), dtype=torch.float32, device=hidden.device)
        log_z = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        logps = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        w = weight.detach()
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, rows, step):
                h = hidden[start:start + step].detach()
                tile = _block_logits(h, w, buffer[:h.shape[0]])
                peak = tile.amax(-1, keepdim=True)
                target = tile.gather(1, targets[start:start + step, None])
                total = tile.sub_(peak).exp_().sum(-1, keepdim=True)
                block_log_z = (peak + total.log_()).view(-1)
                log_z[start:start + step] = block_log_z
                logps[start:start + step] = target.view(-1) - block_log_z
        ctx.save_for_backward(hidden, weight, targets, log_z)
        ctx.step = step
        return logps

    @staticmethod
    def backward(ctx, grad_logps: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]  # autograd.Function's backward is untyped
        hidden, weight, targets, log_z = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        w = weight.detach()
        w32 = w.float()
        g = grad_logps.float()
        buffer = torch.empty((ctx.step, w.shape[0]), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.step):
                h = hidden[start:start + ctx.step].detach()
                block_g = g[start:start + ctx.step, None]
                tile = _block_logits(h, w, buffer[:h.shape[0]])
                # g·(onehot − p): p from the stored log-partition, then the targets' g added back
                tile.sub_(log_z[start:start + ctx.step, None]).exp_().mul_(-block_g)
                tile.scatter_add_(1, targets[start:start + ctx.step, None], block_g)
                if grad_hidden is not None:
                    grad_hidden[start:start + ctx.step] = tile @ w32
                if grad_weight is not None:
                    grad_weight.addmm_(tile.t(), h.float())
        return (None if grad_hidden is None else grad_hidden.to(hidden.dtype),
                None if grad_weight is None else grad_weight.to(weight.dtype), None, None)


def chunked_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  block_elements: int) -> torch.Tensor:
    """``log_softmax(hidden · weightᵀ)[i, targets[i]]`` for every row, at most ``block_elements``
    logits at a time (whole vocabulary rows; at least one row).

    Args:
        hidden: ``(N, H)`` final hidden states (gradient flows).
        weight: ``(V, H)`` the output embedding (an LM head without bias, scale or softcap;
            gradient flows).
        targets: ``(N,)`` long token ids.
        block_elements: the most logits one block holds (float32).

    Returns:
        ``(N,)`` float32 log-probabilities (nats).

    Raises:
        ValueError: shapes that do not match.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or weight.shape[1] != hidden.shape[1] \
            or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and targets "
                         f"{tuple(targets.shape)}: need (N, H), (V, H) and (N,)")
    out = _ChunkedLogProb.apply(hidden, weight, targets, block_elements)
    assert isinstance(out, torch.Tensor)
    return out
