"""The reward-shaping contract: the typed batch, the strategy ABC, its params model.

A shaping batch (:class:`ShapingBatch`) holds ``B`` *items*, one per (rollout, role) pair: for
each debate rollout, every role that acted in it is one item (see
:func:`trainer_client.role_mapping.build_role_items`). Its fields, each of length ``B``:

    rewards: ``np.ndarray`` of shape ``(B,)``, a float dtype. Item ``i``'s raw correctness,
        i.e. the episode reward ``G`` (0/1) of the debate item ``i`` belongs to.
    roles: item ``i``'s :class:`~env_server.markers.Role` (strings are converted; an unknown
        role is a ``ValueError``).
    group_ids: hashable id per item; items of rollouts of the same prompt share a group id.
        Per-role groups are (group id, role) pairs. Required by group-based strategies.
        ``None`` = not given.
    facts: ``CounterfactualFacts | None`` per item, the facts of the item's episode (``None`` =
        facts missing).
    turns: ``Sequence[TurnReward] | None`` per item, all graded turns of the item's episode
        ordered by ``t``. Used by state potentials.
    verifier_accept_prob: ``float | None`` per item, read on verifier items only (any value
        elsewhere is ignored): ``π(accept | τ)``, the probability in ``[0, 1]`` that the policy
        gave the verdict ``VERDICT: CORRECT`` on the verifier's first turn of the item's episode
        (its review of the solver's first answer); ``π(reject) = 1 − π(accept)``. ``None`` =
        not known. Filled by the trainer only for strategies that list it in
        :attr:`RewardShapingStrategy.extra_columns` (it costs a forward pass). Used by
        ``coma_advantage``.

Output of :meth:`RewardShapingStrategy.shape`: either one array of shape ``(B,)`` (a value per
item, indexed directly), or a dict ``{Role: array (B,)}``. A per-role array fills **all** ``B``
indices: entry ``i`` is the shaped reward that role would get in item ``i``'s episode. The
mapping into the gradient path then gives item ``i`` with role ``r`` the value
``shaped[r][i]``; a role missing from the dict keeps its raw reward. Returned arrays have the
input's dtype; inputs are never mutated.

Judge items get 0 after shaping whatever a strategy returns, and never enter a group
statistic: the judge is evaluated, not trained.
"""

from __future__ import annotations

import warnings
from abc import ABC
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
from pydantic import BaseModel, ConfigDict

from env_server.markers import Role

if TYPE_CHECKING:
    from env_server.models import CounterfactualFacts, TurnReward

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
"""A ``(B,)`` array, or ``{Role: (B,) array}``; see the module docstring."""


def role_mask(roles: Sequence[Role], role: Role) -> np.ndarray:
    """``(B,)`` bool mask of ``roles[i] is role`` (see :meth:`ShapingBatch.is_role`)."""
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
    """A typed shaping batch of ``B`` (rollout, role) items (see the module docstring).

    Attributes:
        rewards: ``(B,)`` float array, the episode reward ``G`` of each item; never mutated.
        roles: length ``B``, :class:`Role` per item.
        group_ids: length ``B`` hashable ids, or ``None``.
        facts: length ``B``, ``CounterfactualFacts | None`` per item, or ``None`` (all missing).
        turns: length ``B``, the episode's ``TurnReward`` list (or ``None``) per item, or ``None``.
        verifier_accept_prob: length ``B``, ``float | None`` per item, or ``None``.

    Raises:
        TypeError: ``rewards`` is not a float ndarray.
        ValueError: ``rewards`` is not 1-D, a column's length is not ``B``, or an unknown role.
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
            raise ValueError(f"rewards must have shape (B,), got {rewards.shape}")
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
        """``(B,)`` bool mask of the items of ``role``. (Never build it as ``np.array(roles) ==
        role``: numpy compares with ``str(role)``, i.e. ``"Role.SOLVER"``, and finds nothing.)"""
        return role_mask(self.roles, role)

    def present_roles(self, roles: Sequence[Role] = TRAINED_ROLES) -> list[Role]:
        """The roles of ``roles`` that have at least one item, in the order of ``roles``."""
        have = set(self.roles)
        return [r for r in roles if r in have]

    def facts_or_none(self) -> tuple[CounterfactualFacts | None, ...]:
        """``facts``, or ``None`` for every item when the column is missing."""
        return self.facts if self.facts is not None else (None,) * len(self)

    def turns_or_none(self) -> tuple[Sequence[TurnReward] | None, ...]:
        """``turns``, or ``None`` for every item when the column is missing."""
        return self.turns if self.turns is not None else (None,) * len(self)

    def accept_probs_or_none(self) -> tuple[Any, ...]:
        """``verifier_accept_prob``, or ``None`` for every item when the column is missing."""
        if self.verifier_accept_prob is not None:
            return self.verifier_accept_prob
        return (None,) * len(self)

    @classmethod
    def from_columns(cls, rewards: np.ndarray, role_labels: Sequence[Role | str],
                     metadata: Mapping[str, Sequence[Any]]) -> ShapingBatch:
        """The batch of the column form ``(rewards, role_labels, {field name: column})`` used
        before 0.5 (deprecated ``shape_rewards``).

        Raises:
            ValueError: an unknown column name, plus everything the constructor raises.
        """
        names = {f.name for f in fields(cls)} - {"rewards", "roles"}
        unknown = sorted(set(metadata) - names)
        if unknown:
            raise ValueError(f"unknown shaping columns {unknown}; known: {sorted(names)}")
        columns: dict[str, Any] = {k: tuple(metadata[k]) for k in metadata}
        return cls(rewards, cast(tuple[Role, ...], tuple(role_labels)), **columns)  # converted in __post_init__

    def as_columns(self) -> dict[str, Sequence[Any]]:
        """The given optional fields as ``{field name: column}`` (the pre-0.5 metadata form)."""
        return {name: getattr(self, name) for name in ("group_ids", "facts", "turns", "verifier_accept_prob")
                if getattr(self, name) is not None}


class StrategyParams(BaseModel):
    """Base of every strategy's params model: unknown keys and bad values fail validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RewardShapingStrategy(ABC):
    """A reward-shaping strategy (see the module docstring for the full contract).

    Subclasses set ``Params`` to their :class:`StrategyParams` model, implement :meth:`shape`,
    and are registered with :func:`trainer_client.shaping.registry.register_strategy`, which
    sets ``name``. (A subclass that implements only the pre-0.5 ``shape_rewards(rewards,
    role_labels, metadata)`` still works, with a ``DeprecationWarning`` when it is defined.)

    Args:
        **params: the strategy's parameters, validated by ``Params``.

    Raises:
        pydantic.ValidationError: unknown or invalid parameters.
        TypeError: the class implements neither ``shape`` nor ``shape_rewards``.
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "shape_rewards" in own and "shape" not in own:
            warnings.warn(f"{cls.__qualname__}: shape_rewards(rewards, role_labels, metadata) is deprecated; implement "
                          "shape(batch: ShapingBatch) instead", DeprecationWarning, stacklevel=2)
            legacy = own["shape_rewards"]

            def shape(self: RewardShapingStrategy, batch: ShapingBatch) -> ShapedRewards:
                return legacy(self, batch.rewards, [r.value for r in batch.roles], batch.as_columns())

            cls.shape = shape  # type: ignore[method-assign]  # adapter for a pre-0.5 subclass

    def shape(self, batch: ShapingBatch) -> ShapedRewards:
        """Shape the raw rewards of a batch of items.

        Args:
            batch: the items (rewards ``(B,)`` float, roles, optional columns).

        Returns:
            A ``(B,)`` array or a ``{Role: (B,) array}`` dict, in the dtype of ``batch.rewards``.

        Raises:
            ValueError: a batch the strategy cannot shape (e.g. missing group ids).
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither shape nor shape_rewards")

    def shape_rewards(self, rewards: np.ndarray, role_labels: Sequence[Role | str],
                      metadata: Mapping[str, Sequence[Any]]) -> ShapedRewards:
        """Deprecated column form of :meth:`shape` (``metadata`` maps field names to columns)."""
        warnings.warn("shape_rewards(rewards, role_labels, metadata) is deprecated; call shape(ShapingBatch(...))",
                      DeprecationWarning, stacklevel=2)
        return self.shape(ShapingBatch.from_columns(rewards, role_labels, metadata))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"

