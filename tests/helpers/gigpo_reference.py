"""Reference implementation of GiGPO's Eq. 8 and of Eqs. 3, 5, 6, 7 and 8 end to end, for the tests.

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (arXiv 2505.10978).
The trainer does not call these (it combines the levels per debate turn in
:func:`trainer_client.credit.gigpo.gigpo_turn_values`); they stay here, built on the parts in
:mod:`trainer_client.credit.gigpo`, as the by-the-paper reference that ``test_gigpo.py`` checks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trainer_client.credit.gigpo import (
    NormMode,
    anchor_state_groups,
    discounted_returns,
    episode_advantages,
    step_advantages,
)

__all__ = ["GiGPOTrajectory", "combine", "gigpo_advantages"]


def combine(episode_adv: Sequence[float] | np.ndarray, step_adv: Sequence[float] | np.ndarray,
            step_trajectory: Sequence[int], omega: float = 1.0) -> np.ndarray:
    """Eq. 8: ``A = A^E[trajectory of the step] + ω·A^S``.

    Args:
        episode_adv: ``(N,)`` per-trajectory advantages.
        step_adv: ``(K,)`` per-step advantages.
        step_trajectory: ``(K,)`` the trajectory index (into ``episode_adv``) of each step.
        omega: weight of the step level.

    Returns:
        ``(K,)`` float32.

    Raises:
        ValueError: lengths differ, or a trajectory index out of range.
    """
    episode_adv = np.asarray(episode_adv, dtype=np.float64)
    step_adv = np.asarray(step_adv, dtype=np.float64)
    index = np.asarray(step_trajectory, dtype=np.int64)
    if index.shape != step_adv.shape:
        raise ValueError(f"{len(step_adv)} step advantages for {len(index)} trajectory indices")
    if len(index) and (index.min() < 0 or index.max() >= len(episode_adv)):
        raise ValueError("a step's trajectory index is out of range")
    return (episode_adv[index] + omega * step_adv).astype(np.float32)


@dataclass
class GiGPOTrajectory:
    """One rollout for :func:`gigpo_advantages`.

    Attributes:
        group_id: the prompt group.
        episode_return: the trajectory's total return ``R`` (Eq. 3).
        step_rewards: ``r_t`` per step (``None``: none given).
        step_observations: the observation of each step (anchor state, Eq. 6).
    """

    group_id: Hashable
    episode_return: float
    step_rewards: list[float | None] = field(default_factory=list)
    step_observations: list[str] = field(default_factory=list)


def gigpo_advantages(trajectories: Sequence[GiGPOTrajectory], omega: float = 1.0, gamma: float = 0.95,
                     mode: NormMode = "mean_norm", similarity_threshold: float | None = None,
                     step_reward_default: float = 0.0) -> list[np.ndarray]:
    """Eqs. 3, 5, 6, 7 and 8 together: per-step advantages of every trajectory.

    Returns:
        One float32 array per trajectory, of its number of steps.

    Raises:
        ValueError: a trajectory's rewards and observations differ in length, or as the parts.
    """
    for k, trajectory in enumerate(trajectories):
        if len(trajectory.step_rewards) != len(trajectory.step_observations):
            raise ValueError(f"trajectory {k}: {len(trajectory.step_rewards)} rewards for "
                             f"{len(trajectory.step_observations)} observations")
    a_e = episode_advantages([t.episode_return for t in trajectories], [t.group_id for t in trajectories], mode)
    returns, groups, observations, owner = [], [], [], []
    for k, trajectory in enumerate(trajectories):
        returns.extend(discounted_returns(trajectory.step_rewards, gamma, step_reward_default))
        groups.extend([trajectory.group_id] * len(trajectory.step_rewards))
        observations.extend(trajectory.step_observations)
        owner.extend([k] * len(trajectory.step_rewards))
    clusters = anchor_state_groups(groups, observations, similarity_threshold)
    a_s = step_advantages(np.asarray(returns, dtype=np.float64), clusters, mode)
    combined = combine(a_e, a_s, owner, omega)
    out, start = [], 0
    for trajectory in trajectories:
        n = len(trajectory.step_rewards)
        out.append(combined[start:start + n])
        start += n
    return out
