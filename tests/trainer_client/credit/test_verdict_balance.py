"""Class-balanced verdict credit (RL Tango's inverse class frequency), computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
from records import make_record

from trainer_client.credit.verdict_balance import balance_verdict_credit, verdict_class_weights


def test_weights_by_hand() -> None:
    # verifier turns: three review a right answer, one a wrong answer (N = 4, K = 2)
    records = [make_record([True], [True], True, "a"), make_record([True], [False], True, "b"),
               make_record([True], [None], True, "c"), make_record([False], [False], True, "d")]
    weights = verdict_class_weights(records)
    assert weights == pytest.approx({True: 4 / (2 * 3), False: 4 / (2 * 1)})
    assert 3 * weights[True] + 1 * weights[False] == pytest.approx(4)  # mean weight 1
    # one class only: its weight is 1
    assert verdict_class_weights(records[:2]) == pytest.approx({True: 1.0})
    assert verdict_class_weights([]) == {}


def test_only_verifier_turns_are_weighted_and_a_dropped_rollout_neither_counts_nor_changes() -> None:
    records = [make_record([True], [True], True, "a"), make_record([True], [False], True, "b"),
               make_record([False, True], [False, True], True, "c"), make_record([False], [False], True, "d")]
    # per rollout, per turn t: solver, verifier, (solver, verifier,) judge
    per_turn = [np.array([0.5, 1.0, 0.0], dtype=np.float32), np.array([0.5, -1.0, 0.0], dtype=np.float32),
                np.array([-0.5, 2.0, 0.25, 0.5, 0.0], dtype=np.float32), np.array([9.0, 9.0, 0.0], dtype=np.float32)]
    dropped = [False, False, False, True]
    weighted, metrics = balance_verdict_credit(records, per_turn, dropped)
    # counted (d dropped): right reviews a, b, c's second = 3; wrong reviews c's first = 1 -> w_right 2/3, w_wrong 2
    w_right, w_wrong = 4 / 6, 4 / 2
    assert metrics == pytest.approx({"credit/verdict_weight/right": w_right, "credit/verdict_weight/wrong": w_wrong})
    np.testing.assert_allclose(weighted[0], [0.5, 1.0 * w_right, 0.0], rtol=1e-6)
    np.testing.assert_allclose(weighted[1], [0.5, -1.0 * w_right, 0.0], rtol=1e-6)
    np.testing.assert_allclose(weighted[2], [-0.5, 2.0 * w_wrong, 0.25, 0.5 * w_right, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(weighted[3], per_turn[3])
    assert all(w.dtype == np.float32 for w in weighted)
    np.testing.assert_array_equal(per_turn[0], [0.5, 1.0, 0.0])  # the input is left as it was
    with pytest.raises(ValueError, match="records"):
        balance_verdict_credit(records, per_turn[:2], dropped)


def test_the_pipeline_weights_only_the_verifier_tokens() -> None:
    """``batch_advantages(..., verdict_balance="batch")``: the verifier's tokens carry the weighted
    advantage, every other token the same as without it; an unknown setting is refused."""
    from trainer_client.credit.pipeline import batch_advantages
    from trainer_client.credit.shaping import get_strategy
    from trainer_client.rollout.segments import Segment

    # three right first answers, one wrong: w_right = 4 / (2 * 3), w_wrong = 4 / (2 * 1)
    records = [make_record([True], [True], True, "a"), make_record([True], [False], False, "b"),
               make_record([True], [True], True, "c"), make_record([False], [False], False, "d")]
    segments = [[Segment.of(0, "solver", 0, 2), Segment.of(1, "verifier", 2, 4), Segment.of(2, "judge", 4, 5)]
                for _ in records]
    strategy = get_strategy("own_outcome")
    plain = batch_advantages(records, 4, strategy, segments, 6, 0, scale=False)
    balanced = batch_advantages(records, 4, strategy, segments, 6, 0, scale=False, verdict_balance="batch")
    weights = [4 / 6, 4 / 6, 4 / 6, 4 / 2]
    for k, w in enumerate(weights):
        np.testing.assert_allclose(balanced.advantages[k, 2:4].numpy(), plain.advantages[k, 2:4].numpy() * w, rtol=1e-6)
        np.testing.assert_array_equal(balanced.advantages[k, :2].numpy(), plain.advantages[k, :2].numpy())
    assert plain.advantages[:, 2:4].abs().sum() > 0  # the verifier's verdicts differ: there is credit to weight
    assert balanced.metrics["credit/verdict_weight/wrong"] == pytest.approx(2.0)
    assert "credit/verdict_weight/wrong" not in plain.metrics
    with pytest.raises(ValueError, match="verdict_balance"):
        batch_advantages(records, 4, strategy, segments, 6, 0, verdict_balance="running")
