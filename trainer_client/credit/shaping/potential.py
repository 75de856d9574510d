"""``potential_based``: potential-based reward shaping (Ng, Harada & Russell 1999).

Source: A. Y. Ng, D. Harada, S. Russell, "Policy invariance under reward transformations:
theory and application to reward shaping", ICML 1999. The shaping term is
``F(s, s') = γ·Φ(s') − Φ(s)`` (their eq. for potential-based F), so the shaped reward is
``r' = r + γ·Φ(s') − Φ(s)``.

Here each sample is one role's part of one debate, collapsed to a single transition: ``s`` is
the debate's start (nothing said yet) and ``s'`` the state after the role's last turn. Every
potential has ``Φ(s) = 0``, so ``r' = r + γ·Φ(s')``, one value per (episode, role) shared by
all that role's turns. Ng et al.'s invariance result is for the full trajectory, where the
terms telescope and the potential of the absorbing state is 0; collapsed to one transition
per role the term acts as a bounded, dense bonus (for ``has_parsable_answer``, a format bonus).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import TurnReward
from trainer_client.credit.shaping.base import RewardShapingStrategy, ShapingBatch, StrategyParams
from trainer_client.credit.shaping.registry import register_strategy

__all__ = ["POTENTIALS", "PotentialBasedStrategy", "PotentialParams"]

#: Error kinds meaning "no machine-readable output", per role.
_UNREADABLE: dict[Role, frozenset[ErrorKind]] = {
    Role.SOLVER: frozenset({ErrorKind.MISSING_FINAL_ANSWER, ErrorKind.UNPARSEABLE_ANSWER}),
    Role.JUDGE: frozenset({ErrorKind.MISSING_FINAL_ANSWER, ErrorKind.UNPARSEABLE_ANSWER}),
    Role.VERIFIER: frozenset({ErrorKind.MISSING_VERDICT}),
}


def _zero(role: Role, turns: Sequence[TurnReward] | None) -> float:
    """Φ ≡ 0: rewards unchanged."""
    return 0.0


def _has_parsable_answer(role: Role, turns: Sequence[TurnReward] | None) -> float:
    """Φ(s') = 1 if the role's last turn has machine-readable output, else 0.

    Machine-readable: a boxed answer that parses (solver, judge: error kind neither
    ``missing_final_answer`` nor ``unparseable_answer``), a ``VERDICT`` line (verifier: not
    ``missing_verdict``). 0 when the turns are missing, the role did not act, or the role is
    not a debate role.
    """
    own = [turn for turn in turns or () if turn.role == role]
    if not own or role not in _UNREADABLE:
        return 0.0
    return float(own[-1].error_kind not in _UNREADABLE[role])


#: Potential of the state after a role's last turn, by ``potential_type``: ``(role, turns) -> Φ``.
POTENTIALS: dict[str, Callable[[Role, Sequence[TurnReward] | None], float]] = {
    "zero": _zero,
    "has_parsable_answer": _has_parsable_answer,
}


class PotentialParams(StrategyParams):
    """Parameters of ``potential_based``.

    Attributes:
        gamma: discount ``γ`` in ``[0, 1]``.
        potential_type: ``"zero"`` (Φ ≡ 0, rewards unchanged) or ``"has_parsable_answer"``.
    """

    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    potential_type: Literal["zero", "has_parsable_answer"] = "has_parsable_answer"


@register_strategy("potential_based")
class PotentialBasedStrategy(RewardShapingStrategy):
    """``r'_i = r_i + γ·Φ(s'_i) − Φ(s_0)``; ``s_0`` has no turns, so ``Φ(s_0) = 0``.

    Reads ``batch.turns`` (missing turns: ``Φ(s') = 0``, reward unchanged).

    Returns:
        ``(N,)`` array, dtype of ``rewards``.
    """

    Params = PotentialParams
    params: PotentialParams

    def shape(self, batch: ShapingBatch) -> np.ndarray:
        rewards, roles = batch.rewards, batch.roles
        potential = POTENTIALS[self.params.potential_type]
        phi_end = np.array([potential(role, ts) for role, ts in zip(roles, batch.turns_or_none(), strict=True)],
                           dtype=np.float64)
        phi_start = np.array([potential(role, ()) for role in roles], dtype=np.float64)
        shaped = rewards.astype(np.float64) + self.params.gamma * phi_end - phi_start
        return shaped.astype(rewards.dtype)
