"""Group normalisation: the one function behind every group statistic of the trainer.

``A_i = v_i − mean_g`` or, with ``scale``, ``(v_i − mean_g) / (std_g + eps)`` over the samples
``i`` of each group ``g`` (samples with the same key), where ``std_g`` is Bessel-corrected
(``ddof = 1``), as TRL 1.16 ``GRPOTrainer`` (``trl.trainer.utils.nanstd``) and verl-agent's
GiGPO (``torch.std``) both compute it. A group with zero spread gives 0 either way. Samples whose
key is ``None`` are in no group and get 0 (the judge: evaluated, never trained).

A group of one sample has no baseline; what it gets is the caller's choice, named after the code
it follows:

- ``"zero"``: 0 (TRL's GRPO has no one-sample groups; our per-role groups and GiGPO's step level
  give 0, as verl-agent's ``step_norm_reward`` does by taking the sample's own value as the mean);
- ``"keep"``: the value itself (verl-agent's ``episode_norm_reward`` uses mean 0 and std 1 for a
  trajectory alone in its group; the GiGPO paper is silent on it).

Epsilons: :data:`GRPO_EPS` (TRL's ``1e-4``) for GRPO, :data:`GIGPO_EPS` (verl-agent's ``1e-6``)
for GiGPO. numpy only, float64 inside.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np

__all__ = ["GIGPO_EPS", "GRPO_EPS", "Singleton", "group_normalize", "group_stds"]

GRPO_EPS = 1e-4
"""Added to the group std by TRL 1.16 ``GRPOTrainer`` (``advantages / (std_rewards + 1e-4)``)."""
GIGPO_EPS = 1e-6
"""Added to the group std by verl-agent's GiGPO (``epsilon=1e-6``)."""

Singleton = Literal["zero", "keep"]


def _members(keys: Sequence[Hashable | None]) -> list[list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            groups.setdefault(key, []).append(i)
    return list(groups.values())


def group_normalize(values: Sequence[float] | np.ndarray, keys: Sequence[Hashable | None], *, scale: bool,
                    eps: float, singleton: Singleton = "zero") -> np.ndarray:
    """Normalise ``values`` within the groups that ``keys`` define (see the module docstring).

    Args:
        values: ``(N,)`` numbers.
        keys: length ``N`` hashable group keys; ``None`` puts an sample in no group (it gets 0).
        scale: divide the centred values by ``std + eps`` (Bessel-corrected std).
        eps: added to the std.
        singleton: what a one-sample group gets: ``"zero"`` or ``"keep"`` (its value; divided
            by ``1 + eps`` when scaling, as verl-agent's std of 1).

    Returns:
        ``(N,)`` float64.

    Raises:
        ValueError: ``values`` and ``keys`` differ in length, or an unknown ``singleton``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (len(keys),):
        raise ValueError(f"{v.shape} values for {len(keys)} keys")
    if singleton not in ("zero", "keep"):
        raise ValueError(f"singleton must be 'zero' or 'keep', got {singleton!r}")
    out = np.zeros(len(v), dtype=np.float64)
    for idx in _members(keys):
        if len(idx) == 1:
            if singleton == "keep":
                out[idx] = v[idx] / (1.0 + eps) if scale else v[idx]
            continue
        centred = v[idx] - v[idx].mean()
        if scale:
            centred = centred / (v[idx].std(ddof=1) + eps)
        out[idx] = centred
    return out


def group_stds(values: Sequence[float] | np.ndarray, keys: Sequence[Hashable | None]) -> list[float]:
    """The Bessel-corrected std of each group (0 for a one-sample group), in order of first appearance."""
    v = np.asarray(values, dtype=np.float64)
    return [float(v[idx].std(ddof=1)) if len(idx) > 1 else 0.0 for idx in _members(keys)]
