"""GiGPO (Feng et al. 2025, arXiv 2505.10978) on hand-computed batches, equation by equation."""

from __future__ import annotations

import numpy as np
import pytest
from gigpo_reference import GiGPOTrajectory, combine, gigpo_advantages

from trainer_client.credit.gigpo import anchor_state_groups, discounted_returns, episode_advantages, step_advantages


def test_eq3_episode_advantages_both_modes() -> None:
    returns, groups = [1.0, 0.0, 1.0, 0.0, 3.0, 3.0, 5.0], [0, 0, 0, 0, 1, 1, 2]
    # group 0 mean 0.5; group 1 has zero spread; group 2 is alone: it keeps its return (verl-agent:
    # mean 0, std 1 for a lone trajectory; the paper is silent)
    np.testing.assert_allclose(episode_advantages(returns, groups, "mean_norm"), [0.5, -0.5, 0.5, -0.5, 0, 0, 5])
    # Bessel-corrected std of group 0: sqrt(4 * 0.25 / 3) = 0.57735 -> ±0.5 / 0.57735 = ±0.86603;
    # zero std -> 0; the lone trajectory 5 / (1 + 1e-6)
    third = 0.5 / np.sqrt(1 / 3)
    np.testing.assert_allclose(episode_advantages(returns, groups, "mean_std_norm"),
                               [third, -third, third, -third, 0, 0, 5], atol=1e-5)
    assert episode_advantages(returns, groups).dtype == np.float32
    with pytest.raises(ValueError):
        episode_advantages(returns, groups, "median")


def test_eq5_discounted_returns() -> None:
    np.testing.assert_allclose(discounted_returns([1, 0, 1], 1.0), [2, 1, 1])
    np.testing.assert_allclose(discounted_returns([1, 0, 1], 0.5), [1.25, 0.5, 1])  # 1 + .5·(0 + .5·1)
    np.testing.assert_allclose(discounted_returns([None, 2.0], 0.5, default=1.0), [2.0, 2.0])
    with pytest.raises(ValueError):
        discounted_returns([1.0], 1.5)


def test_eq6_identical_observations_cluster_within_a_group_only() -> None:
    ids = anchor_state_groups([0, 0, 0, 1, 1], ["s0", "s1", "s0", "s0", "s0"])
    assert ids[0] == ids[2] and ids[0] != ids[1]
    assert ids[3] == ids[4] and ids[3] != ids[0]  # same text, other prompt group


def test_eq6_similarity_threshold() -> None:
    obs = ["the answer is 41", "the answer is 42", "something else entirely"]
    assert len(set(anchor_state_groups([0, 0, 0], obs))) == 3
    ids = anchor_state_groups([0, 0, 0], obs, similarity_threshold=0.9)
    assert ids[0] == ids[1] != ids[2]
    with pytest.raises(ValueError):
        anchor_state_groups([0], ["a"], similarity_threshold=0)


def test_eq7_step_advantages_with_singletons() -> None:
    # cluster 7: returns 2 and 0 -> ±1; cluster 9: singleton -> 0 (verl-agent: its own value is the mean)
    np.testing.assert_allclose(step_advantages([2.0, 0.0, 5.0], [7, 7, 9]), [1, -1, 0])
    # Bessel-corrected std of {2, 0} is sqrt(2) -> ±1 / sqrt(2)
    np.testing.assert_allclose(step_advantages([2.0, 0.0, 5.0], [7, 7, 9], "mean_std_norm"),
                               [1 / np.sqrt(2), -1 / np.sqrt(2), 0], atol=1e-5)


def test_eq8_combination() -> None:
    np.testing.assert_allclose(combine([0.5, -0.5], [1.0, -1.0, 0.0], [0, 1, 1], omega=0.5), [1.0, -1.0, -0.5])
    with pytest.raises(ValueError):
        combine([0.5], [1.0], [3])


def test_all_equations_end_to_end_by_hand() -> None:
    # Group A: two rollouts share the first observation, then diverge; group B: one rollout.
    a1 = GiGPOTrajectory("A", 1.0, [0.0, 1.0], ["start", "after x"])
    a2 = GiGPOTrajectory("A", 0.0, [0.0, 0.0], ["start", "after y"])
    b1 = GiGPOTrajectory("B", 1.0, [1.0], ["start"])
    out = gigpo_advantages([a1, a2, b1], omega=1.0, gamma=1.0)
    # Eq. 3: A^E = [0.5, -0.5, 1] (b1 is alone in group B: it keeps its return, as verl-agent)
    # Eq. 5: returns a1 [1, 1], a2 [0, 0], b1 [1]
    # Eq. 6: clusters {a1 t0, a2 t0} ("start" in A), {a1 t1}, {a2 t1}, {b1 t0} ("start" in B)
    # Eq. 7: A^S a1 t0 = 1 - 0.5 = 0.5, a2 t0 = -0.5, singletons 0
    # Eq. 8: a1 [1.0, 0.5], a2 [-1.0, -0.5], b1 [1.0]
    np.testing.assert_allclose(out[0], [1.0, 0.5])
    np.testing.assert_allclose(out[1], [-1.0, -0.5])
    np.testing.assert_allclose(out[2], [1.0])
    with pytest.raises(ValueError):
        gigpo_advantages([GiGPOTrajectory("A", 0.0, [1.0], [])])


def test_one_group_normalisation_behind_grpo_gigpo_and_the_metrics() -> None:
    """group_norm.group_normalize is the one implementation: TRL's GRPO convention (per-role
    groups, eps 1e-4, lone samples 0) and verl-agent's GiGPO conventions are its parameters."""
    from records import per_role_normalize as per_role

    from trainer_client.credit.group_norm import GIGPO_EPS, GRPO_EPS, group_normalize, group_stds

    values = np.array([1.0, 0.0, 0.0, 2.0, 7.0, 3.0])
    keys = ["a", "a", "a", "b", "b", None]
    # group a: mean 1/3, std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    expected_a = (np.array([1.0, 0.0, 0.0]) - 1 / 3) / (np.sqrt(1 / 3) + GRPO_EPS)
    out = group_normalize(values, keys, scale=True, eps=GRPO_EPS)
    np.testing.assert_allclose(out[:3], expected_a)
    # group b: mean 4.5, centred ∓2.5, std sqrt(2 * 2.5^2 / 1) = sqrt(12.5)
    np.testing.assert_allclose(out[3:5], [-2.5 / (np.sqrt(12.5) + GRPO_EPS), 2.5 / (np.sqrt(12.5) + GRPO_EPS)])
    assert out[5] == 0.0  # no group (the judge)
    np.testing.assert_allclose(group_stds(values, keys), [np.sqrt(1 / 3), np.sqrt(12.5)])
    lone = group_normalize([4.0, 1.0, 3.0], ["x", "y", "y"], scale=False, eps=GIGPO_EPS, singleton="keep")
    np.testing.assert_allclose(lone, [4.0, -1.0, 1.0])
    # the per-role GRPO normalisation is the same function with (group, role) keys and TRL's eps
    roles = ["solver", "solver", "verifier", "verifier", "judge"]
    np.testing.assert_allclose(per_role(np.array([1.0, 0.0, 1.0, 1.0, 5.0]), roles, [0, 0, 0, 0, 0]),
                               [0.5 / (np.sqrt(0.5) + GRPO_EPS), -0.5 / (np.sqrt(0.5) + GRPO_EPS), 0, 0, 0], rtol=1e-6)
    with pytest.raises(ValueError):
        group_normalize([1.0], ["a", "b"], scale=True, eps=GRPO_EPS)
