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
from records import make_record, per_role_normalize

from trainer_client.credit.pipeline import token_tensors
from trainer_client.credit.role_samples import (
    build_role_samples,
    resolve_sample_values,
    shape_samples,
    turn_values,
)
from trainer_client.credit.shaping import (
    RewardShapingStrategy,
    create_strategy_from_config,
    get_strategy,
)
from trainer_client.rollout.segments import Segment

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


def make_segments() -> tuple[list[list[Segment]], int]:
    """Turn k.t spans 2..4 tokens; a one-token gap (an observation) between turns."""
    rows = []
    for k, rec in enumerate(RECORDS):
        pos, row = 0, []
        for turn in rec.turns:
            length = 2 + (k + turn.t) % 3
            row.append(Segment.of(turn=turn.t, role=turn.role, start=pos, end=pos + length))
            pos += length + 1
        rows.append(row)
    return rows, max(row[-1].end for row in rows) + 2  # + padding


SEGMENTS, T = make_segments()
_gen = torch.Generator().manual_seed(1234)
FEATURES = torch.randn(len(RECORDS), T, D, generator=_gen)
ACTIONS = torch.randint(0, VOCAB, (len(RECORDS), T), generator=_gen)


def loss_inputs(strategy: RewardShapingStrategy | None, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, loss_mask), each (B, T), through the full path; ``None``: no shaping."""
    samples = build_role_samples(RECORDS, GROUP_IDS)
    raw = resolve_sample_values(samples.rewards, samples.rewards, samples.roles)
    values = raw if strategy is None else shape_samples(strategy, samples)
    if normalize:
        values = per_role_normalize(values, samples.roles, samples.group_ids)
    return token_tensors(SEGMENTS, turn_values(samples, values), T)


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


def by_hand_advantages(strategy: RewardShapingStrategy, normalize: bool) -> torch.Tensor:
    """The ``(B, T)`` advantages written out independently of the library's path: the strategy's
    shaped value per (rollout, role) sample, ``(v − mean) / (std + 1e-4)`` per (group, role)
    with the Bessel-corrected std (TRL's convention; a group of one gets 0), put on every token
    of that role's turns; judge turns and gaps get 0."""
    samples = build_role_samples(RECORDS, GROUP_IDS)
    shaped = resolve_sample_values(shape_samples(strategy, samples), samples.rewards, samples.roles)
    value = dict(zip(samples.index, shaped.tolist(), strict=True))
    if normalize:
        groups: dict[tuple, list] = {}
        for (k, role), v in value.items():
            groups.setdefault((GROUP_IDS[k], role), []).append(((k, role), v))
        for members in groups.values():
            vs = np.array([v for _, v in members])
            for (key, v) in members:
                value[key] = 0.0 if len(vs) == 1 else (v - vs.mean()) / (vs.std(ddof=1) + 1e-4)
    out = torch.zeros(len(RECORDS), T)
    for k, row in enumerate(SEGMENTS):
        for segment in row:
            if segment.role.value != "judge":
                out[k, segment.start:segment.end] = value[(k, segment.role)]
    return out


def assert_strategy_changes_gradients(strategy: RewardShapingStrategy, normalize: bool, steps: int) -> None:
    """The shaped rewards reach the loss as the strategy defines them, and move it.

    Direction: every step's gradient norm equals that of the by-hand advantages (the loss sees
    exactly the strategy's values, token by token). Size: the first step's gradient moves by at
    least 5% of the identity gradient's norm, so the change is not a rounding artefact."""
    advantages, mask = loss_inputs(strategy, normalize)
    expected = by_hand_advantages(strategy, normalize)
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    shaped = grad_norms(advantages, mask, steps)
    torch.testing.assert_close(shaped, grad_norms(expected, mask, steps), atol=1e-6, rtol=1e-5)
    identity_advantages, _ = loss_inputs(get_strategy("identity"), normalize)
    delta = first_gradient(advantages, mask) - first_gradient(identity_advantages, mask)
    assert torch.linalg.vector_norm(delta) > 0.05 * torch.linalg.vector_norm(first_gradient(identity_advantages, mask)), \
        strategy


def first_gradient(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The flattened gradient of the first SGD step of :func:`grad_norms`' policy."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(D, VOCAB)
    logp = torch.log_softmax(policy(FEATURES), dim=-1).gather(-1, ACTIONS.unsqueeze(-1)).squeeze(-1)
    (-(advantages * logp * mask).sum() / mask.sum()).backward()
    return torch.cat([p.grad.flatten() for p in policy.parameters()])


@pytest.mark.parametrize("normalize", [True, False])
def test_identity_matches_no_strategy(normalize):
    assert_identity_matches_no_strategy(steps=2, normalize=normalize)


@pytest.mark.parametrize("strategy, normalize", NON_IDENTITY, ids=lambda x: getattr(x, "name", str(x)))
def test_non_identity_strategy_changes_gradients(strategy, normalize):
    assert_strategy_changes_gradients(strategy, normalize, steps=2)


def test_judge_tokens_carry_no_gradient():
    samples = build_role_samples(RECORDS, GROUP_IDS)
    per_turn = turn_values(samples, shape_samples(get_strategy("identity"), samples))
    advantages, mask = token_tensors(SEGMENTS, per_turn, T)
    judge_turns = [[s.turn for s in row if s.role.value == "judge"] for row in SEGMENTS]
    poisoned = [np.where(np.isin(np.arange(len(v)), j), 100.0, v) for v, j in zip(per_turn, judge_turns, strict=True)]
    poisoned_adv, poisoned_mask = token_tensors(SEGMENTS, poisoned, T)
    assert torch.equal(poisoned_mask, mask)
    torch.testing.assert_close(grad_norms(poisoned_adv, poisoned_mask, 1), grad_norms(advantages, mask, 1))
    for k, row in enumerate(SEGMENTS):
        for segment in row:
            assert bool(mask[k, segment.start:segment.end].any()) == (segment.role.value != "judge")


@pytest.mark.slow
@pytest.mark.parametrize("normalize", [True, False])
def test_identity_matches_no_strategy_long(normalize):
    assert_identity_matches_no_strategy(steps=8, normalize=normalize)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, normalize", NON_IDENTITY, ids=lambda x: getattr(x, "name", str(x)))
def test_non_identity_strategy_changes_gradients_long(strategy, normalize):
    assert_strategy_changes_gradients(strategy, normalize, steps=8)
