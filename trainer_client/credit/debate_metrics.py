"""The per-batch debate metrics the trainer logs: shaping statistics, per-role rewards, judge
accuracy, episode reward, error-site rate and rollouts left out of the loss."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.role_samples import RoleSamples
from trainer_client.credit.shaping import shaping_metrics
from trainer_client.credit.shaping.base import TRAINED_ROLES
from trainer_client.rollout.spans import Segment

__all__ = ["debate_metrics"]


def debate_metrics(samples: RoleSamples, shaped: np.ndarray, records: Sequence[EpisodeRewards],
                   segments: Sequence[Sequence[Segment] | None]) -> dict[str, float]:
    """Metrics of one gathered batch.

    Args:
        samples: the batch's ``N`` role samples; ``shaped``: their ``(N,)`` shaped rewards.
        records: the gathered batch's graded records.
        segments: this process's rollouts' segments (``None``: not aligned, outside the loss).

    Returns:
        ``{name: value}``: ``shaping_metrics``' keys, ``debate/reward/<role>`` (mean per-turn
        reward of each trained role), ``debate/judge_accuracy`` (where a judge answered),
        ``debate/episode_reward``, ``debate/error_site_rate`` (share of trained turns with an
        error-site marker) and ``debate/unaligned_rollouts`` (count).
    """
    metrics = dict(shaping_metrics(samples.rewards, shaped, samples.roles, samples.group_ids))
    per_role: dict[Role, list[float]] = defaultdict(list)
    sites = trained = 0
    for record in records:
        for turn in record.turns:
            per_role[turn.role].append(turn.reward)
            if turn.role in TRAINED_ROLES:
                trained += 1
                sites += turn.error_kind is not None
    for role in TRAINED_ROLES:
        rewards = per_role.get(role)
        if rewards:
            metrics[f"debate/reward/{role.value}"] = float(np.mean(rewards))
    judged = [r.facts.judge_correct for r in records if r.facts.judge_correct is not None]
    if judged:
        metrics["debate/judge_accuracy"] = float(np.mean(judged))
    metrics["debate/episode_reward"] = float(np.mean([r.episode_reward for r in records]))
    metrics["debate/error_site_rate"] = sites / trained if trained else 0.0
    metrics["debate/unaligned_rollouts"] = float(sum(s is None for s in segments))
    return metrics
