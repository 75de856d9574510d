"""Batched forward passes over (context, response) pairs, returning only the response part.

Used by hint distillation (student and hint-conditioned teacher over the same erring turn) and
by trace-replay DPO (chosen and rejected responses). Sequences are left-padded so that every
response ends at the last position; then the last ``L + 1`` positions are all that is kept
(``logits_to_keep``), never the ``(total length, V)`` logits of the context.

:func:`shared_context_logps` scores several responses to one context (DPO's chosen and
rejected) with the context run once: its keys and values (``past_key_values``) are shared by
the responses, so the context's forward and backward are paid once per pair, not twice. The
result and its gradient are those of scoring each ``context + response`` on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from trl.trainer.utils import selective_log_softmax

__all__ = ["ResponseBatch", "checkpointing_active", "pack_responses", "response_hidden", "response_logits",
           "shared_context_logps"]


@dataclass
class ResponseBatch:
    """Left-padded ``context + response`` sequences.

    Attributes:
        input_ids: ``(N, S)`` long.
        attention_mask: ``(N, S)`` long, 0 on padding.
        position_ids: ``(N, S)`` long, positions counted from each row's first real token.
        labels: ``(N, L)`` long, the response tokens right-aligned (``pad_id`` before them).
        mask: ``(N, L)`` bool, True on response tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor

    @property
    def response_length(self) -> int:
        return self.labels.shape[1]


def pack_responses(contexts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int,
                   device: torch.device | str = "cpu") -> ResponseBatch:
    """Build a :class:`ResponseBatch`.

    Args:
        contexts: per row, the token ids before the response (non-empty).
        responses: per row, the response token ids (non-empty).
        pad_id: padding token id.
        device: where the tensors go.

    Raises:
        ValueError: row counts differ, or an empty context or response.
    """
    if len(contexts) != len(responses) or not contexts:
        raise ValueError(f"{len(contexts)} contexts for {len(responses)} responses")
    if any(not c for c in contexts) or any(not r for r in responses):
        raise ValueError("every context and response must be non-empty")
    rows = [list(c) + list(r) for c, r in zip(contexts, responses, strict=True)]
    width = max(len(r) for r in rows)
    length = max(len(r) for r in responses)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
        input_ids[i, width - len(row):] = torch.tensor(row)
        attention_mask[i, width - len(row):] = 1
        labels[i, length - len(response):] = torch.tensor(list(response))
        mask[i, length - len(response):] = True
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return ResponseBatch(input_ids.to(device), attention_mask.to(device), position_ids.to(device),
                         labels.to(device), mask.to(device))


def response_logits(model: torch.nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Logits predicting each response token: ``(N, L, V)``, right-aligned like ``batch.labels``.

    Position ``j`` of the output predicts ``batch.labels[:, j]``. Gradients flow unless the
    caller runs it under ``torch.no_grad()``.
    """
    length = batch.response_length
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                logits_to_keep=length + 1, use_cache=False)
    return out.logits[:, :-1, :]


def response_hidden(model: torch.nn.Module, batch: ResponseBatch) -> torch.Tensor:
    """Last hidden states predicting each response token: ``(N, L, H)`` (for fused-linear
    losses that never build the ``(N, L, V)`` logits)."""
    length = batch.response_length
    get_decoder = getattr(model, "get_decoder", None)
    backbone = get_decoder() if get_decoder is not None else model.model
    assert isinstance(backbone, torch.nn.Module), f"the decoder is a module, got {type(backbone).__name__}"
    hidden = backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False).last_hidden_state
    return hidden[:, -(length + 1):-1, :]


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` now would run a layer under activation checkpointing
    (transformers drops ``past_key_values`` there, so a shared-context pass cannot be used)."""
    return any(module.training and getattr(module, "gradient_checkpointing", False) is True
               for module in model.modules())


def shared_context_logps(model: torch.nn.Module, contexts: Sequence[Sequence[int]],
                         responses: Sequence[Sequence[Sequence[int]]], pad_id: int,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """Summed log-probs of ``K`` responses per context, each context run once.

    Pass 1 runs the left-padded contexts with ``use_cache=True`` and keeps only the last
    position's logits (they predict every response's first token). The cache is repeated ``K``
    times along the batch, and pass 2 runs the right-padded responses, minus their last token
    (never an input), over it, positions continuing each context's. Gradients flow through both
    passes, so a context's backward sums what its ``K`` responses send it: the same value and
    gradient as :func:`pack_responses` + :func:`response_logits` on each ``context + response``
    (up to float summation order; ``tests/test_trainer_perf_paths.py``).

    Args:
        model: a causal LM taking ``past_key_values`` (not under activation checkpointing, see
            :func:`checkpointing_active`).
        contexts: ``N`` non-empty token-id lists.
        responses: per context, ``K`` non-empty response token-id lists (the same ``K`` for all).
        pad_id: padding token id.
        device: where the tensors go.

    Returns:
        ``(N, K)`` float: ``sum_j log p(response_j | context, response_<j)``.

    Raises:
        ValueError: no contexts, an empty context or response, or differing ``K``.
    """
    if not contexts or len(contexts) != len(responses):
        raise ValueError(f"{len(contexts)} contexts for {len(responses)} response groups")
    k = len(responses[0])
    if k == 0 or any(len(group) != k for group in responses):
        raise ValueError("every context needs the same number (>= 1) of responses")
    if any(not c for c in contexts) or any(not r for group in responses for r in group):
        raise ValueError("every context and response must be non-empty")
    n = len(contexts)
    width = max(len(c) for c in contexts)
    context_ids = torch.full((n, width), pad_id, dtype=torch.long)
    context_mask = torch.zeros((n, width), dtype=torch.long)
    for i, context in enumerate(contexts):  # left-padded: every context ends at the last position
        context_ids[i, width - len(context):] = torch.tensor(list(context))
        context_mask[i, width - len(context):] = 1
    context_positions = (context_mask.cumsum(-1) - 1).clamp(min=0)
    flat = [list(r) for group in responses for r in group]
    length = max(len(r) for r in flat)
    labels = torch.full((n * k, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n * k, length), dtype=torch.bool)
    for i, response in enumerate(flat):  # right-padded: every response starts right after its context
        labels[i, :len(response)] = torch.tensor(response)
        mask[i, :len(response)] = True
    context_ids, context_mask, context_positions = (t.to(device) for t in (context_ids, context_mask, context_positions))
    labels, mask = labels.to(device), mask.to(device)

    first = model(input_ids=context_ids, attention_mask=context_mask, position_ids=context_positions,
                  logits_to_keep=1, use_cache=True)
    # (N·K,) log p(first response token | context)
    logps = selective_log_softmax(first.logits[:, -1, :].repeat_interleave(k, dim=0), labels[:, 0])
    if length > 1:
        cache = first.past_key_values
        cache.batch_repeat_interleave(k)
        inputs = labels[:, :-1]  # token j is input to predict token j + 1; the last is never an input
        input_mask = mask[:, :-1].long()
        lengths = context_mask.sum(-1).repeat_interleave(k)
        positions = lengths[:, None] + torch.arange(length - 1, device=labels.device)[None, :]
        attention_mask = torch.cat([context_mask.repeat_interleave(k, dim=0), input_mask], dim=1)
        rest = model(input_ids=inputs, attention_mask=attention_mask, position_ids=positions,
                     past_key_values=cache, logits_to_keep=length - 1, use_cache=True)
        rest_logps = selective_log_softmax(rest.logits, labels[:, 1:])
        logps = logps + (rest_logps * mask[:, 1:].to(rest_logps.dtype)).sum(-1)
    return logps.view(n, k)
