"""Failed rollouts leave their groups (issue 45): zero advantage, out of the loss, their group
normalised over the rest (as if they had never been sampled), a group a failure left with one
scored rollout gives nothing, and the shuffled control never moves a failed rollout's reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.credit.debate_metrics import scored_only, unfinished_rate, without_dropped
from trainer_client.credit.pipeline import batch_advantages, drop_failed_rollouts
from trainer_client.credit.shaping import get_strategy
from trainer_client.rollout.segments import Segment, SegmentOwner

T = 5


def _record(reward: float, episode_id: str) -> EpisodeRewards:
    """A graded single-answer episode (the solver's one turn is the outcome)."""
    correct = reward == 1.0
    facts = CounterfactualFacts(
        first_answer_correct=correct, last_solver_answer_correct=correct, final_answer_correct=correct,
        judge_correct=None, verifier_accepted=False, rounds=1,
        local_rewards={Role.SOLVER: reward}, rewards_without_role={Role.SOLVER: 0.0})
    return EpisodeRewards(episode_id=episode_id, problem_id="p", episode_reward=reward, graded_at=0.0, facts=facts,
                          turns=[TurnReward(t=0, role=Role.SOLVER, reward=reward, correct=correct, answer="1")])


def _segments(n: int) -> list[list[Segment]]:
    return [[Segment(1, T, SegmentOwner(0, Role.SOLVER, True))] for _ in range(n)]


def test_failed_rollouts_get_their_own_group_and_lonely_survivors_are_dropped() -> None:
    groups = [0, 0, 0, 0, 1, 1, 2, 2, 3]
    failed = [True, False, False, False, False, True, False, False, False]
    drop = drop_failed_rollouts(groups, failed)
    # group 0 keeps three; group 1 keeps one rollout: no baseline, dropped; group 2 had no failure;
    # group 3 is alone without a failure: left as it was (what it gives is the estimator's rule)
    assert drop.dropped == (True, False, False, False, True, True, False, False, False)
    assert drop.group_ids == (-1, 0, 0, 0, -5, -6, 2, 2, 3)
    assert drop.metrics == {"rollouts/failed": 2.0, "rollouts/dropped": 3.0}
    assert drop_failed_rollouts(groups, [False] * 9).group_ids == tuple(groups)
    with pytest.raises(ValueError, match="group ids"):
        drop_failed_rollouts([0, 1], [False])
    with pytest.raises(ValueError, match="non-negative"):
        drop_failed_rollouts([-1], [False])


@pytest.mark.parametrize("estimator", ["grpo", "grpo_turn"])
def test_a_groups_advantages_are_those_of_the_batch_without_its_failed_rollouts(estimator: str) -> None:
    """Batch of 3 prompts x 4 rollouts. Rollout 1 failed (reward 1, on a forfeit it never made);
    in prompt 2, three failed. The others' advantages equal those of the same pipeline on the
    batch where the failed rollouts were never sampled (prompt 0 with three rollouts, prompt 1
    as is, prompt 2 gone); the dropped rows are 0 and out of the loss."""
    rewards = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    failed = [False, True, False, False, False, False, False, False, True, False, True, True]
    records = [_record(r, f"e{k}") for k, r in enumerate(rewards)]
    result = batch_advantages(records, 4, get_strategy("identity"), _segments(12), T, 0, failed=failed,
                              estimator=estimator)
    assert result.dropped == (False, True, False, False, False, False, False, False, True, True, True, True)
    assert result.metrics["rollouts/failed"] == 4.0 and result.metrics["rollouts/dropped"] == 5.0
    # the reference: GRPO's (v - mean) / (std + 1e-4) (Bessel-corrected, TRL's) over the scored
    # rollouts alone: prompt 0 has three left, prompt 1 four
    kept = [0, 2, 3, 4, 5, 6, 7]
    groups = [0, 0, 0, 1, 1, 1, 1]
    values = np.array([rewards[k] for k in kept])
    expected = np.zeros(7)
    for g in set(groups):
        idx = [i for i, gid in enumerate(groups) if gid == g]
        expected[idx] = (values[idx] - values[idx].mean()) / (values[idx].std(ddof=1) + 1e-4)
    torch.testing.assert_close(result.advantages[kept, 1:], torch.tensor(expected, dtype=torch.float32)[:, None]
                               .expand(-1, T - 1))
    assert result.loss_mask[kept, 1:].all()
    dropped = [1, 8, 9, 10, 11]
    assert not result.loss_mask[dropped].any() and not result.advantages[dropped].any()
    assert result.advantages[kept].abs().sum() > 0  # a batch with signal


def test_the_shuffled_control_never_gives_a_failed_rollouts_reward_to_another() -> None:
    """Only the failed rollout has reward 1: however the scored rewards are permuted, every
    scored rollout keeps reward 0 (so advantage 0); shuffling the whole batch would not."""
    rewards = [0.0] * 8
    rewards[5] = 1.0
    failed = [k == 5 for k in range(8)]
    records = [_record(r, f"e{k}") for k, r in enumerate(rewards)]
    for seed in range(6):
        result = batch_advantages(records, 4, get_strategy("identity"), _segments(8), T, 0, failed=failed,
                                  shuffle_seed=seed)
        assert not result.advantages.any() and float(result.samples.rewards.sum()) == 1.0  # it stayed on rollout 5
        assert result.samples.rewards[5] == 1.0
    leaked = [batch_advantages(records, 4, get_strategy("identity"), _segments(8), T, 0, shuffle_seed=seed)
              for seed in range(6)]
    assert any(r.advantages.any() for r in leaked)  # without the flags the reward does move


def test_metrics_and_channels_see_only_what_stays() -> None:
    records = [_record(float(k % 2), f"e{k}") for k in range(4)]
    failed = [False, True, False, False]
    result = batch_advantages(records, 4, get_strategy("identity"), _segments(4), T, 0, failed=failed)
    samples, shaped, scored = scored_only(result.samples, result.shaped, records, failed)
    assert [r.episode_id for r in scored] == ["e0", "e2", "e3"]
    assert [k for k, _ in samples.index] == [0, 2, 3] and shaped.shape == (3,)
    assert samples.rewards.tolist() == [0.0, 0.0, 1.0]
    assert scored_only(result.samples, result.shaped, records, [False] * 4)[2] == records
    assert unfinished_rate([True, True, False, False], failed) == {"debate/unfinished_rate": pytest.approx(1 / 3)}
    assert unfinished_rate([True], [True]) == {}
    # this process holds rollouts 2-3 of the gathered batch
    assert without_dropped(["a", "b"], (False, False, True, False), 2) == [None, "b"]
    assert without_dropped(["a", "b"], (), 0) == ["a", "b"]
