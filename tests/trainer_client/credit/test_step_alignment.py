"""The aligner: step outputs -> steps by assistant turn index."""

from __future__ import annotations

import pytest

from trainer_client.credit.reward_functions import EvaluateResult, StepData, StepOutput
from trainer_client.credit.step_alignment import StepAlignmentWarning, align_step_rewards, fill_default


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


def test_an_output_naming_an_unplaced_message_is_reported_with_the_reason() -> None:
    # assistant message 1 was a rejected call: steps carry indices 0 and 2
    two = [StepData(step_index=0, step_info={"assistant_turn_index": 0}),
           StepData(step_index=1, step_info={"assistant_turn_index": 2})]
    reason = "produced no debate turn (a rejected tool call)"
    with pytest.warns(StepAlignmentWarning, match="a rejected tool call"):
        aligned = align_step_rewards(two, result((0, 1.0), (1, 9.0), (2, 0.5)), unplaced={1: reason})
    assert [s.base_reward for s in aligned.steps] == [1.0, 0.5] and aligned.matched == 2
    assert aligned.warnings == [f"step output 1 names an assistant message that {reason}"]


def test_unmatched_messages_report_every_output_and_fill_nothing() -> None:
    with pytest.warns(StepAlignmentWarning, match="ignored: no messages"):
        aligned = align_step_rewards(steps(2, acted=0), result((0, 1.0), (1, 1.0)), unmatched="no messages")
    assert [s.base_reward for s in aligned.steps] == [None, None] and len(aligned.warnings) == 2
