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

from trainer_client.forward import checkpointing_active, pack_responses, response_logits, shared_context_logps
from trainer_client.losses import dpo_sigmoid_loss, sequence_logps
from trainer_client.trainer import replay_pair_logps

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
    qwen2.activation_checkpointing_enable()
    try:
        assert checkpointing_active(qwen2)
        chosen, rejected = replay_pair_logps(qwen2, pairs, pad_token_id=0, max_completion_length=64, device="cpu")
    finally:
        qwen2.activation_checkpointing_disable()  # type: ignore[no-untyped-call]  # transformers 5.23 leaves it unannotated
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
