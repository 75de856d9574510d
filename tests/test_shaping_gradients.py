"""Shaped rewards must reach the loss: gradient checks on a tiny torch policy.

The policy is a linear layer over fixed random features giving per-token logits over a small
vocabulary; the loss is REINFORCE/GRPO-like, ``-(advantage * logp * mask).sum() / mask.sum()``,
with ``advantage`` and ``mask`` the ``(B, T)`` tensors from ``token_tensors``. If a strategy
that changes the rewards left the gradient norms unchanged, shaping would not be reaching
the loss.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_role_mapping import make_record

from trainer_client.role_mapping import (
    RoleSpan,
    build_role_items,
    group_normalize,
    resolve_item_values,
    shape_items,
    token_tensors,
    turn_values,
)
from trainer_client.shaping import (
    RewardShapingStrategy,
    create_strategy_from_config,
    get_strategy,
)

# Two prompts x four rollouts; records chosen so every non-identity strategy changes the
# per-role group-normalised advantages (see the comments for the verifier's first answer).
RECORDS = [
    make_record([False, True], [False, True], True),            # verifier fixed a wrong first answer
    make_record([True], [True], True),
    make_record([False], [True], None),                         # false accept
    make_record([True, False], [False, False], False),          # verifier broke a right first answer
    make_record([None, True], [False, True], True),             # first answer missing
    make_record([True], [None], True),                          # no verdict
    make_record([False, False, False], [False, False, False], None),
    make_record([None], [None], None),                          # nothing parsable
]
GROUP_IDS = [0] * 4 + [1] * 4
D, VOCAB = 8, 11


def make_spans() -> tuple[list[list[RoleSpan]], int]:
    """Turn k.t spans 2..4 tokens; a one-token gap (an observation) between turns."""
    rows = []
    for k, rec in enumerate(RECORDS):
        pos, row = 0, []
        for turn in rec.turns:
            length = 2 + (k + turn.t) % 3
            row.append(RoleSpan(turn=turn.t, role=turn.role, start=pos, end=pos + length))
            pos += length + 1
        rows.append(row)
    return rows, max(row[-1].end for row in rows) + 2  # + padding


SPANS, T = make_spans()
_gen = torch.Generator().manual_seed(1234)
FEATURES = torch.randn(len(RECORDS), T, D, generator=_gen)
ACTIONS = torch.randint(0, VOCAB, (len(RECORDS), T), generator=_gen)


def loss_inputs(strategy: RewardShapingStrategy | None, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, loss_mask), each (B, T), through the full path; ``None``: no shaping."""
    items = build_role_items(RECORDS, GROUP_IDS)
    raw = resolve_item_values(items.rewards, items.rewards, items.roles)
    values = raw if strategy is None else shape_items(strategy, items)
    if normalize:
        values = group_normalize(values, items.roles, items.group_ids)
    return token_tensors(SPANS, turn_values(items, values), T)


def grad_norms(advantages: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Train a fresh, identically initialised policy ``steps`` SGD steps; the grad norm of each."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(D, VOCAB)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    norms = []
    for _ in range(steps):
        optimizer.zero_grad()
        logp = torch.log_softmax(policy(FEATURES), dim=-1).gather(-1, ACTIONS.unsqueeze(-1)).squeeze(-1)
        loss = -(advantages * logp * mask).sum() / mask.sum()
        loss.backward()
        norms.append(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in policy.parameters()])))
        optimizer.step()
    return torch.stack(norms)


def assert_identity_matches_no_strategy(steps: int, normalize: bool) -> None:
    unshaped = grad_norms(*loss_inputs(None, normalize), steps)
    identity = grad_norms(*loss_inputs(create_strategy_from_config(None), normalize), steps)
    assert torch.all(unshaped > 1e-4)  # a real gradient, so equality is not vacuous
    assert torch.allclose(identity, unshaped, atol=1e-6, rtol=1e-5)


NON_IDENTITY = [
    (get_strategy("difference_rewards"), True),
    (get_strategy("reward_mixing", alpha=0.5), True),
    (get_strategy("potential_based", gamma=0.9, potential_type="has_parsable_answer"), True),
    # no π column: the empirical acceptance rate; group 1's verifiers all rejected, so π̂ = 0 and
    # A = G − Q̂(reject) = 0 there, where the group mean baseline leaves G − 0.5
    (get_strategy("coma_advantage"), True),
]


def assert_strategy_changes_gradients(strategy: RewardShapingStrategy, normalize: bool, steps: int) -> None:
    identity = grad_norms(*loss_inputs(get_strategy("identity"), normalize), steps)
    shaped = grad_norms(*loss_inputs(strategy, normalize), steps)
    assert not torch.allclose(shaped, identity, atol=1e-6, rtol=1e-5), strategy


@pytest.mark.parametrize("normalize", [True, False])
def test_identity_matches_no_strategy(normalize):
    assert_identity_matches_no_strategy(steps=2, normalize=normalize)


@pytest.mark.parametrize("strategy, normalize", NON_IDENTITY, ids=lambda x: getattr(x, "name", str(x)))
def test_non_identity_strategy_changes_gradients(strategy, normalize):
    assert_strategy_changes_gradients(strategy, normalize, steps=2)


def test_judge_tokens_carry_no_gradient():
    items = build_role_items(RECORDS, GROUP_IDS)
    per_turn = turn_values(items, shape_items(get_strategy("identity"), items))
    advantages, mask = token_tensors(SPANS, per_turn, T)
    judge_turns = [[s.turn for s in row if s.role.value == "judge"] for row in SPANS]
    poisoned = [np.where(np.isin(np.arange(len(v)), j), 100.0, v) for v, j in zip(per_turn, judge_turns, strict=True)]
    poisoned_adv, poisoned_mask = token_tensors(SPANS, poisoned, T)
    assert torch.equal(poisoned_mask, mask)
    torch.testing.assert_close(grad_norms(poisoned_adv, poisoned_mask, 1), grad_norms(advantages, mask, 1))
    for k, row in enumerate(SPANS):
        for span in row:
            assert bool(mask[k, span.start:span.end].any()) == (span.role.value != "judge")


@pytest.mark.slow
@pytest.mark.parametrize("normalize", [True, False])
def test_identity_matches_no_strategy_long(normalize):
    assert_identity_matches_no_strategy(steps=8, normalize=normalize)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, normalize", NON_IDENTITY, ids=lambda x: getattr(x, "name", str(x)))
def test_non_identity_strategy_changes_gradients_long(strategy, normalize):
    assert_strategy_changes_gradients(strategy, normalize, steps=8)
