"""Shaping metrics: raw (unshaped) statistics beside shaped ones, per role."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from env_server.protocol.markers import Role
from trainer_client.credit.group_norm import group_stds
from trainer_client.credit.shaping.base import role_mask

__all__ = ["shaping_metrics"]


def _zero_std_fraction(values: np.ndarray, keys: Sequence[Any]) -> float:
    """Fraction of groups whose values have zero std (``group_norm.group_stds``: Bessel-corrected,
    a 1-sample group is 0)."""
    return float(np.mean(np.isclose(group_stds(values, keys), 0.0)))


def shaping_metrics(
    raw: np.ndarray, shaped: np.ndarray, roles: Sequence[Role | str], group_ids: Sequence[Hashable]
) -> dict[str, float]:
    """Mean reward per role and the fraction of zero-std groups, raw and shaped.

    Pass ``raw`` as it was before shaping (shaping never mutates its input, so the array
    given to the strategy will do). Judge samples are left out of every statistic.

    Args:
        raw: ``(N,)`` float raw per-sample rewards.
        shaped: ``(N,)`` float per-sample shaped rewards (after the role write-back).
        roles: length-``N`` roles (strings are converted to :class:`Role`).
        group_ids: length-``N`` group ids; groups are (group id, role) pairs, as in GRPO's
            zero-std statistic (``frac_reward_zero_std``) but per role.

    Returns:
        ``reward/{raw,shaped}/<role>_mean`` for each non-judge role present, and
        ``reward/{raw,shaped}/zero_std_group_frac`` when there is at least one group.

    Raises:
        ValueError: the lengths differ, or an unknown role.
    """
    raw, shaped = np.asarray(raw, dtype=np.float64), np.asarray(shaped, dtype=np.float64)
    if not (raw.shape == shaped.shape == (len(roles),) == (len(group_ids),)):
        raise ValueError(f"shapes differ: raw {raw.shape}, shaped {shaped.shape}, "
                         f"{len(roles)} roles, {len(group_ids)} group ids")
    labels = [Role(r) for r in roles]
    metrics: dict[str, float] = {}
    for kind, values in (("raw", raw), ("shaped", shaped)):
        for role in dict.fromkeys(labels):
            if role is not Role.JUDGE:
                metrics[f"reward/{kind}/{role.value}_mean"] = float(values[role_mask(labels, role)].mean())
    keys: list[Any] = [None if role is Role.JUDGE else (gid, role) for gid, role in zip(group_ids, labels, strict=True)]
    if any(key is not None for key in keys):
        metrics["reward/raw/zero_std_group_frac"] = _zero_std_fraction(raw, keys)
        metrics["reward/shaped/zero_std_group_frac"] = _zero_std_fraction(shaped, keys)
    return metrics
