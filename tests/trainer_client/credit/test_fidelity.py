"""Credit fidelity (``credit/fidelity/<role>``): the share of a role's turns whose advantage sign
agrees with the turn's own outcome, computed by hand, and through the real reward pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from records import make_record

from trainer_client.credit.fidelity import credit_fidelity


def test_fidelity_by_hand() -> None:
    # four one-round debates: (solver right?, verifier said CORRECT?, judge right?)
    records = [make_record([True], [True], True), make_record([False], [False], True),
               make_record([False], [True], False), make_record([True], [False], False)]
    # turns: solver t0, verifier t1, judge t2; verifier right in debates 0 and 1
    advantages = [np.array([0.8, 0.5, 9.0]), np.array([0.8, 0.5, 9.0]), np.array([-0.8, 0.0, 9.0]),
                  np.array([-0.8, -0.5, 9.0])]
    metrics = credit_fidelity(records, advantages)
    # solver: + on right (agree), + on wrong (disagree), - on wrong (agree), - on right (disagree)
    assert metrics["credit/fidelity/solver"] == pytest.approx(0.5)
    assert metrics["credit/signal/solver"] == pytest.approx(1.0)
    # verifier: + right (agree), + right (agree), 0 (no sign), - wrong (agree)
    assert metrics["credit/fidelity/verifier"] == pytest.approx(1.0)
    assert metrics["credit/signal/verifier"] == pytest.approx(0.75)
    assert not any("judge" in key for key in metrics)
    with pytest.raises(ValueError):
        credit_fidelity(records, advantages[:3])


def test_identity_credit_rewards_a_repaired_slip_and_own_outcome_does_not() -> None:
    """One prompt, four rollouts: the solver right twice; the debate repairs one wrong answer
    (G = 1) and breaks one right answer (G = 0). Through ``batch_advantages`` (the trainer's
    pipeline), the solver's fidelity is 0.5 under identity and 1.0 under own_outcome."""
    from trainer_client.credit.pipeline import batch_advantages
    from trainer_client.credit.shaping import get_strategy
    from trainer_client.rollout.segments import Segment

    records = [make_record([True], [True], True), make_record([False], [False], True),
               make_record([True], [False], False), make_record([False], [True], False)]
    segments = [[Segment.of(0, "solver", 0, 4), Segment.of(1, "verifier", 4, 8), Segment.of(2, "judge", 8, 10)]] * 4
    figures = {}
    for name in ("identity", "own_outcome"):
        result = batch_advantages(records, 4, get_strategy(name), segments, 10, 0)
        figures[name] = result.metrics
    assert figures["identity"]["credit/fidelity/solver"] == pytest.approx(0.5)
    assert figures["own_outcome"]["credit/fidelity/solver"] == pytest.approx(1.0)
    assert figures["own_outcome"]["credit/fidelity/verifier"] == pytest.approx(1.0)
