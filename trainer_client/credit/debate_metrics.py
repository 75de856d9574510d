"""The per-batch debate metrics the trainer logs: shaping statistics, per-role rewards, judge
accuracy, episode reward, error-site rate and rollouts left out of the loss; and the views of a
batch without its failed or dropped rollouts that those metrics and the loss channels read
(a failed rollout's reward is not the policy's: ``docs/failures.md``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.role_samples import RoleSamples
from trainer_client.credit.shaping import shaping_metrics
from trainer_client.credit.shaping.base import TRAINED_ROLES
from trainer_client.credit.verdicts import verifier_step_metrics
from trainer_client.rollout.segments import Segment

__all__ = ["debate_metrics", "kept_samples", "scored_only", "unfinished_rate", "without_dropped"]


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
        error-site marker), ``debate/unaligned_rollouts`` (count) and the verifier's verdicts
        (``debate/verifier/balanced_accuracy``, ``accept_rate_right``, ``reject_rate_wrong``,
        ``missing_verdict_share``: :func:`~trainer_client.credit.verdicts.verifier_step_metrics`).
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
    metrics.update(verifier_step_metrics(records))
    return metrics


def kept_samples(samples: RoleSamples, shaped: np.ndarray, keep: Sequence[bool]) -> tuple[RoleSamples, np.ndarray]:
    """The samples (and their ``(N,)`` shaped rewards) of the rollouts ``keep`` selects, for
    metrics that must not read failed rollouts; rollout indices stay those of the batch.

    Raises:
        ValueError: ``keep`` is not one flag per rollout, or ``shaped`` not ``(N,)``.
    """
    if len(keep) != len(samples.turn_roles):
        raise ValueError(f"{len(keep)} flags for {len(samples.turn_roles)} rollouts")
    if shaped.shape != (len(samples.index),):
        raise ValueError(f"shaped rewards have shape {shaped.shape}, expected ({len(samples.index)},)")
    mask = np.array([bool(keep[k]) for k, _ in samples.index], dtype=bool)
    batch = samples.batch
    columns = {name: tuple(v for v, m in zip(getattr(batch, name), mask, strict=True) if m)
               for name in ("roles", "group_ids", "facts", "turns", "verifier_accept_prob")
               if getattr(batch, name) is not None}
    kept = replace(batch, rewards=batch.rewards[mask], **columns)
    index = tuple(key for key, m in zip(samples.index, mask, strict=True) if m)
    return RoleSamples(kept, index, samples.turn_roles), shaped[mask]


def scored_only(samples: RoleSamples, shaped: np.ndarray, records: Sequence[Any],
                failed: Sequence[bool]) -> tuple[RoleSamples, np.ndarray, list[Any]]:
    """The samples, shaped rewards and records of the rollouts that did not fail (all of them
    when none failed), for the batch's reward metrics."""
    if not any(failed):
        return samples, shaped, list(records)
    keep = [not bad for bad in failed]
    kept, kept_shaped = kept_samples(samples, shaped, keep)
    return kept, kept_shaped, [record for record, k in zip(records, keep, strict=True) if k]


def unfinished_rate(unfinished: Sequence[bool], failed: Sequence[bool]) -> dict[str, float]:
    """``debate/unfinished_rate`` over the rollouts that did not fail (a failed rollout's
    debate was finished by forfeits the policy never chose); ``{}`` when every one failed."""
    played = [bool(u) for u, bad in zip(unfinished, failed, strict=True) if not bad]
    return {"debate/unfinished_rate": float(np.mean(played))} if played else {}


def without_dropped(segments: Sequence[Any], dropped: Sequence[bool], first: int) -> list[Any]:
    """This process's rollouts' segments with ``None`` for the dropped ones (``dropped`` is
    per rollout of the gathered batch, this process's first at ``first``): what the loss
    channels are shown."""
    return [None if dropped and dropped[first + k] else segs for k, segs in enumerate(segments)]
