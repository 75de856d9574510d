"""Steps 5-7 of the reward pipeline (:mod:`trainer_client.credit.pipeline`): role samples,
shaping and per-turn values.

One TRL rollout row is one whole debate in which the model plays every role; its completion
holds several turns, each a token range (a :class:`~trainer_client.rollout.segments.Segment`). Here::

    records --build_role_samples--> samples (one per (rollout, role))
            --shape_samples--------> per-sample shaped rewards (N,)
            --group_normalize------> per-sample advantages (N,)   [group_norm, keys: role_group_keys]
            --turn_values----------> per-turn values, one array per rollout
      (or   --turn_group_values----> per-turn values, the ``grpo_turn`` estimator)

Every turn of role ``r`` in rollout ``k`` gets sample ``(k, r)``'s value, so a role's value is
uniform over its turns in single- and multi-round debates alike. Judge turns are excluded from
the loss: judge samples are set to 0, left out of every group statistic, and their tokens are
masked out (the pipeline's step 8). ``N`` counts samples and ``B`` rollouts (rows). numpy only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapedRewards, ShapingBatch, role_mask

__all__ = [
    "RoleSamples",
    "announce_strategy",
    "build_role_samples",
    "resolve_sample_values",
    "role_group_keys",
    "shape_samples",
    "turn_group_values",
    "turn_values",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleSamples:
    """A shaping batch built from graded episodes (see :func:`build_role_samples`).

    Attributes:
        batch: the :class:`ShapingBatch` of the ``N`` samples: ``rewards`` ``(N,)`` float32
            (sample ``i``'s episode reward ``G``), ``roles``, ``group_ids``, ``facts`` and
            ``turns`` (the episode's ``TurnReward`` list); ``verifier_accept_prob`` is added by
            the trainer when the strategy asks for it.
        index: length ``N``, sample ``i``'s ``(rollout index, role)``.
        turn_roles: per rollout, the role of each turn ``t``.
    """

    batch: ShapingBatch
    index: tuple[tuple[int, Role], ...]
    turn_roles: tuple[tuple[Role, ...], ...]

    @property
    def rewards(self) -> np.ndarray:
        """``(N,)`` float32 raw rewards (``batch.rewards``)."""
        return self.batch.rewards

    @property
    def roles(self) -> tuple[Role, ...]:
        """Sample ``i``'s role (``batch.roles``)."""
        return self.batch.roles

    @property
    def group_ids(self) -> tuple[Hashable, ...]:
        """Sample ``i``'s group id (``batch.group_ids``; always given here)."""
        assert self.batch.group_ids is not None, "build_role_samples always sets group ids"
        return self.batch.group_ids


def build_role_samples(
    records: Sequence[EpisodeRewards | None],
    group_ids: Sequence[int],
    roles: Sequence[Role | str] = tuple(Role),
) -> RoleSamples:
    """Flatten graded rollouts into (rollout, role) samples.

    For rollout ``k``, each role of ``roles`` that has a turn in ``records[k]`` becomes one
    sample, in the order of ``roles``. Leaving ``Role.JUDGE`` out of ``roles`` is allowed: judge
    turns get 0 whatever (see :func:`turn_values`).

    Args:
        records: one graded record per rollout (the server's ``rewards`` frame data).
        group_ids: one id per rollout; rollouts of the same prompt share an id.
        roles: the roles to make samples for (default: all).

    Returns:
        The samples; ``N`` is the number of (rollout, role) pairs.

    Raises:
        ValueError: a record is ``None`` (episode not graded: wait for its rewards or drop
            the rollout; a missing grade is never read as reward 0), the lengths differ, or a
            record's turns are not numbered ``0..n-1`` in order.
    """
    if len(records) != len(group_ids):
        raise ValueError(f"{len(records)} records for {len(group_ids)} group ids")
    graded = [rec for rec in records if rec is not None]
    if len(graded) != len(records):
        ungraded = [k for k, rec in enumerate(records) if rec is None]
        raise ValueError(f"rollouts {ungraded} have no rewards record (episode not graded)")
    wanted = tuple(Role(r) for r in roles)
    rewards: list[float] = []
    labels: list[Role] = []
    facts, groups, turns, index, turn_roles = [], [], [], [], []
    for k, (rec, gid) in enumerate(zip(graded, group_ids, strict=True)):
        if [turn.t for turn in rec.turns] != list(range(len(rec.turns))):
            raise ValueError(f"episode {rec.episode_id}: turns are not numbered 0..n-1 in order")
        present = {turn.role for turn in rec.turns}
        turn_roles.append(tuple(turn.role for turn in rec.turns))
        for role in (r for r in wanted if r in present):
            rewards.append(rec.episode_reward)
            labels.append(role)
            facts.append(rec.facts)
            groups.append(gid)
            turns.append(rec.turns)
            index.append((k, role))
    batch = ShapingBatch(np.asarray(rewards, dtype=np.float32), tuple(labels), group_ids=tuple(groups),
                         facts=tuple(facts), turns=tuple(turns))
    return RoleSamples(
        batch=batch,
        index=tuple(index),
        turn_roles=tuple(turn_roles),
    )


def resolve_sample_values(shaped: ShapedRewards, rewards: np.ndarray, roles: Sequence[Role | str]) -> np.ndarray:
    """Write a strategy's result back onto the samples.

    A ``(N,)`` array is indexed directly. For a per-role dict, sample ``i`` with role ``r``
    gets ``shaped[r][i]``; an sample whose role has no key keeps its raw reward. Judge samples
    then get 0.

    Args:
        shaped: a strategy's output (or ``rewards`` itself, for no shaping).
        rewards: ``(N,)`` float raw rewards; not modified.
        roles: length-``N`` roles (strings are converted to :class:`Role`).

    Returns:
        ``(N,)`` array in the dtype of ``rewards``.

    Raises:
        ValueError: an array that is not ``(N,)``, a non-finite value, or an unknown role
            (in ``roles`` or as a key of ``shaped``).
    """
    labels = [Role(r) for r in roles]
    expected = (len(rewards),)
    if isinstance(shaped, Mapping):
        out = rewards.copy()
        for role, values in shaped.items():
            values = np.asarray(values)
            if values.shape != expected:
                raise ValueError(f"shaped[{Role(role).value!r}] has shape {values.shape}, expected {expected}")
            sel = role_mask(labels, Role(role))
            out[sel] = values[sel]
    else:
        out = np.asarray(shaped)
        if out.shape != expected:
            raise ValueError(f"shaped rewards have shape {out.shape}, expected {expected}")
        out = out.astype(rewards.dtype, copy=True)
    out[role_mask(labels, Role.JUDGE)] = 0.0
    if not np.all(np.isfinite(out)):
        raise ValueError(f"non-finite shaped rewards at samples {np.flatnonzero(~np.isfinite(out)).tolist()}")
    return out


def shape_samples(strategy: RewardShapingStrategy, samples: RoleSamples) -> np.ndarray:
    """Run ``strategy`` on ``samples`` and write the result back: ``(N,)``, float32.

    A strategy that raises does not stop training: the failure is logged as a warning with the
    strategy and the exception, and the batch falls back to the raw rewards (identity shaping:
    each sample's episode reward, judge samples 0).
    """
    try:
        shaped = strategy.shape(samples.batch)
        return resolve_sample_values(shaped, samples.rewards, samples.roles)
    except Exception as exc:  # a user strategy's bug must not end a run
        log.warning("reward shaping %r (%r) failed on a batch of %d samples (%s: %s); this batch uses the raw rewards",
                    strategy.name, strategy, len(samples.rewards), type(exc).__name__, exc)
        return resolve_sample_values(samples.rewards, samples.rewards, samples.roles)


def announce_strategy(strategy: RewardShapingStrategy) -> None:
    """Log one INFO line naming the active strategy and its parameters, unless it is ``identity``."""
    if strategy.name != "identity":
        log.info("reward shaping: %s with %s", strategy.name, strategy.params.model_dump())


def role_group_keys(roles: Sequence[Role | str], group_ids: Sequence[Hashable]) -> list[tuple[Hashable, Role] | None]:
    """The GRPO group key of each role sample: ``(group id, role)``, and ``None`` for the judge,
    which is in no group (so :func:`~trainer_client.credit.group_norm.group_normalize` gives it 0
    and its zeros never enter a group's statistics).

    Args:
        roles, group_ids: length-``N`` roles and group ids.

    Returns:
        ``N`` keys.

    Raises:
        ValueError: the lengths differ, or an unknown role.
    """
    if len(roles) != len(group_ids):
        raise ValueError(f"{len(roles)} roles, {len(group_ids)} group ids")
    typed = [Role(r) for r in roles]
    return [None if role is Role.JUDGE else (gid, role) for gid, role in zip(group_ids, typed, strict=True)]


def turn_values(samples: RoleSamples, sample_values: np.ndarray) -> list[np.ndarray]:
    """Per-turn values: every turn of role ``r`` in rollout ``k`` gets sample ``(k, r)``'s value.

    Args:
        samples: the batch the values belong to.
        sample_values: ``(N,)`` per-sample values (shaped rewards or advantages).

    Returns:
        One array per rollout, of length its number of turns (indexed by ``t``), in the
        dtype of ``sample_values``. Judge turns are 0 whether or not the judge has samples.

    Raises:
        ValueError: ``sample_values`` is not ``(N,)``, or a non-judge turn has no sample.
    """
    if sample_values.shape != (len(samples.index),):
        raise ValueError(f"sample values have shape {sample_values.shape}, expected ({len(samples.index)},)")
    position = {key: i for i, key in enumerate(samples.index)}
    out = []
    for k, roles in enumerate(samples.turn_roles):
        per_turn = np.zeros(len(roles), dtype=sample_values.dtype)
        for t, role in enumerate(roles):
            if role is Role.JUDGE:
                continue
            if (k, role) not in position:
                raise ValueError(f"rollout {k} turn {t}: no sample for role {role.value!r}")
            per_turn[t] = sample_values[position[(k, role)]]
        out.append(per_turn)
    return out


def turn_group_values(samples: RoleSamples, shaped: np.ndarray, scale: bool = True,
                      eps: float = GRPO_EPS) -> list[np.ndarray]:
    """Per-turn advantages of the ``grpo_turn`` estimator: group normalisation per (prompt, role,
    that role's k-th turn).

    ``grpo`` gives every turn of role ``r`` in rollout ``i`` one advantage, normalised over the
    (prompt, role) group ``g``. ``grpo_turn`` normalises each turn against the same role's turns at
    the same position in the other rollouts of its prompt. For rollout ``i`` of prompt ``g``, role
    ``r`` with shaped reward ``v_{i,r}``, and ``j`` counting that role's turns from 0 in the order
    played, let

        G_{g,r,j} = { i' in g : rollout i' played at least j + 1 turns of role r }

    then the advantage of the ``j``-th turn of ``r`` in rollout ``i`` is

        A_{i,r,j} = (v_{i,r} − mean_{i' ∈ G_{g,r,j}} v_{i',r}) / (std_{i' ∈ G_{g,r,j}} v_{i',r} + ε)   if |G_{g,r,j}| ≥ 2,
        A_{i,r,j} = A_{i,r}   (the (prompt, role) advantage of ``grpo``)                               if |G_{g,r,j}| = 1,

    with the Bessel-corrected std and ``ε`` = 1e-4 (TRL's), no division when ``scale`` is off, and 0
    for a group of zero spread; judge turns get 0. Debates of one prompt differ in length (a
    verifier that accepts ends the debate; one that rejects buys the solver another round), so the
    later turns' baseline is taken over the rollouts that reached them: a second solver turn is
    compared with other second solver turns, not with rollouts whose debate ended after one.

    Not AT-GRPO. AT-GRPO (Zhao et al. 2025, "Stronger Together: On-Policy Reinforcement Learning for
    Collaborative LLMs", arXiv 2510.11062) also groups by agent and turn, but its groups are
    *branches*: at each turn it samples K candidate actions from one shared state and compares
    them with each other (same history, per-turn rewards), then continues one of them. Here the
    members of a (prompt, role, j) group are the j-th turns of independently sampled rollouts:
    their histories differ (different earlier turns), nothing is branched or re-sampled, and the
    value compared is the role's shaped episode reward. The baseline is per position, not per state;
    it costs no extra generation.

    Args:
        samples: the gathered batch's role samples (rollouts of one prompt share a group id).
        shaped: ``(N,)`` shaped reward per sample.
        scale: divide by ``std + eps``; else only centre.
        eps: added to the std.

    Returns:
        One array per rollout, of length its number of turns (indexed by ``t``), float like
        ``shaped``; judge turns 0.

    Raises:
        ValueError: ``shaped`` is not ``(N,)``, or a non-judge turn has no sample.
    """
    if shaped.shape != (len(samples.index),):
        raise ValueError(f"shaped rewards have shape {shaped.shape}, expected ({len(samples.index)},)")
    fallback = group_normalize(shaped, role_group_keys(samples.roles, samples.group_ids), scale=scale, eps=eps,
                               singleton="zero")
    position = {key: i for i, key in enumerate(samples.index)}
    keys: list[Hashable] = []
    sites: list[tuple[int, int, int]] = []  # (rollout, t, sample)
    for k, roles in enumerate(samples.turn_roles):
        seen: Counter[Role] = Counter()
        for t, role in enumerate(roles):
            if role is Role.JUDGE:
                continue
            if (k, role) not in position:
                raise ValueError(f"rollout {k} turn {t}: no sample for role {role.value!r}")
            i = position[(k, role)]
            keys.append((samples.group_ids[i], role, seen[role]))
            seen[role] += 1
            sites.append((k, t, i))
    values = [float(shaped[i]) for _, _, i in sites]
    normalized = group_normalize(values, keys, scale=scale, eps=eps, singleton="zero")
    sizes = Counter(keys)
    out = [np.zeros(len(roles), dtype=shaped.dtype) for roles in samples.turn_roles]
    for (k, t, i), key, value in zip(sites, keys, normalized, strict=True):
        out[k][t] = value if sizes[key] > 1 else fallback[i]
    return out
