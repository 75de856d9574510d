"""``coma_advantage``: COMA's counterfactual baseline, estimated over the prompt's rollout group.

Source: J. Foerster, G. Farquhar, T. Afouras, N. Nardelli, S. Whiteson, "Counterfactual
Multi-Agent Policy Gradients", AAAI 2018, Eq. 4. Agent ``a``'s advantage is the return minus
its expectation when only ``a``'s own action is resampled from ``a``'s policy, every other
agent's action held fixed::

    A^a(s, u) = Q(s, u) − Σ_{u'^a} π^a(u'^a | τ^a) · Q(s, (u^{−a}, u'^a))

There is no learned critic: the ``Q`` values come from the episode facts the server reports
(:class:`~env_server.protocol.models.CounterfactualFacts`) and from the other rollouts of the same prompt
(its group). The previous version of this strategy subtracted the per-(group, role) mean, which
GRPO's per-(group, role) normalisation subtracts again, so it trained exactly like ``identity``;
this one gives the verifier a baseline that varies inside a group.

**Verifier.** Its action is its first verdict, the review of the solver's first answer:
*accept* (``VERDICT: CORRECT``) or *reject* (anything else, a missing verdict included, as
:mod:`env_server.debate.episode` treats it). The verifier rejected in rollout ``i`` iff
``not (facts.verifier_accepted and facts.rounds == 1)``: a debate that goes past round 1 had its
first answer rejected, whatever the later verdicts. With ``G_i`` the episode reward
(``rewards[i]``)::

    b_i = π_i · Q̂(accept)_i + (1 − π_i) · Q̂(reject)_i,        A_i = G_i − b_i

    π_i          = π(accept | τ_i): batch.verifier_accept_prob[i]
    Q̂(accept)_i  = facts_i.first_answer_correct (0/1), the outcome had the verifier accepted
                   (the estimator takes it that the judge keeps an accepted answer)
    Q̂(reject)_i  = G_i                          if the verifier rejected in rollout i,
                   mean{G_j : j rejected, first_answer_correct_j = first_answer_correct_i}
                                                 otherwise, over the verifier samples j of i's group.

Other roles' actions stay fixed: the solver's first answer, through ``first_answer_correct``
(``Q̂(reject)`` only pools rollouts whose first answer was as correct as rollout ``i``'s). When
``G_i`` is the taken action's ``Q̂`` (a rejection; an acceptance the judge kept), this is the
binary-action form of Eq. 4, ``A_i = (1 − π(u_i)) · (Q̂(u_i) − Q̂(u'))``: no signal when the
policy is already sure of the verdict or when both verdicts lead to the same outcome.

**Solver.** It keeps the group-mean baseline, ``A_i = G_i − mean{G_j : j solver sample of i's
group}``. The solver acts first, so resampling only its action from its policy, with nothing
earlier to hold fixed, is exactly a fresh rollout of the prompt: the mean over the group's
rollouts is the Monte-Carlo estimate of that counterfactual baseline. (After GRPO's group
normalisation the solver's advantages are therefore those of ``identity``.)

**Groups.** ``batch.group_ids`` (rollouts of one prompt share an id); without them,
rollout index ``// n_rollouts_per_prompt``, the rollout index of an sample being recovered from
the batch order (:func:`rollout_indices`: samples are (rollout, role) pairs, not rollouts).
Group ids take precedence when both are given.

**Degenerate cases.** "Group mean" below is the fallback baseline ``mean{G_j : j verifier
sample of i's group}``, i.e. the per-(group, role) mean:

- No counterfactual information for ``Q̂(reject)_i``: the verifier accepted in rollout ``i``
  and no verifier sample of the group rejected with the same ``first_answer_correct``. Sample
  ``i`` falls back to the group mean.
- Facts missing (``None``, or no ``"facts"`` key) for sample ``i``: its action and
  ``Q̂(accept)`` are unknown, so it falls back to the group mean, and it never enters another
  sample's ``Q̂(reject)`` pool or acceptance rate.
- ``π`` missing (no ``"verifier_accept_prob"`` key, or ``None`` for sample ``i``): ``π_i`` is
  estimated by the group's empirical acceptance rate, the fraction of the group's verifier
  samples with facts whose first verdict was an acceptance (sample ``i`` included). With one
  sample per rollout this is crude: a group in which every verifier rejected gets ``π̂ = 0``
  and ``A_i = G_i − Q̂(reject)_i = 0`` for its rejections.
- ``max_rounds = 1``: a rejection does not send the answer back to the solver; the debate goes
  straight to the judge, which sees the rejected answer and the review and boxes its own
  answer (none boxed: the solver's first answer stands, ``G = first_answer_correct``). The
  formula applies unchanged: ``Q̂(reject)`` is then the outcome of the judge's decision after a
  rejection, and ``rounds == 1`` for every rollout, so "rejected" is ``not verifier_accepted``.
- A verifier that never acted in an episode has no verifier sample (``build_role_samples`` makes
  none); that rollout is in no verifier statistic. Its other samples still get a verifier
  entry (below).
- A group with no verifier sample: the verifier entry is ``G_i`` (no baseline); likewise the
  solver entry of a group with no solver sample.
- ``single`` mode (RFC 0006; ``TrainConfig.mode``): every rollout is one solver turn, so the
  batch has solver samples only and the result is the solver's group-mean baseline (the same
  advantages as ``identity`` after GRPO's normalisation). No verdict exists, so the trainer's
  ``verifier_accept_prob`` forward pass finds no site and runs nothing.

**Entries of other roles' samples.** As the contract asks, each returned array fills all ``N``
indices (entry ``i`` = what the role would get in sample ``i``'s episode); the mapping only reads
the role's own samples. The verifier entry of a non-verifier sample uses that sample's facts and
``G``, with ``π`` estimated by the empirical rate, since ``π`` is only read on verifier samples.

**Worked example.** 4 rollouts of one prompt with rewards ``[5, 0, 5, 0]`` and no facts: no
counterfactual information exists, so the group mean 2.5 is the baseline for both roles and
the advantages are ``[2.5, −2.5, 2.5, −2.5]``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts
from trainer_client.credit.shaping.base import (
    VERIFIER_ACCEPT_PROB,
    RewardShapingStrategy,
    ShapingBatch,
    StrategyParams,
)
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["ComaAdvantageStrategy", "ComaParams"]


class ComaParams(StrategyParams):
    """Parameters of ``coma_advantage``.

    Attributes:
        n_rollouts_per_prompt: rollouts per prompt, used to group the samples only when the
            batch has no ``group_ids`` (which take precedence when present). ``None``
            (default): ``group_ids`` are required.
    """

    n_rollouts_per_prompt: int | None = Field(default=None, ge=1)


def rollout_indices(roles: Sequence[Role]) -> np.ndarray:
    """The rollout index of each sample, recovered from the batch order.

    Samples are (rollout, role) pairs, so an sample's position is not a rollout index (``n``
    debates with a solver, a verifier and a judge make ``3n`` samples). Batches are laid out as
    :func:`~trainer_client.credit.role_samples.build_role_samples` lays them out: each rollout's samples
    are contiguous and hold each role at most once. So a new rollout starts at sample 0 and at
    every sample whose role already appeared in the current rollout. A rollout missing a role
    (a verifier that never acted) is still one rollout.

    Returns:
        ``(N,)`` int64, ``0, 0, 0, 1, 1, ...``.
    """
    out = np.empty(len(roles), dtype=np.int64)
    k = -1
    seen: set[Role] = set()
    for i, role in enumerate(roles):
        if k < 0 or role in seen:
            k += 1
            seen.clear()
        seen.add(role)
        out[i] = k
    return out


def _accept_prob(value: Any, sample: int) -> float | None:
    """Sample ``sample``'s ``π(accept)``, or ``None`` when not given; raises on a bad value."""
    if value is None:
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{VERIFIER_ACCEPT_PROB}[{sample}] must be a float in [0, 1] or None, "
                         f"got {value!r}") from None
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"{VERIFIER_ACCEPT_PROB}[{sample}] = {p} is not a probability in [0, 1]")
    return p


def _first_verdict_rejected(facts: CounterfactualFacts) -> bool:
    """Whether the verifier rejected the solver's first answer (accepting it ends round 1)."""
    return not (facts.verifier_accepted and facts.rounds == 1)


@register_strategy("coma_advantage")
class ComaAdvantageStrategy(RewardShapingStrategy):
    """COMA's counterfactual advantage (Foerster et al. 2018, Eq. 4); see the module docstring.

    ``A^a(s, u) = Q(s, u) − Σ_{u'^a} π^a(u'^a | τ^a) Q(s, (u^{−a}, u'^a))``, estimated per sample:

    - verifier: ``A_i = G_i − [π_i · Q̂(accept)_i + (1 − π_i) · Q̂(reject)_i]``, with
      ``Q̂(accept)_i = first_answer_correct_i`` and ``Q̂(reject)_i`` = ``G_i`` if the verifier
      rejected the first answer in rollout ``i``, else the mean ``G`` of the group's rollouts
      that rejected a first answer of the same correctness; ``π_i`` from
      ``batch.verifier_accept_prob``, else the group's empirical acceptance rate;
      per-(group, role) mean baseline where facts or rejected rollouts are missing;
    - solver: ``A_i = G_i − mean`` over the solver samples of the group (a fresh rollout is the
      solver's counterfactual).

    Reads ``batch.facts``, ``batch.verifier_accept_prob`` (verifier samples only; both
    optional) and ``batch.group_ids``; without group ids, the samples are grouped by
    rollout index ``// n_rollouts_per_prompt`` (rollout indices from the batch order, see
    :func:`rollout_indices`). Group ids take precedence when both are given: the trainer
    computes them from the batch being shaped (``num_generations`` in training,
    ``num_generations_eval`` in evaluation), while a configured count cannot follow that
    change.

    Example: 4 rollouts of one prompt, rewards ``[5, 0, 5, 0]``, no facts: no counterfactual
    information, so the group mean is the baseline: ``[2.5, −2.5, 2.5, −2.5]``.

    Keyword Args:
        n_rollouts_per_prompt: optional int ``>= 1`` (see :class:`ComaParams`).

    Returns:
        ``{role: (B,) array}`` for each trained role (solver, verifier) present in
        ``batch.roles``, in the dtype of ``batch.rewards``. Judge samples get 0 in the mapping.

    Raises:
        ValueError: neither ``batch.group_ids`` nor ``n_rollouts_per_prompt``; a number of
            rollouts that is not a multiple of ``n_rollouts_per_prompt`` (grouping by count);
            a verifier sample's ``verifier_accept_prob`` that is not ``None`` or a float in
            ``[0, 1]``.
        pydantic.ValidationError: ``n_rollouts_per_prompt`` < 1 or an unknown parameter (at
            construction).
    """

    extra_columns: ClassVar[frozenset[str]] = frozenset({VERIFIER_ACCEPT_PROB})

    Params = ComaParams
    params: ComaParams

    def shape(self, batch: ShapingBatch) -> dict[Role, np.ndarray]:
        rewards = batch.rewards
        group = self._groups(batch)
        n_groups = int(group.max()) + 1 if len(group) else 0
        values = rewards.astype(np.float64)
        shaped = {}
        for role in batch.present_roles():
            sel = batch.is_role(role)
            sums = np.bincount(group[sel], weights=values[sel], minlength=n_groups)
            counts = np.bincount(group[sel], minlength=n_groups)
            mean = np.divide(sums, counts, out=np.zeros(n_groups), where=counts > 0)
            advantage = values - mean[group]
            if role is Role.VERIFIER:
                advantage = self._verifier_advantage(values, batch, group, fallback=advantage)
            shaped[role] = advantage.astype(rewards.dtype)
        return shaped

    def _groups(self, batch: ShapingBatch) -> np.ndarray:
        """Dense ``(N,)`` int64 group index per sample: from group ids, else rollout // n."""
        if batch.group_ids is not None:
            index: dict[Hashable, int] = {}
            return np.array([index.setdefault(gid, len(index)) for gid in batch.group_ids], dtype=np.int64)
        n = self.params.n_rollouts_per_prompt
        if n is None:
            raise ValueError(f"{self.name} needs the batch's group_ids (one group id per sample) or the "
                             "parameter n_rollouts_per_prompt to group the rollouts of each prompt")
        rollout = rollout_indices(batch.roles)
        n_rollouts = int(rollout[-1]) + 1 if len(rollout) else 0
        if n_rollouts % n:
            raise ValueError(f"{n_rollouts} rollouts in the batch are not a multiple of n_rollouts_per_prompt={n}; "
                             "pass the batch's group_ids")
        return rollout // n

    def _verifier_advantage(
        self,
        values: np.ndarray,
        batch: ShapingBatch,
        group: np.ndarray,
        fallback: np.ndarray,
    ) -> np.ndarray:
        """``G − b`` with COMA's baseline where it can be estimated, ``fallback`` elsewhere."""
        size = len(values)
        facts: Sequence[CounterfactualFacts | None] = batch.facts_or_none()
        probs = batch.accept_probs_or_none()
        is_verifier = batch.is_role(Role.VERIFIER)
        pi = [_accept_prob(probs[i], i) if is_verifier[i] else None for i in range(size)]

        # Statistics over the verifier samples with facts: one per rollout that has a verifier.
        rejected_sum: dict[tuple[int, bool], float] = {}
        rejected_count: dict[tuple[int, bool], int] = {}
        accepted = np.zeros(int(group.max()) + 1, dtype=np.int64)
        known = np.zeros_like(accepted)
        for i in np.flatnonzero(is_verifier).tolist():
            f = facts[i]
            if f is None:
                continue
            known[group[i]] += 1
            if _first_verdict_rejected(f):
                key = (int(group[i]), f.first_answer_correct)
                rejected_sum[key] = rejected_sum.get(key, 0.0) + float(values[i])
                rejected_count[key] = rejected_count.get(key, 0) + 1
            else:
                accepted[group[i]] += 1

        out = fallback.copy()
        for i in range(size):
            f, g = facts[i], int(group[i])
            if f is None:
                continue
            if _first_verdict_rejected(f):
                q_reject = float(values[i])
            elif (g, f.first_answer_correct) in rejected_count:
                key = (g, f.first_answer_correct)
                q_reject = rejected_sum[key] / rejected_count[key]
            else:
                continue  # no rejected rollout like this one: no counterfactual information
            p = pi[i]
            if p is None:
                if known[g] == 0:
                    continue  # a non-verifier sample in a group with no usable verifier sample
                p = accepted[g] / known[g]
            q_accept = float(f.first_answer_correct)
            out[i] = values[i] - (p * q_accept + (1.0 - p) * q_reject)
        return out
