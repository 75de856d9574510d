"""From graded records to the loss's ``(B, T)`` advantages and loss mask, in one place.

The path a reward takes, top to bottom (CleanRL style; the trainer only gathers the inputs
across processes and writes the outputs into TRL's batch):

1. **items**: every rollout's graded record becomes one item per role that acted
   (``role_mapping.build_role_items``); rollouts of one prompt share a group id.
2. **shaping**: the configured strategy turns each item's episode reward into a shaped reward
   (``role_mapping.shape_items``; a strategy that raises gives the raw rewards for the batch).
3. **advantage estimator**: ``grpo`` normalises per (group, role) with TRL's convention
   (``role_mapping.group_normalize``, through ``group_norm.group_normalize``); ``gigpo`` adds
   a step-level advantage over anchor states (``step_credit.gigpo_turn_values``). Either way
   each debate turn gets one value; judge turns get 0.
4. **tokens**: each turn's value is spread over the tokens of the assistant message that
   produced it (``spans.role_spans``, ``role_mapping.token_tensors``); tokens of no trained turn
   (judge, tool output, after the debate) are masked out of the loss.

Shapes: ``B`` rollouts on this process, ``N`` items on all processes, ``T`` completion tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from env_server.markers import Role
from env_server.models import EpisodeRewards
from trainer_client.gigpo import NormMode
from trainer_client.role_mapping import (
    RoleItems,
    build_role_items,
    group_normalize,
    shape_items,
    token_tensors,
    turn_values,
)
from trainer_client.shaping import RewardShapingStrategy
from trainer_client.spans import Segment, role_spans
from trainer_client.step_credit import gigpo_turn_values

__all__ = ["BatchAdvantages", "GiGPOInputs", "batch_advantages", "score_unfinished_debates", "shuffle_episode_rewards"]


@dataclass(frozen=True)
class GiGPOInputs:
    """What GiGPO needs beyond the records, per rollout of the gathered batch.

    Attributes:
        step_rewards: ``r_t`` per turn (Eq. 5), one list per rollout.
        observations: the acting role's observation per turn (Eq. 6 anchor states).
        omega, gamma, mode, similarity_threshold: see ``config.GiGPOConfig``.
    """

    step_rewards: Sequence[Sequence[float]]
    observations: Sequence[Sequence[str | None]]
    omega: float
    gamma: float
    mode: NormMode = "mean_norm"
    similarity_threshold: float | None = None


@dataclass(frozen=True)
class BatchAdvantages:
    """The result for this process's rollouts.

    Attributes:
        values: ``(B, T)`` float32 per-token advantages.
        loss_mask: ``(B, T)`` bool, True on tokens of a trained turn (False on judge tokens,
            tool output, padding and tokens after the debate).
        items: the gathered batch's items (for metrics).
        shaped: ``(N,)`` shaped reward per item.
        metrics: estimator metrics (e.g. ``gigpo/anchor_fraction``).
    """

    values: torch.Tensor
    loss_mask: torch.Tensor
    items: RoleItems
    shaped: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)


def shuffle_episode_rewards(records: Sequence[EpisodeRewards], seed: int) -> list[EpisodeRewards]:
    """The shuffled-reward control: the same records with their episode rewards ``G`` permuted
    across the batch (``numpy.random.default_rng(seed).permutation``).

    The batch keeps its reward distribution (same mean, same number of correct rollouts) but a
    rollout's advantage no longer depends on its own outcome, so a policy trained on it should not
    improve beyond what the reward-free parts of the update (e.g. entropy changes) do. Only ``G``
    moves: per-turn rewards and counterfactual facts stay as graded, so use it with identity
    shaping (which reads only ``G``).

    Args:
        records: the gathered batch's graded records, ``n`` long.
        seed: the permutation's seed; every process must pass the same one.

    Returns:
        ``n`` records; record ``k`` carries ``records[perm[k]].episode_reward``.
    """
    perm = np.random.default_rng(seed).permutation(len(records))
    return [rec.model_copy(update={"episode_reward": records[int(j)].episode_reward})
            for rec, j in zip(records, perm, strict=True)]


def score_unfinished_debates(records: Sequence[EpisodeRewards], unfinished: Sequence[bool],
                             reward: float | None) -> list[EpisodeRewards]:
    """Give every unfinished debate the episode reward ``reward``.

    A debate is unfinished when the rollout did not play all its turns: it stopped calling tools
    (its last text was submitted for the acting role) or ran out of completion length, and the
    environment adapter forfeited the remaining turns. The server's rule (the judge's answer, else
    the solver's last one) would grade such a debate on the solver's answer alone, so skipping the
    verifier and the judge costs nothing; on the tiny model at lr 3e-4 the policy learned exactly
    that (tool calls per rollout 2.9 -> 0.6 in 200 steps), and its greedy answers stopped being
    tool calls. Scoring unfinished debates as lost is the format reward of GRPO recipes
    (DeepSeek-R1, Guo et al. 2025, section 2.2.2) applied to the whole debate.

    Only ``G`` changes; per-turn rewards and facts stay as graded (forfeited turns already earn 0).

    Args:
        records: ``n`` graded records.
        unfinished: ``n`` flags, ``True`` where the adapter forfeited a turn of that rollout.
        reward: the episode reward of an unfinished debate; ``None`` keeps the graded one.

    Returns:
        ``n`` records (the same objects where nothing changes).

    Raises:
        ValueError: the lengths differ.
    """
    if len(records) != len(unfinished):
        raise ValueError(f"{len(records)} records for {len(unfinished)} unfinished flags")
    if reward is None:
        return list(records)
    return [rec.model_copy(update={"episode_reward": float(reward)}) if flag else rec
            for rec, flag in zip(records, unfinished, strict=True)]


def batch_advantages(
    all_records: Sequence[EpisodeRewards],
    num_generations: int,
    strategy: RewardShapingStrategy,
    segments: Sequence[Sequence[Segment] | None],
    completion_length: int,
    first_rollout: int,
    *,
    scale: bool = True,
    verifier_accept_probs: Sequence[float | None] | None = None,
    gigpo: GiGPOInputs | None = None,
) -> BatchAdvantages:
    """Advantages and loss mask of this process's rollouts (steps 1-4 of the module docstring).

    Args:
        all_records: the graded record of every rollout on every process, in batch order
            (groups contiguous, ``num_generations`` long, as TRL lays them out).
        num_generations: rollouts per prompt.
        strategy: the reward-shaping strategy.
        segments: per local rollout, its completion segments (``None``: unmatched, left out of
            the loss).
        completion_length: ``T``.
        first_rollout: index in ``all_records`` of this process's first rollout.
        scale: divide by the group std (``grpo`` only).
        verifier_accept_probs: per rollout of ``all_records``, π(CORRECT) at its first verdict,
            for strategies that read ``verifier_accept_prob`` (COMA).
        gigpo: GiGPO's inputs; ``None`` selects the ``grpo`` estimator.

    Returns:
        :class:`BatchAdvantages` with ``B = len(segments)``.

    Raises:
        ValueError: a record is missing, or lengths disagree.
    """
    # 1. items: one per (rollout, role)
    group_ids = [i // num_generations for i in range(len(all_records))]
    items = build_role_items(all_records, group_ids)
    if verifier_accept_probs is not None:
        column = tuple(verifier_accept_probs[k] if role is Role.VERIFIER else None for k, role in items.index)
        items = replace(items, batch=replace(items.batch, verifier_accept_prob=column))
    # 2. shaping
    shaped = shape_items(strategy, items)
    # 3. one value per debate turn
    metrics: dict[str, float] = {}
    if gigpo is not None:
        per_turn_all, metrics = gigpo_turn_values(
            items, shaped, gigpo.step_rewards, gigpo.observations, group_ids, omega=gigpo.omega, gamma=gigpo.gamma,
            mode=gigpo.mode, similarity_threshold=gigpo.similarity_threshold)
    else:
        advantages = group_normalize(shaped, items.roles, items.group_ids, scale=scale)
        per_turn_all = turn_values(items, advantages)
    per_turn = per_turn_all[first_rollout:first_rollout + len(segments)]
    # 4. tokens
    spans = [role_spans(segs) if segs is not None else [] for segs in segments]
    values, loss_mask = token_tensors(spans, per_turn, completion_length)
    return BatchAdvantages(values, loss_mask, items, shaped, metrics)
