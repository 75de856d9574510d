"""The documented import path of group normalisation (README:
``trainer_client.group_norm.group_normalize``); it lives in :mod:`trainer_client.credit.group_norm`."""

from trainer_client.credit.group_norm import (
    GIGPO_EPS,
    GRPO_EPS,
    Singleton,
    group_normalize,
    group_stds,
)

__all__ = [
    "GIGPO_EPS", "GRPO_EPS", "Singleton", "group_normalize", "group_stds",
]
