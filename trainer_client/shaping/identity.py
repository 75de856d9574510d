"""``identity``: no shaping; the default when no strategy is configured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainer_client.shaping.base import RewardShapingStrategy, check_batch
from trainer_client.shaping.registry import register_strategy

__all__ = ["IdentityStrategy"]


@register_strategy("identity")
class IdentityStrategy(RewardShapingStrategy):
    """Return the raw rewards unchanged: a ``(B,)`` copy of ``rewards`` (same dtype).

    No parameters.
    """

    def shape_rewards(
        self, rewards: np.ndarray, role_labels: Sequence[str], metadata: Mapping[str, Sequence[Any]]
    ) -> np.ndarray:
        check_batch(rewards, role_labels, metadata)
        return rewards.copy()
