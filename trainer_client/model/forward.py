"""Batched forward passes over (context, response) pairs, returning only the response part.

Used by hint distillation (student and hint-conditioned teacher over the same erring turn) and
by trace-replay DPO (chosen and rejected responses). Sequences are left-padded so that every
response ends at the last position; then the last ``L + 1`` positions are all that is kept
(``logits_to_keep``), never the ``(total length, V)`` logits of the context.

:func:`shared_context_logps` scores several responses to one context (DPO's chosen and
rejected) with the context run once: its keys and values (``past_key_values``) are shared by
the responses, so the context's forward and backward are paid once per pair, not twice. The
result and its gradient are those of scoring each ``context + response`` on its own.

:func:`~trainer_client.trl_compat.capture_body_forward` and :func:`response_hidden_after_prefix` do the same for hint
distillation's teacher: its context is the policy's own context with a hint inserted near the
end, so the keys and values the GRPO forward already computed for everything before the hint
are reused and only the hint and the erring turn are run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from trainer_client.model.chunked_logps import chunked_logps
from trainer_client.trl_compat import CapturedForward, cache_argument, output_cache, transformer_body

__all__ = ["BLOCK_ELEMENTS", "ResponseBatch", "checkpointing_active", "head_logps", "pack_responses",
           "response_hidden", "response_hidden_after_prefix", "response_logits", "shared_context_logps"]

#: The most elements of one ``(tokens, vocabulary)`` block of logits the chunked computations
#: (:func:`head_logps`, :func:`~trainer_client.losses.functional.chunked_jsd_loss`) build at a
#: time: 64 MiB in float32, about 110 tokens of Qwen3's 151,936-token vocabulary (a whole batch
#: at a vocabulary of a few thousand).
BLOCK_ELEMENTS = 2**24


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
    hidden = transformer_body(model)(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False).last_hidden_state
    return hidden[:, -(length + 1):-1, :]


def _head_transform(model: torch.nn.Module) -> tuple[float, float | None]:
    """``(logit_scale, final_logit_softcapping)`` that ``model``'s forward applies to its LM
    head's output, read from its config as trl 1.16's ``add_fused_lm_head`` reads them (the
    models TRL's own fused head supports: Gemma's softcap, Cohere's, Granite's and Falcon-H1's scales)."""
    config = model.config.get_text_config()  # type: ignore[union-attr,operator]  # transformers types config loosely
    scale = getattr(config, "logit_scale", None)
    for name in ("output_multiplier", "lm_head_multiplier"):
        scale = getattr(config, name, None) if scale is None else scale
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    return (1.0 if scale is None else float(scale)), getattr(config, "final_logit_softcapping", None)


def head_logps(model: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """``log p(labels)`` from final hidden states through ``model``'s LM head, without building
    the ``(N, L, V)`` logits, at most :data:`BLOCK_ELEMENTS` logits at a time, the backward
    recomputing each block: on CUDA, TRL's ``ChunkedLogProbFunction`` (``trl.kernels``, what
    trl 1.16's GRPO loss uses: Triton kernels); elsewhere, for a plain head (no bias, scale or
    softcap), :func:`~trainer_client.model.chunked_logps.chunked_logps` (in-place passes where
    TRL's torch tiles allocate, see its module), else TRL's. The value is
    ``selective_log_softmax(model's logits, labels)`` up to float summation order.

    Args:
        model: a causal LM (``get_output_embeddings``, ``config``).
        hidden: ``(N, L, H)`` final hidden states (after the body's last norm); position ``j``
            predicts ``labels[:, j]``.
        labels: ``(N, L)`` long token ids (any id at positions the caller masks out).
        mask: ``(N, L)`` bool: score only these positions (0 elsewhere), so padding (a short
            chosen turn beside a long rejected one) costs no vocabulary-wide product.

    Returns:
        ``(N, L)`` float32 log-probabilities (gradients flow to ``hidden`` and the head).

    Raises:
        TypeError: ``model`` has no output embedding.
    """
    from trl.kernels import ChunkedLogProbFunction
    from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Module) or not isinstance(head.weight, torch.Tensor):
        raise TypeError(f"{type(model).__name__} has no output embedding (LM head) to score tokens with")
    scale, softcap = _head_transform(model)
    flat, targets = (hidden[mask], labels[mask]) if mask is not None else (hidden.reshape(-1, hidden.shape[-1]),
                                                                           labels.reshape(-1))
    weight, bias = head.weight, getattr(head, "bias", None)
    if flat.device.type != "cuda" and bias is None and scale == 1.0 and softcap is None:
        logps = chunked_logps(flat, weight, targets, BLOCK_ELEMENTS)
        return logps.view(labels.shape) if mask is None else logps.new_zeros(labels.shape).masked_scatter(mask, logps)
    width = max(1, min(weight.shape[0], BLOCK_ELEMENTS // max(1, min(flat.shape[0], TOKEN_CHUNK_SIZE))))
    logps = ChunkedLogProbFunction.apply(flat, weight, bias, targets, 1.0, width, softcap, scale, ("log_probs",))[0]
    if mask is None:
        return logps.view(labels.shape)
    return logps.new_zeros(labels.shape).masked_scatter(mask, logps)  # keeps the graph, even with no position


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` now would run a layer under activation checkpointing
    (transformers drops ``past_key_values`` there, so a shared-context pass cannot be used)."""
    return any(module.training and getattr(module, "gradient_checkpointing", False) is True
               for module in model.modules())


def shared_context_logps(model: torch.nn.Module, contexts: Sequence[Sequence[int]],
                         responses: Sequence[Sequence[Sequence[int]]], pad_id: int,
                         device: torch.device | str = "cpu", per_token: bool = False) -> torch.Tensor:
    """Summed log-probs of ``K`` responses per context, each context run once.

    Pass 1 runs the left-padded contexts through the transformer body with ``use_cache=True``
    and keeps only the last position's hidden state (it predicts every response's first token).
    The cache is repeated ``K`` times along the batch, and pass 2 runs the right-padded
    responses, minus their last token (never an input), over it, positions continuing each
    context's. The log-probabilities come from the hidden states through :func:`head_logps`,
    never from ``(N·K, L, V)`` logits. Gradients flow through both
    passes, so a context's backward sums what its ``K`` responses send it: the same value and
    gradient as :func:`pack_responses` + :func:`response_logits` on each ``context + response``
    (up to float summation order; ``tests/trainer_client/model/test_forward.py``).

    Args:
        model: a causal LM taking ``past_key_values`` (not under activation checkpointing, see
            :func:`checkpointing_active`).
        contexts: ``N`` non-empty token-id lists.
        responses: per context, ``K`` non-empty response token-id lists (the same ``K`` for all).
        pad_id: padding token id.
        device: where the tensors go.
        per_token: return each response token's log-prob instead of their sum.

    Returns:
        ``(N, K)`` float: ``sum_j log p(response_j | context, response_<j)``; with
        ``per_token``, ``(N, K, L)`` float32, ``L`` the longest response, 0 past each response's end.

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

    body = transformer_body(model)
    first = body(input_ids=context_ids, attention_mask=context_mask, position_ids=context_positions, use_cache=True)
    # (N·K,) log p(first response token | context)
    logps = head_logps(model, first.last_hidden_state[:, -1:, :].repeat_interleave(k, dim=0), labels[:, :1])[:, 0]
    tokens = [logps[:, None]]
    if length > 1:
        cache = output_cache(first)
        cache.batch_repeat_interleave(k)
        inputs = labels[:, :-1]  # token j is input to predict token j + 1; the last is never an input
        input_mask = mask[:, :-1].long()
        lengths = context_mask.sum(-1).repeat_interleave(k)
        positions = lengths[:, None] + torch.arange(length - 1, device=labels.device)[None, :]
        attention_mask = torch.cat([context_mask.repeat_interleave(k, dim=0), input_mask], dim=1)
        rest = body(input_ids=inputs, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                    **{cache_argument(body): cache})
        # the responses' logits a vocabulary slice at a time (head_logps), never (N·K, L, V); only
        # at response tokens (a short chosen turn is padded to the rejected one's length)
        rest_logps = head_logps(model, rest.last_hidden_state, labels[:, 1:], mask[:, 1:])
        if per_token:
            tokens.append(rest_logps)
        else:
            logps = logps + rest_logps.sum(-1)
    return torch.cat(tokens, dim=1).view(n, k, length) if per_token else logps.view(n, k)


def response_hidden_after_prefix(model: torch.nn.Module, source: CapturedForward, rows: Sequence[int],
                                 prefix_ends: Sequence[int], prefix_lengths: Sequence[int],
                                 suffixes: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                                 pad_id: int) -> torch.Tensor | None:
    """Hidden states predicting each response after ``prefix + suffix``, the prefix's keys and
    values taken from an earlier forward instead of being recomputed.

    Row ``i``'s prefix is the ``prefix_lengths[i]`` tokens of ``source``'s row ``rows[i]`` that
    end at position ``prefix_ends[i]`` (exclusive). Hint distillation's teacher context is the policy's
    own context with a hint inserted near its end: everything before the insertion point was
    already run by the GRPO forward, so only ``suffix + response`` (hint, generation prompt,
    the erring turn: about a third of the tokens at the benchmark's sizes) is run again. The
    result is that of :func:`response_hidden` over ``pack_responses(prefix + suffix, response)``
    up to float summation order (attention with rotary positions depends on position
    differences only; ``tests/trainer_client/model/test_forward.py``). No gradient flows into the
    reused keys and values: call it under ``torch.no_grad()`` (the teacher side).

    Args:
        model: the model whose body produced ``source``.
        source: the captured forward; its ``cache`` must not be ``None``.
        rows, prefix_ends, prefix_lengths: per output row, the source row, where its prefix
            ends and how many tokens it has.
        suffixes: per output row, the non-empty token ids between the prefix and the response.
        responses: per output row, the non-empty response token ids.
        pad_id: padding token id.

    Returns:
        ``(N, L, H)`` right-aligned like :class:`ResponseBatch` (``L`` the longest response), or
        ``None`` where a prefix is not exactly the attended positions of its row before its
        end, in one run with consecutive positions (the source forward then saw another
        context; the caller runs the whole context instead).

    Raises:
        ValueError: mismatched lengths, an empty suffix or response, or ``source.cache`` is None.
    """
    n = len(rows)
    if source.cache is None:
        raise ValueError("the captured forward kept no cache")
    if not n or not (n == len(prefix_ends) == len(prefix_lengths) == len(suffixes) == len(responses)):
        raise ValueError(f"{n} rows, {len(prefix_ends)} prefix ends, {len(prefix_lengths)} prefix lengths, "
                         f"{len(suffixes)} suffixes, {len(responses)} responses")
    if any(not s for s in suffixes) or any(not r for r in responses):
        raise ValueError("every suffix and response must be non-empty")
    spans = []
    for row, end, length in zip(rows, prefix_ends, prefix_lengths, strict=True):
        first = end - length
        if length < 1 or first < 0 or int(source.attention_mask[row, :end].sum()) != length:
            return None
        positions = source.position_ids[row, first:end]
        if not (bool(source.attention_mask[row, first:end].all())
                and bool((positions == positions[0] + torch.arange(length, device=positions.device)).all())):
            return None
        spans.append((first, end, int(positions[-1]) + 1))
    width = max(end - first for first, end, _ in spans)
    device = source.hidden.device
    prefix_mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, (first, end, _) in enumerate(spans):
        prefix_mask[i, width - (end - first):] = 1
    caches = []
    for layer in source.cache.layers:
        keys = layer.keys.new_zeros((n, *layer.keys.shape[1:2], width, layer.keys.shape[-1]))
        values = layer.values.new_zeros((n, *layer.values.shape[1:2], width, layer.values.shape[-1]))
        for i, ((first, end, _), row) in enumerate(zip(spans, rows, strict=True)):
            keys[i, :, width - (end - first):] = layer.keys[row, :, first:end].detach()
            values[i, :, width - (end - first):] = layer.values[row, :, first:end].detach()
        caches.append((keys, values))
    inputs = [list(s) + list(r)[:-1] for s, r in zip(suffixes, responses, strict=True)]
    run = max(len(x) for x in inputs)
    input_ids = torch.full((n, run), pad_id, dtype=torch.long)
    input_mask = torch.zeros((n, run), dtype=torch.long)
    for i, tokens in enumerate(inputs):  # right-padded: each suffix starts right after its prefix
        input_ids[i, :len(tokens)] = torch.tensor(tokens)
        input_mask[i, :len(tokens)] = 1
    input_ids, input_mask = input_ids.to(device), input_mask.to(device)
    starts = torch.tensor([start for _, _, start in spans], device=device)
    position_ids = starts[:, None] + torch.arange(run, device=device)[None, :]
    body = transformer_body(model)
    hidden = body(input_ids=input_ids, attention_mask=torch.cat([prefix_mask, input_mask], dim=1),
                  position_ids=position_ids, use_cache=True,
                  **{cache_argument(body): DynamicCache(ddp_cache_data=caches)}).last_hidden_state
    length = max(len(r) for r in responses)
    out = hidden.new_zeros((n, length, hidden.shape[-1]))
    for i, (suffix, response) in enumerate(zip(suffixes, responses, strict=True)):
        # response token j is predicted from suffix position len(suffix) - 1 + j
        out[i, length - len(response):] = hidden[i, len(suffix) - 1: len(suffix) - 1 + len(response)]
    return out
