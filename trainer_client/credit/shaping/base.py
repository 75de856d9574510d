"""The reward-shaping contract: the typed batch, the strategy ABC, its params model.

A shaping batch (:class:`ShapingBatch`) holds ``N`` *samples*, one per (rollout, role) pair: for
each debate rollout, every role that acted in it is one sample (see
:func:`trainer_client.credit.role_samples.build_role_samples`). Its fields, each of length ``N``:

    rewards: ``np.ndarray`` of shape ``(N,)``, a float dtype. Sample ``i``'s raw correctness,
        i.e. the episode reward ``G`` (0/1) of the debate sample ``i`` belongs to.
    roles: sample ``i``'s :class:`~env_server.protocol.markers.Role` (strings are converted; an unknown
        role is a ``ValueError``).
    group_ids: hashable id per sample; samples of rollouts of the same prompt share a group id.
        Per-role groups are (group id, role) pairs. Required by group-based strategies.
        ``None`` = not given.
    facts: ``CounterfactualFacts | None`` per sample, the facts of the sample's episode (``None`` =
        facts missing).
    turns: ``Sequence[TurnReward] | None`` per sample, all graded turns of the sample's episode
        ordered by ``t``. Used by state potentials.
    verifier_accept_prob: ``float | None`` per sample, read on verifier samples only (any value
        elsewhere is ignored): ``π(accept | τ)``, the probability in ``[0, 1]`` that the policy
        gave the verdict ``VERDICT: CORRECT`` on the verifier's first turn of the sample's episode
        (its review of the solver's first answer); ``π(reject) = 1 − π(accept)``. ``None`` =
        not known. Filled by the trainer only for strategies that list it in
        :attr:`RewardShapingStrategy.extra_columns` (it costs a forward pass). Used by
        ``coma_advantage``.

Output of :meth:`RewardShapingStrategy.shape`: either one array of shape ``(N,)`` (a value per
sample, indexed directly), or a dict ``{Role: array (N,)}``. A per-role array fills **all** ``N``
indices: entry ``i`` is the shaped reward that role would get in sample ``i``'s episode. The
mapping into the gradient path then gives sample ``i`` with role ``r`` the value
``shaped[r][i]``; a role missing from the dict keeps its raw reward. Returned arrays have the
input's dtype; inputs are never mutated.

Judge samples get 0 after shaping whatever a strategy returns, and never enter a group
statistic: the judge is evaluated, not trained.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from env_server.protocol.markers import Role

if TYPE_CHECKING:
    from env_server.protocol.models import CounterfactualFacts, TurnReward

__all__ = [
    "TRAINED_ROLES",
    "VERIFIER_ACCEPT_PROB",
    "RewardShapingStrategy",
    "ShapedRewards",
    "ShapingBatch",
    "StrategyParams",
    "role_mask",
]

#: Name of the :class:`ShapingBatch` field a strategy lists in ``extra_columns`` to get
#: ``π(accept | τ)`` of the verifier's first verdict (a forward pass per batch).
VERIFIER_ACCEPT_PROB = "verifier_accept_prob"
#: Roles whose turns are trained; per-role strategies return a key for each one present.
TRAINED_ROLES: tuple[Role, ...] = tuple(r for r in Role if r is not Role.JUDGE)

ShapedRewards = np.ndarray | dict[Role, np.ndarray]
"""A ``(N,)`` array, or ``{Role: (N,) array}``; see the module docstring."""


def role_mask(roles: Sequence[Role], role: Role) -> np.ndarray:
    """``(N,)`` bool mask of ``roles[i] is role`` (see :meth:`ShapingBatch.is_role`)."""
    return np.fromiter((r is role for r in roles), dtype=bool, count=len(roles))


def _column(name: str, values: Sequence[Any] | None, size: int) -> tuple[Any, ...] | None:
    if values is None:
        return None
    out = tuple(values)
    if len(out) != size:
        raise ValueError(f"{name} has length {len(out)}, expected {size}")
    return out


@dataclass(frozen=True, eq=False)
class ShapingBatch:
    """A typed shaping batch of ``N`` (rollout, role) samples (see the module docstring).

    Attributes:
        rewards: ``(N,)`` float array, the episode reward ``G`` of each sample; never mutated.
        roles: length ``N``, :class:`Role` per sample.
        group_ids: length ``N`` hashable ids, or ``None``.
        facts: length ``N``, ``CounterfactualFacts | None`` per sample, or ``None`` (all missing).
        turns: length ``N``, the episode's ``TurnReward`` list (or ``None``) per sample, or ``None``.
        verifier_accept_prob: length ``N``, ``float | None`` per sample, or ``None``.

    Raises:
        TypeError: ``rewards`` is not a float ndarray.
        ValueError: ``rewards`` is not 1-D, a column's length is not ``N``, or an unknown role.
    """

    rewards: np.ndarray
    roles: tuple[Role, ...]
    group_ids: tuple[Hashable, ...] | None = None
    facts: tuple[CounterfactualFacts | None, ...] | None = None
    turns: tuple[Sequence[TurnReward] | None, ...] | None = None
    verifier_accept_prob: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        rewards = self.rewards
        if not isinstance(rewards, np.ndarray) or not np.issubdtype(rewards.dtype, np.floating):
            raise TypeError(f"rewards must be a float numpy array, got {type(rewards).__name__} "
                            f"{getattr(rewards, 'dtype', '')}")
        if rewards.ndim != 1:
            raise ValueError(f"rewards must have shape (N,), got {rewards.shape}")
        size = len(rewards)
        roles = _column("roles", self.roles, size)
        assert roles is not None
        try:
            object.__setattr__(self, "roles", tuple(Role(r) for r in roles))
        except ValueError as exc:
            raise ValueError(f"unknown role in roles: {exc}") from None
        for name in ("group_ids", "facts", "turns", "verifier_accept_prob"):
            object.__setattr__(self, name, _column(name, getattr(self, name), size))

    def __len__(self) -> int:
        return len(self.rewards)

    def is_role(self, role: Role) -> np.ndarray:
        """``(N,)`` bool mask of the samples of ``role``. (Never build it as ``np.array(roles) ==
        role``: numpy compares with ``str(role)``, i.e. ``"Role.SOLVER"``, and finds nothing.)"""
        return role_mask(self.roles, role)

    def present_roles(self, roles: Sequence[Role] = TRAINED_ROLES) -> list[Role]:
        """The roles of ``roles`` that have at least one sample, in the order of ``roles``."""
        have = set(self.roles)
        return [r for r in roles if r in have]

    def facts_or_none(self) -> tuple[CounterfactualFacts | None, ...]:
        """``facts``, or ``None`` for every sample when the column is missing."""
        return self.facts if self.facts is not None else (None,) * len(self)

    def turns_or_none(self) -> tuple[Sequence[TurnReward] | None, ...]:
        """``turns``, or ``None`` for every sample when the column is missing."""
        return self.turns if self.turns is not None else (None,) * len(self)

    def accept_probs_or_none(self) -> tuple[Any, ...]:
        """``verifier_accept_prob``, or ``None`` for every sample when the column is missing."""
        if self.verifier_accept_prob is not None:
            return self.verifier_accept_prob
        return (None,) * len(self)


class StrategyParams(BaseModel):
    """Base of every strategy's params model: unknown keys and bad values fail validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RewardShapingStrategy(ABC):
    """A reward-shaping strategy (see the module docstring for the full contract).

    Subclasses set ``Params`` to their :class:`StrategyParams` model, implement :meth:`shape`,
    and are registered with :func:`trainer_client.credit.shaping.registry.register_strategy`, which
    sets ``name``.

    Args:
        **params: the strategy's parameters, validated by ``Params``.

    Raises:
        pydantic.ValidationError: unknown or invalid parameters.
        TypeError: the class does not implement ``shape``.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[StrategyParams]] = StrategyParams
    #: :class:`ShapingBatch` fields beyond the always-present ones that the trainer must fill
    #: for this strategy (e.g. ``VERIFIER_ACCEPT_PROB``, which costs a forward pass per batch).
    extra_columns: ClassVar[frozenset[str]] = frozenset()
    params: StrategyParams

    def __init__(self, **params: Any) -> None:
        if type(self).shape is RewardShapingStrategy.shape:
            raise TypeError(f"{type(self).__name__} must implement shape(batch: ShapingBatch)")
        self.params = self.Params.model_validate(params)

    def shape(self, batch: ShapingBatch) -> ShapedRewards:
        """Shape the raw rewards of a batch of samples.

        Args:
            batch: the samples (rewards ``(N,)`` float, roles, optional columns).

        Returns:
            A ``(N,)`` array or a ``{Role: (N,) array}`` dict, in the dtype of ``batch.rewards``.

        Raises:
            ValueError: a batch the strategy cannot shape (e.g. missing group ids).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement shape")

    def state_dict(self) -> dict[str, Any]:
        """State carried from batch to batch (running statistics), as JSON data, saved in every
        training checkpoint. The built-in strategies are functions of the batch and keep the
        default ``{}``; a strategy with state returns it here and takes it back in
        :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027  (optional hook: no built-in keeps state)
        """Continue from a checkpoint's :meth:`state_dict` (a resumed run)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"

