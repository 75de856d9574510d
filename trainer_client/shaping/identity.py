"""``identity``: no shaping; the default when no strategy is configured."""

from __future__ import annotations

import numpy as np

from trainer_client.shaping.base import RewardShapingStrategy, ShapingBatch
from trainer_client.shaping.registry import register_strategy

__all__ = ["IdentityStrategy"]


@register_strategy("identity")
class IdentityStrategy(RewardShapingStrategy):
    """Return the raw rewards unchanged: a ``(B,)`` copy of ``rewards`` (same dtype).

    No parameters.
    """

    def shape(self, batch: ShapingBatch) -> np.ndarray:
        return batch.rewards.copy()
