"""The trainer's fast paths compute what the plain paths compute.

Trace-replay DPO scores chosen and rejected with their shared context run once
(``forward.shared_context_logps``: one pass over the context, its KV cache repeated for both
turns); the plain path runs one ``context + turn`` row per side. Values and gradients must
agree within float error on a tiny random Qwen2 model, with contexts and turns of different
lengths (left- and right-padding in play).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer_client.losses.functional import dpo_sigmoid_loss, sequence_logps
from trainer_client.losses.trace_replay import replay_pair_logps
from trainer_client.model.forward import (
    checkpointing_active,
    pack_responses,
    response_hidden,
    response_hidden_after_prefix,
    response_logits,
    shared_context_logps,
)
from trainer_client.trl_compat import capture_body_forward

VOCAB = 97


@pytest.fixture(scope="module")
def qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    model = Qwen2ForCausalLM(config)
    model.train()  # dropout is 0 in Qwen2Config; training mode is what the DPO term runs in
    return model


def random_pairs(n: int, seed: int = 0) -> list[SimpleNamespace]:
    rng = random.Random(seed)

    def ids(lo: int, hi: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(rng.randint(lo, hi))]

    pairs = [SimpleNamespace(episode_id=f"e{i}", t=0, has_token_ids=True, context_ids=ids(5, 40),
                             chosen_ids=ids(1, 12), rejected_ids=ids(1, 12)) for i in range(n)]
    pairs[0].chosen_ids = [7]  # a one-token turn: only the context's last position predicts it
    pairs[1].context_ids = [11]  # a one-token context
    return pairs


def dpo_value_and_grads(model: torch.nn.Module, pairs: list[SimpleNamespace], shared: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    chosen, rejected = replay_pair_logps(model, pairs, pad_token_id=0, max_completion_length=64, device="cpu",
                                         shared_context=shared)
    ref = torch.linspace(-60.0, -20.0, len(pairs))
    loss = dpo_sigmoid_loss(chosen, rejected, ref, ref.flip(0), beta=0.1)
    torch.autograd.backward(loss)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return torch.stack([chosen, rejected]).detach(), loss.detach(), grads


def test_shared_context_dpo_logps_and_gradients_equal_the_plain_paths(qwen2: torch.nn.Module) -> None:
    pairs = random_pairs(5)
    logps_fast, loss_fast, grads_fast = dpo_value_and_grads(qwen2, pairs, shared=True)
    logps_plain, loss_plain, grads_plain = dpo_value_and_grads(qwen2, pairs, shared=False)
    torch.testing.assert_close(logps_fast, logps_plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss_fast, loss_plain, rtol=0, atol=1e-6)
    assert grads_fast.keys() == grads_plain.keys() and len(grads_fast) == len(list(qwen2.parameters()))
    for name in grads_plain:
        torch.testing.assert_close(grads_fast[name], grads_plain[name], rtol=0, atol=1e-5, msg=name)
    assert grads_plain["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0  # the context's backward counts


def test_shared_context_logps_equal_each_sequence_scored_alone(qwen2: torch.nn.Module) -> None:
    """Against the definition: each ``context + response`` alone, no padding, full logits."""
    pairs = random_pairs(3, seed=1)
    with torch.no_grad():
        fast = shared_context_logps(qwen2, [p.context_ids for p in pairs],
                                    [[p.chosen_ids, p.rejected_ids] for p in pairs], pad_id=0)
        for i, pair in enumerate(pairs):
            for j, response in enumerate((pair.chosen_ids, pair.rejected_ids)):
                logits = qwen2(input_ids=torch.tensor([pair.context_ids + response])).logits[0]
                steps = torch.log_softmax(logits[len(pair.context_ids) - 1: -1], dim=-1)
                alone = steps.gather(-1, torch.tensor(response)[:, None]).sum()
                torch.testing.assert_close(fast[i, j], alone, rtol=0, atol=1e-5)


def test_shared_context_equals_packed_rows_under_no_grad(qwen2: torch.nn.Module) -> None:
    """How reference log-probs are taken (no grad): the same numbers as the packed rows."""
    pairs = random_pairs(4, seed=2)
    contexts = [p.context_ids for p in pairs for _ in (0, 1)]
    responses = [r for p in pairs for r in (p.chosen_ids, p.rejected_ids)]
    with torch.no_grad():
        batch = pack_responses(contexts, responses, 0)
        plain = sequence_logps(response_logits(qwen2, batch), batch.labels, batch.mask).view(-1, 2)
        fast = shared_context_logps(qwen2, [p.context_ids for p in pairs],
                                    [[p.chosen_ids, p.rejected_ids] for p in pairs], pad_id=0)
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-5)


def test_activation_checkpointing_falls_back_to_the_plain_path(qwen2: Qwen2ForCausalLM) -> None:
    """transformers drops ``past_key_values`` in checkpointed layers: the shared path is skipped there."""
    pairs = random_pairs(3, seed=3)
    assert not checkpointing_active(qwen2)
    with torch.no_grad():
        expected = torch.stack(replay_pair_logps(qwen2, pairs, pad_token_id=0, max_completion_length=64, device="cpu",
                                                 shared_context=False))
    # transformers 5.23 renamed gradient_checkpointing_enable (5.17, the vLLM environment's, has only that)
    (getattr(qwen2, "activation_checkpointing_enable", None) or qwen2.gradient_checkpointing_enable)()
    try:
        assert checkpointing_active(qwen2)
        chosen, rejected = replay_pair_logps(qwen2, pairs, pad_token_id=0, max_completion_length=64, device="cpu")
    finally:
        (getattr(qwen2, "activation_checkpointing_disable", None) or qwen2.gradient_checkpointing_disable)()
    assert not checkpointing_active(qwen2)
    torch.testing.assert_close(torch.stack([chosen, rejected]).detach(), expected, rtol=0, atol=1e-5)


def test_shared_context_logps_rejects_bad_input(qwen2: torch.nn.Module) -> None:
    with pytest.raises(ValueError):
        shared_context_logps(qwen2, [], [], pad_id=0)
    with pytest.raises(ValueError):
        shared_context_logps(qwen2, [[1, 2]], [[]], pad_id=0)
    with pytest.raises(ValueError):
        shared_context_logps(qwen2, [[1, 2], [3]], [[[4]], [[5], [6]]], pad_id=0)
    with pytest.raises(ValueError):
        shared_context_logps(qwen2, [[1, 2]], [[[4], []]], pad_id=0)


def policy_batch(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Three left-padded rows of different lengths, as TRL's GRPO forward gets them."""
    rng = random.Random(seed)
    rows = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (30, 22, 27)]
    width = max(len(r) for r in rows)
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return input_ids, mask, rows


def test_teacher_after_a_reused_prefix_equals_the_whole_hinted_context(qwen2: Qwen2ForCausalLM) -> None:
    """Hint distillation's teacher: prefix from the GRPO forward's cache + suffix run anew equals
    running ``prefix + suffix + response`` from scratch (rows of different widths and pads)."""
    input_ids, mask, rows = policy_batch()
    width = input_ids.shape[1]
    with capture_body_forward(qwen2) as captured:
        qwen2(input_ids=input_ids, attention_mask=mask, use_cache=False)  # as TRL 1.16 calls it: no position_ids
    assert len(captured) == 1 and captured[0].cache is not None
    # row 0 keeps its first 20 tokens, row 1 all 22, row 2 twice (12 and 25 tokens)
    sites = [(0, 20), (1, 22), (2, 12), (2, 25)]
    suffixes = [[5, 6, 7], [8], [9, 10, 11, 12], [13, 14]]
    responses = [[20, 21, 22, 23, 24], [30], [40, 41, 42], [50, 51, 52, 53, 54, 55, 56]]
    prefix_ends = [width - len(rows[row]) + kept for row, kept in sites]
    with torch.no_grad():
        reused = response_hidden_after_prefix(qwen2, captured[0], [row for row, _ in sites], prefix_ends,
                                              [kept for _, kept in sites], suffixes, responses, pad_id=0)
        whole = response_hidden(qwen2, pack_responses([rows[row][:kept] + suffix for (row, kept), suffix
                                                       in zip(sites, suffixes, strict=True)], responses, pad_id=0))
    assert reused is not None and reused.shape == whole.shape == (4, 7, 32)
    batch_mask = pack_responses([[1]] * 4, responses, pad_id=0).mask
    assert torch.allclose(reused[batch_mask], whole[batch_mask], atol=1e-5)
    assert not reused[~batch_mask].any()  # zeros before shorter responses, like ResponseBatch


def test_reused_prefix_is_refused_where_the_policy_saw_another_context(qwen2: Qwen2ForCausalLM) -> None:
    input_ids, mask, rows = policy_batch()
    width = input_ids.shape[1]
    mask[0, width - 5] = 0  # a masked token inside row 0's prefix: its neighbours never attended to it
    with capture_body_forward(qwen2) as captured:
        qwen2(input_ids=input_ids, attention_mask=mask, use_cache=True)
    args = ([[5]], [[1, 2]])  # suffixes, responses
    with torch.no_grad():
        assert response_hidden_after_prefix(qwen2, captured[0], [0], [width], [len(rows[0]) - 1], *args, pad_id=0) is None
        # a prefix that leaves out attended tokens before it is another context too
        assert response_hidden_after_prefix(qwen2, captured[0], [1], [width], [10], *args, pad_id=0) is None
        assert response_hidden_after_prefix(qwen2, captured[0], [1], [width], [len(rows[1])], *args, pad_id=0) is not None
    with capture_body_forward(qwen2, keep_cache=False) as captured:
        qwen2(input_ids=input_ids, attention_mask=mask, use_cache=False)
    assert captured[0].cache is None  # nothing to reuse: the caller runs the whole context
    with pytest.raises(ValueError, match="no cache"):
        response_hidden_after_prefix(qwen2, captured[0], [1], [width], [3], *args, pad_id=0)
