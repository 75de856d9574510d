"""The contract of a loss channel beside GRPO, and their registry.

The trainer's loss is ``total = grpo + Σ_i weight_i · loss_i`` (``trainer.compute_loss``).
Each extra term is an :class:`LossChannel`:

1. :meth:`LossChannel.bind` once, when the trainer is built (the tokenizer, the chat
   template, the accelerator: whatever the term needs from it).
2. :meth:`LossChannel.prepare` once per generation batch, after the advantages are known and
   before TRL shuffles and splits the batch: it reads a :class:`ScoredBatch` (the graded
   records, the environments, the turn segments of every rollout) and may

   - add per-rollout columns to the batch (``batch.output[key]``: a list or a tensor with one
     row per rollout, so TRL splits it with the rest), e.g. hint distillation's error sites;
   - return a ``(B, T)`` multiplier of the GRPO term's loss mask (``grpo_mask``): a term that
     takes some tokens away from GRPO (routing failed rollouts to distillation and correct ones
     to GRPO, as SRPO does) says so here;
   - start background work (trace replay's teacher requests).
3. :meth:`LossChannel.loss` once per micro-batch: ``(loss tensor or None, metrics)``. It may
   reuse the policy's own GRPO forward over the micro-batch (:attr:`LossContext.policy_forward`,
   captured when :meth:`LossChannel.wants_policy_forward` says so). The trainer adds
   ``weight · loss / accumulation`` (TRL's own scaling of its term) and logs ``metrics``.

What a term costs is logged for it: ``time/<cost_key>_s`` per optimiser step (its ``prepare``,
its ``loss`` and its part of the backward) beside the step's ``memory/peak_gib``
(:mod:`trainer_client.losses.costs`).

A term acts on the tokens of the roles in :attr:`LossChannel.roles` only (per-role policies
give each role's tokens to its own term). Register a new term with
:func:`register_channel` and turn it on from the config (``channels: [{name: ...,
weight: ..., params: {...}}]``); ``tests/trainer_client/losses/test_base.py`` builds one with a
hand-computed value. A term with state that a resumed run needs (a random stream, a store)
saves it through :meth:`LossChannel.state_dict` and takes it back in
:meth:`LossChannel.load_state_dict` (:mod:`trainer_client.training.checkpoints`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from env_server.protocol.markers import Role
from trainer_client.credit.shaping.base import TRAINED_ROLES

if TYPE_CHECKING:
    import torch

    from env_server.protocol.models import EpisodeRewards
    from trainer_client.rollout.segments import Segment
    from trainer_client.trl_compat import CapturedForward

__all__ = [
    "RENAMED_CHANNELS",
    "LossChannel",
    "LossContext",
    "ScoredBatch",
    "available_channels",
    "build_channel",
    "channel_class",
    "register_channel",
]


@dataclass
class ScoredBatch:
    """One generation batch on this process, after scoring (what :meth:`LossChannel.prepare` reads).

    Attributes:
        output: TRL's batch dict (``prompt_ids`` ``(B, P)``, ``prompt_mask``, ``completion_ids``
            ``(B, T)``, ``completion_mask``, ``tool_mask``, ``advantages`` ``(B, T)``, ...); the
            term may add per-rollout columns.
        records: ``B`` graded records (after the reward pipeline's rewrites of ``G``).
        environments: ``B`` ``DebateEnvironment`` instances (their ``trace``).
        segments: per rollout, its completion segments (``None``: not aligned, outside the loss).
        completions: per rollout, its completion messages (TRL's conversational format).
        mode: ``"train"`` or ``"eval"``.
        step: the optimiser step (``state.global_step``).
    """

    output: dict[str, Any]
    records: Sequence[EpisodeRewards]
    environments: Sequence[Any]
    segments: Sequence[Sequence[Segment] | None]
    completions: Sequence[Sequence[dict[str, Any]]]
    mode: str
    step: int


@dataclass
class LossContext:
    """What :meth:`LossChannel.loss` gets besides the model and the micro-batch.

    Attributes:
        mode: ``"train"`` or ``"eval"``.
        accumulation: gradient-accumulation steps of this optimiser step (1 outside training).
        step: the optimiser step.
        policy_forward: the policy's GRPO forward over this micro-batch
            (:func:`~trainer_client.trl_compat.capture_body_forward`), when a term asked for it
            and it ran exactly once; else ``None``.
    """

    mode: str
    accumulation: int
    step: int
    policy_forward: CapturedForward | None = None


class LossChannel(ABC):
    """One extra loss term: ``weight · loss`` is added to GRPO's (see the module docstring).

    Args:
        weight: the term's weight in ``total`` (``α``, ``β``, ...); 0 turns it off.
        roles: the roles whose tokens the term acts on (default: the trained roles).

    Attributes:
        name: the registry name (set by :func:`register_channel`).
        metric: the key its value is logged under (e.g. ``loss/sdpo_jsd``).
        cost_key: its seconds per step are logged as ``time/<cost_key>_s``
            (:mod:`trainer_client.losses.costs`; empty: ``name``).
    """

    name: ClassVar[str] = ""
    metric: ClassVar[str] = ""
    cost_key: ClassVar[str] = ""

    @property
    def cost_name(self) -> str:
        """The ``<key>`` of ``time/<key>_s``: :attr:`cost_key`, else the registry name, else the class name."""
        return self.cost_key or self.name or type(self).__name__

    def __init__(self, weight: float, roles: Sequence[Role | str] | None = None) -> None:
        self.weight = float(weight)
        self.roles: frozenset[Role] = frozenset(Role(r) for r in roles) if roles is not None else frozenset(TRAINED_ROLES)

    def bind(self, trainer: Any) -> None:  # noqa: B027  (optional hook: most terms need nothing)
        """Called once with the trainer (a ``DebateGRPOTrainer``) when it is built."""

    def prepare(self, batch: ScoredBatch) -> torch.Tensor | None:
        """Read one scored generation batch (see the module docstring).

        Returns:
            ``None``, or a ``(B, T)`` multiplier (0/1) of the GRPO term's loss mask.
        """
        return None

    def wants_policy_forward(self, inputs: dict[str, Any]) -> bool:
        """Whether :meth:`loss` would reuse the policy's GRPO forward over ``inputs``."""
        return False

    @abstractmethod
    def loss(self, model: torch.nn.Module, inputs: dict[str, Any],
             context: LossContext) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The term on one micro-batch.

        Returns:
            ``(loss, metrics)``: a scalar tensor with its graph (``None``: nothing to add on this
            micro-batch) and values to log (``{metric: value}``; a key left out is not logged).
        """

    def batch_metrics(self) -> dict[str, float]:
        """Counters logged once per generation batch (e.g. a teacher pool's)."""
        return {}

    def finish(self) -> None:  # noqa: B027  (optional hook)
        """Called after training (e.g. store the last pairs)."""

    def state_dict(self) -> dict[str, Any]:
        """The term's state as JSON data, saved in every checkpoint (called on the training
        thread after the step's optimiser update; a term may first finish its background work so
        that the checkpoint holds it, as trace replay stores the pairs its teachers finish).
        Terms without state keep the default ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027  (optional hook)
        """Continue from a checkpoint's :meth:`state_dict` (a resumed run; called once, after
        :meth:`bind`)."""


_REGISTRY: dict[str, type[LossChannel]] = {}
L = TypeVar("L", bound=type[LossChannel])


def register_channel(name: str) -> Callable[[L], L]:
    """Class decorator: register an :class:`LossChannel` under ``name`` (sets ``cls.name``).

    Raises:
        ValueError: ``name`` is taken by another class.
    """
    def register(cls: L) -> L:
        if _REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"loss channel {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return register


def available_channels() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


#: Registry names of built-in channels that were renamed: the old name fails with one line naming the new.
RENAMED_CHANNELS = {"hint_distillation": "sdpo_hint_distill"}


def channel_class(name: str) -> type[LossChannel]:
    """The class registered as ``name``, or importable as ``"package.module:Class"``.

    Raises:
        KeyError: an unknown name (the message lists the registered ones), or a renamed one
            (:data:`RENAMED_CHANNELS`; the message names the new one).
        ImportError, AttributeError: a ``module:Class`` path that does not import.
        TypeError: the object found is not an :class:`LossChannel` subclass.
    """
    if ":" in name and name not in _REGISTRY:
        import importlib

        module, _, attr = name.partition(":")
        found = getattr(importlib.import_module(module), attr)
        if not (isinstance(found, type) and issubclass(found, LossChannel)):
            raise TypeError(f"{name} is not an LossChannel subclass")
        return found
    if name in RENAMED_CHANNELS:
        raise KeyError(f"loss channel {name!r} is now {RENAMED_CHANNELS[name]!r}")
    if name not in _REGISTRY:
        raise KeyError(f"unknown loss channel {name!r}; registered: {', '.join(available_channels()) or 'none'}")
    return _REGISTRY[name]


def build_channel(name: str, weight: float, params: dict[str, Any] | None = None,
                         roles: Sequence[Role | str] | None = None) -> LossChannel:
    """An instance of the term ``name`` (see :func:`channel_class`) with ``params``."""
    return channel_class(name)(weight=weight, roles=roles, **(params or {}))

