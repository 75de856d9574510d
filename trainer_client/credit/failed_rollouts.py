"""Failed rollouts leave their group (issue 45; ``docs/failures.md``).

A rollout *failed* when a model request of its episode failed for good (an endpoint role's
request: :class:`~trainer_client.policies.endpoint.EndpointPlayer`): its record is graded, but
on a forfeit the model never made, so its reward is not the policy's. It is dropped:

- it gets zero advantage and its tokens leave the loss;
- its group is normalised over the other rollouts (it is given a group id of its own,
  ``-1 - k`` for rollout ``k``, so that no group statistic, shaping strategy keyed on groups or
  GiGPO anchor reads it);
- a group that a failure left with fewer than ``min_scored`` (2) scored rollouts gives
  nothing: a single rollout has no baseline, so its members are dropped the same way (counted
  apart). A group without a failure is left as it is, whatever its size;
- it is counted: ``rollouts/failed`` (failed rollouts of the gathered batch) and
  ``rollouts/dropped`` (failed ones and the members of groups that gave nothing) in
  ``metrics.jsonl``.

One named step before the estimator, so that the credit code can change around it: the
advantage pipeline (:func:`~trainer_client.credit.advantages.batch_advantages`) calls
:func:`drop_failed_rollouts` on the gathered batch's group ids and clears the dropped rows'
spans; the trainer leaves failed rollouts out of its reward metrics (:func:`scored_only`,
:func:`unfinished_rate`) and dropped ones out of the loss channels (:func:`without_dropped`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from trainer_client.credit.role_samples import RoleSamples

__all__ = ["MIN_SCORED_PER_GROUP", "DroppedRollouts", "drop_failed_rollouts", "kept_samples", "scored_only",
           "unfinished_rate", "without_dropped"]

#: The fewest scored rollouts a group needs to give an advantage (a baseline needs two).
MIN_SCORED_PER_GROUP = 2


@dataclass(frozen=True)
class DroppedRollouts:
    """The result of :func:`drop_failed_rollouts`, per rollout of the gathered batch.

    Attributes:
        group_ids: each rollout's group id; a dropped rollout's is ``-1 - k``, a group of its own.
        dropped: whether rollout ``k`` leaves the loss (failed, or in a group that gave nothing).
        failed: whether rollout ``k`` failed (the input flags).
    """

    group_ids: tuple[int, ...]
    dropped: tuple[bool, ...]
    failed: tuple[bool, ...]

    @property
    def metrics(self) -> dict[str, float]:
        """``rollouts/failed`` and ``rollouts/dropped``: counts in the gathered batch."""
        return {"rollouts/failed": float(sum(self.failed)), "rollouts/dropped": float(sum(self.dropped))}


def drop_failed_rollouts(group_ids: Sequence[int], failed: Sequence[bool],
                         min_scored: int = MIN_SCORED_PER_GROUP) -> DroppedRollouts:
    """Take failed rollouts out of their groups (see the module docstring).

    Args:
        group_ids: ``n`` group ids, one per rollout of the gathered batch (non-negative:
            rollouts of one prompt share one).
        failed: ``n`` flags, ``True`` where the rollout's episode failed.
        min_scored: the fewest scored rollouts a group needs to stay.

    Returns:
        :class:`DroppedRollouts`.

    Raises:
        ValueError: the lengths differ, or a group id is negative (the dropped rollouts' range).
    """
    if len(group_ids) != len(failed):
        raise ValueError(f"{len(group_ids)} group ids for {len(failed)} failure flags")
    if any(gid < 0 for gid in group_ids):
        raise ValueError("group ids must be non-negative: negative ids mark dropped rollouts")
    scored = Counter(gid for gid, bad in zip(group_ids, failed, strict=True) if not bad)
    hit = {gid for gid, bad in zip(group_ids, failed, strict=True) if bad}
    dropped = tuple(bool(bad) or (gid in hit and scored[gid] < min_scored)
                    for gid, bad in zip(group_ids, failed, strict=True))
    ids = tuple(-1 - k if drop else int(gid) for k, (gid, drop) in enumerate(zip(group_ids, dropped, strict=True)))
    return DroppedRollouts(ids, dropped, tuple(bool(bad) for bad in failed))


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
