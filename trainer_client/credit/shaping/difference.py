"""``difference_rewards``: each role is credited with its marginal contribution.

Source: D. H. Wolpert, K. Tumer, "Optimal payoff functions for members of collectives",
Advances in Complex Systems 4 (2001); K. Tumer, D. H. Wolpert, "Collectives and the design of
complex systems" (2004; difference utilities ``D_i = G(z) − G(z_{−i})``).

``D_role = G − G_without_role``: ``G`` is the sample's raw episode reward and
``G_without_role`` comes from the episode's counterfactual facts
(``CounterfactualFacts.rewards_without_role``): the solver's is 0 (no answer at all), the
verifier's is the solver's first-answer correctness (so a verifier that turned a wrong first
answer into a correct final one earns 1, one that talked a correct answer into a wrong one
earns −1).

In ``single`` mode (RFC 0006) the record has the solver's entry only (0), so ``D_solver = G``:
the strategy gives what ``identity`` gives.
"""

from __future__ import annotations

import numpy as np

from env_server.protocol.markers import Role
from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapingBatch
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["DifferenceRewardsStrategy"]


@register_strategy("difference_rewards")
class DifferenceRewardsStrategy(RewardShapingStrategy):
    """``D_role[i] = G_i − facts_i.rewards_without_role[role]`` (see the module docstring).

    Reads ``batch.facts``. Where sample ``i``'s facts are missing (``None`` or no entry
    for the role), ``D_role[i] = G_i``, the raw reward. No parameters.

    Returns:
        ``{role: (B,) array}`` for each trained role (solver, verifier) present in
        ``batch.roles``, dtype of ``rewards``.
    """

    def shape(self, batch: ShapingBatch) -> dict[Role, np.ndarray]:
        rewards, facts = batch.rewards, batch.facts_or_none()
        shaped = {}
        for role in batch.present_roles():
            without = np.array([0.0 if f is None else f.rewards_without_role.get(role, 0.0) for f in facts])
            shaped[role] = (rewards - without).astype(rewards.dtype)
        return shaped
