"""The grpo_turn estimator: groups by (prompt, role, that role's k-th turn), hand-computed."""

from __future__ import annotations

import numpy as np
import pytest
from records import make_record, per_role_normalize

from trainer_client.credit.role_samples import build_role_samples, turn_group_values, turn_values


def test_turns_are_normalised_against_the_same_roles_turns_at_the_same_position() -> None:
    records = [
        make_record([True], [True], True, "r0"),                    # S V J
        make_record([False, True], [False, True], None, "r1"),      # S V S V J
        make_record([False, False], [False, False], None, "r2"),    # S V S V J
        make_record([True], [True], True, "r3"),                    # S V J       (prompt 1)
        make_record([False, False], [True, True], None, "r4"),      # S V S V J   (prompt 1)
    ]
    samples = build_role_samples(records, group_ids=[0, 0, 0, 1, 1])
    # shaped reward per (rollout, role): solver, verifier, judge
    shaped = np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], dtype=np.float32)
    values = turn_group_values(samples, shaped)
    # prompt 0, solver, 1st turns {1, 0, 0.5}: mean 0.5, std 0.5     -> ±0.5 / 0.5001
    # prompt 0, solver, 2nd turns {r1: 0, r2: 0.5}: mean 0.25, std √2/4 -> ∓0.25 / 0.353653
    # prompt 0, verifier, 1st turns {1, 0, 0}: mean 1/3, std √(1/3)    -> 2/3 and -1/3 over 0.577450
    # prompt 0, verifier, 2nd turns {0, 0}: no spread                   -> 0
    # prompt 1, solver, 1st turns {1, 0}: ±0.5 / 0.707207; 2nd turn: r4 alone -> its (prompt, role) value
    a, b, c, d = 0.5 / 0.5001, 0.25 / (np.sqrt(2) / 4 + 1e-4), (2 / 3) / (np.sqrt(1 / 3) + 1e-4), 0.5 / (np.sqrt(0.5) + 1e-4)
    expected = [[a, c, 0], [-a, -c / 2, -b, 0, 0], [0, -c / 2, b, 0, 0], [d, 0, 0], [-d, 0, -d, 0, 0]]
    for got, want in zip(values, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # grpo gives every turn of a role one value: r1's second solver turn would share its first's
    grpo = turn_values(samples, per_role_normalize(shaped, samples.roles, samples.group_ids))
    assert grpo[1][2] == pytest.approx(-a, rel=1e-5) and values[1][2] == pytest.approx(-b, rel=1e-5)


def test_without_scaling_the_turns_are_only_centred() -> None:
    records = [make_record([False, True], [False, True], None, "a"), make_record([True], [True], True, "b")]
    samples = build_role_samples(records, group_ids=[0, 0])
    shaped = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)
    values = turn_group_values(samples, shaped, scale=False)
    # 1st turns {0, 1}: ∓0.5; a's 2nd solver and verifier turns are alone: their (prompt, role) value -0.5
    np.testing.assert_allclose(values[0], [-0.5, -0.5, -0.5, -0.5, 0.0])
    np.testing.assert_allclose(values[1], [0.5, 0.5, 0.0])


def test_the_advantage_pipeline_spreads_the_turn_values_over_each_turns_tokens() -> None:
    from trainer_client.credit.pipeline import batch_advantages
    from trainer_client.credit.shaping import get_strategy
    from trainer_client.rollout.segments import Segment

    records = [make_record([False, True], [False, True], None, "a"), make_record([True], [True], True, "b")]
    segments = [[Segment.of(0, "solver", 0, 2), Segment.of(1, "verifier", 2, 4), Segment.of(2, "solver", 4, 6),
                 Segment.of(3, "verifier", 6, 8), Segment.of(4, "judge", 8, 9)],
                [Segment.of(0, "solver", 0, 3), Segment.of(1, "verifier", 3, 5), Segment.of(2, "judge", 5, 6)]]
    result = batch_advantages(records, 2, get_strategy("identity"), segments, 10, 0, scale=False, estimator="grpo_turn")
    # identity shaping: G = 1 for both; every group has no spread, so every turn gets 0 ...
    assert not result.advantages.any()
    records[1] = records[1].model_copy(update={"episode_reward": 0.0})
    result = batch_advantages(records, 2, get_strategy("identity"), segments, 10, 0, scale=False, estimator="grpo_turn")
    # ... with G = (1, 0): 1st turns ±0.5; a's 2nd solver and verifier turns alone: their (prompt, role) 0.5
    assert result.advantages[0].tolist() == [0.5] * 8 + [0.0, 0.0]
    assert result.advantages[1].tolist() == [-0.5] * 5 + [0.0] * 5
    assert result.loss_mask[0].tolist() == [True] * 8 + [False, False]  # judge tokens stay out
