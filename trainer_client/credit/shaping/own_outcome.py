"""``own_outcome``: each role is credited with its own turns' outcomes, not the episode's.

``r_role = local_role``: the mean over the role's turns of the server's per-turn reward
(``CounterfactualFacts.local_rewards``): for the solver, whether its answers were right (its
first answer, and its revisions in later rounds); for the verifier, whether its verdicts matched
the truth of the answer reviewed. The judge is not trained (its samples get 0 downstream).

Why: under ``identity`` every role gets the episode reward ``G``, which is whether the judge's
final answer is right. A solver whose wrong answer the verifier caught and the judge repaired
then gets ``G = 1``, and a verifier's verdict is credited with an outcome it may not have
decided. Measured on ``tiny-sums`` (v1): P(G = 1 | solver right) = 69%, P(G = 1 | solver wrong) =
6.5%, and the sign of the solver's advantage agreed with its own correctness in 57.5% of
rollouts; ``credit/fidelity/<role>`` in ``metrics.jsonl`` logs this agreement every step.
Where a role's outcome is the episode's (``single`` mode: the solver's one answer is ``G``), the
strategy gives what ``identity`` gives. ``reward_mixing`` with ``alpha`` mixes ``G`` with it.

This is the "local reward" of multi-agent credit assignment (e.g. Wolpert & Tumer's difference
rewards take ``G`` minus ``G`` without the agent; here each role's own graded outcome is directly
observable, so no counterfactual is needed).
"""

from __future__ import annotations

import numpy as np

from env_server.protocol.markers import Role
from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapingBatch
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["OwnOutcomeStrategy", "own_outcomes"]


def own_outcomes(batch: ShapingBatch) -> dict[Role, np.ndarray]:
    """Each present role's own outcome per sample: ``{role: (N,) float64}``, the sample's
    ``facts.local_rewards[role]``, or its episode reward ``G`` where the facts are missing
    (``None``, or no entry for the role)."""
    rewards, facts = batch.rewards.astype(np.float64), batch.facts_or_none()
    return {role: np.array([g if f is None else f.local_rewards.get(role, g) for g, f in zip(rewards, facts, strict=True)])
            for role in batch.present_roles()}


@register_strategy("own_outcome")
class OwnOutcomeStrategy(RewardShapingStrategy):
    """``r_role[i] = facts_i.local_rewards[role]`` (:func:`own_outcomes`).

    No parameters. Reads ``batch.facts``.

    Returns:
        ``{role: (N,) array}`` for each role present in ``batch.roles``, dtype of ``rewards``.
    """

    def shape(self, batch: ShapingBatch) -> dict[Role, np.ndarray]:
        return {role: local.astype(batch.rewards.dtype) for role, local in own_outcomes(batch).items()}
