"""``coma_advantage``: a counterfactual baseline per role over the prompt's rollout group.

Source: J. Foerster, G. Farquhar, T. Afouras, N. Nardelli, S. Whiteson, "Counterfactual
Multi-Agent Policy Gradients", AAAI 2018. COMA's advantage for agent ``a`` is
``A^a = Q(s, u) − Σ_{u'} π^a(u'|τ^a) Q(s, (u^{−a}, u'))``: the return minus the expected return
when only that agent's action is resampled from its policy.

Without a learned critic, the ``n_rollouts_per_prompt`` rollouts of one prompt are samples of
the role's policy on the same problem, so the baseline is estimated by the mean over the
role's items in the group: ``A = r − mean(group)``, per (group id, role). Judge items never
enter a group. Note that GRPO's group normalisation already subtracts the same mean, so on its
own this strategy changes the gradient only when advantages are not re-centred afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainer_client.shaping.base import GROUP_IDS, TRAINED_ROLES, RewardShapingStrategy, check_batch
from trainer_client.shaping.registry import register_strategy

__all__ = ["ComaAdvantageStrategy"]


@register_strategy("coma_advantage")
class ComaAdvantageStrategy(RewardShapingStrategy):
    """``A_role[i] = r_i − mean{r_j : group_j = group_i, role_j = role}``.

    Example: 4 rollouts of one prompt with rewards ``[5, 0, 5, 0]`` give
    ``[2.5, −2.5, 2.5, −2.5]``. Where item ``i``'s group has no item of the role,
    ``A_role[i] = r_i`` (no baseline). No parameters.

    Returns:
        ``{role: (B,) array}`` for each trained role present in ``role_labels``, dtype of
        ``rewards``.

    Raises:
        KeyError: ``metadata`` has no ``"group_ids"``.
    """

    def shape_rewards(
        self, rewards: np.ndarray, role_labels: Sequence[str], metadata: Mapping[str, Sequence[Any]]
    ) -> dict[str, np.ndarray]:
        labels = check_batch(rewards, role_labels, metadata)
        if GROUP_IDS not in metadata:
            raise KeyError(f"{self.name} needs metadata[{GROUP_IDS!r}] (one group id per item)")
        _, group = np.unique(np.asarray(metadata[GROUP_IDS]), return_inverse=True)
        n_groups = int(group.max()) + 1 if len(group) else 0
        values = rewards.astype(np.float64)
        shaped = {}
        for role in (r for r in TRAINED_ROLES if np.any(labels == r)):
            sel = labels == role
            sums = np.bincount(group[sel], weights=values[sel], minlength=n_groups)
            counts = np.bincount(group[sel], minlength=n_groups)
            baseline = np.divide(sums, counts, out=np.zeros(n_groups), where=counts > 0)
            shaped[role] = (values - baseline[group]).astype(rewards.dtype)
        return shaped
