"""``identity``: no shaping; the default when no strategy is configured."""

from __future__ import annotations

import numpy as np

from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapingBatch
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["IdentityStrategy"]


@register_strategy("identity")
class IdentityStrategy(RewardShapingStrategy):
    """Return the raw rewards unchanged: a ``(N,)`` copy of ``rewards`` (same dtype).

    No parameters.
    """

    def shape(self, batch: ShapingBatch) -> np.ndarray:
        return batch.rewards.copy()
