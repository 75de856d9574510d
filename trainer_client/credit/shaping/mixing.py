"""``reward_mixing``: a convex mix of the team reward and the role's local reward.

``r_role = α·G + (1 − α)·local_role``: ``G`` is the sample's raw episode reward, ``local_role``
the role's own per-turn reward averaged over its turns (``CounterfactualFacts.local_rewards``:
the solver's answer correctness, the verifier's verdict accuracy; ``own_outcome``'s value). ``α = 1``
is ``identity``, ``α = 0`` is ``own_outcome``.

In ``single`` mode (RFC 0006) the solver's local reward is its one answer's correctness, i.e.
``G``, so ``r_solver = G`` for any ``α``: the strategy gives what ``identity`` gives.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from env_server.protocol.markers import Role
from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapingBatch, StrategyParams
from trainer_client.credit.shaping.own_outcome import own_outcomes
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["MixingParams", "RewardMixingStrategy"]


class MixingParams(StrategyParams):
    """Parameters of ``reward_mixing``.

    Attributes:
        alpha: weight ``α`` of the episode reward, in ``[0, 1]``.
    """

    alpha: float = Field(default=0.5, ge=0.0, le=1.0)


@register_strategy("reward_mixing")
class RewardMixingStrategy(RewardShapingStrategy):
    """``r_role[i] = α·G_i + (1 − α)·facts_i.local_rewards[role]``.

    Reads ``batch.facts``. Where sample ``i``'s facts are missing (``None`` or no entry
    for the role) the local reward is ``G_i``, so ``r_role[i] = G_i`` for any ``α``.

    Returns:
        ``{role: (B,) array}`` for each trained role present in ``batch.roles``, dtype of
        ``rewards``.
    """

    Params = MixingParams
    params: MixingParams

    def shape(self, batch: ShapingBatch) -> dict[Role, np.ndarray]:
        rewards, alpha = batch.rewards, self.params.alpha
        values = rewards.astype(np.float64)
        # local + α·(G − local) == α·G + (1 − α)·local, and exactly G when local == G
        return {role: (local + alpha * (values - local)).astype(rewards.dtype)
                for role, local in own_outcomes(batch).items()}
