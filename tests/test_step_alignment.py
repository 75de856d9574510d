"""The aligner: step outputs -> steps by assistant turn index."""

from __future__ import annotations

import pytest

from trainer_client.reward_functions import EvaluateResult, StepData, StepOutput
from trainer_client.step_alignment import StepAlignmentWarning, align_step_rewards, fill_default


def steps(n: int, acted: int | None = None) -> list[StepData]:
    acted = n if acted is None else acted
    return [StepData(step_index=t, step_info={"assistant_turn_index": t} if t < acted else {}) for t in range(n)]


def result(*outputs: tuple, score: float = 0.7) -> EvaluateResult:
    return EvaluateResult(score=score, step_outputs=[StepOutput(step_index=i, base_reward=r) for i, r in outputs])


def test_matched_indices_fill_rewards_and_the_score_is_kept() -> None:
    aligned = align_step_rewards(steps(3), result((0, 1.0), ("2", 0.5)))
    assert [s.base_reward for s in aligned.steps] == [1.0, None, 0.5]
    assert (aligned.score, aligned.matched, aligned.warnings) == (0.7, 2, [])


def test_unmatched_index_warns_and_is_ignored() -> None:
    # step 2 is a forfeited turn: no assistant_turn_index
    with pytest.warns(StepAlignmentWarning, match="matches no step"):
        aligned = align_step_rewards(steps(3, acted=2), result((2, 1.0), ("x", 1.0), (0, 0.25)))
    assert [s.base_reward for s in aligned.steps] == [0.25, None, None]
    assert len(aligned.warnings) == 2


def test_duplicate_index_keeps_the_first() -> None:
    with pytest.warns(StepAlignmentWarning, match="duplicate"):
        aligned = align_step_rewards(steps(2), result((1, 1.0), ("1", 0.0)))
    assert [s.base_reward for s in aligned.steps] == [None, 1.0]


def test_no_step_outputs_leaves_every_reward_none_then_default_applies() -> None:
    aligned = align_step_rewards(steps(2), EvaluateResult(score=1.0))
    assert [s.base_reward for s in aligned.steps] == [None, None] and aligned.matched == 0
    assert [s.base_reward for s in fill_default(aligned.steps, -0.5)] == [-0.5, -0.5]
