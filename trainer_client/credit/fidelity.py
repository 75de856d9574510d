"""Credit fidelity: does each role's advantage point the way its own turn went?

A credit scheme gives every trained turn an advantage; the turn itself was right or wrong by the
server's per-turn reward (``TurnReward.reward``: the solver's answer graded, the verifier's verdict
against the truth of the answer it reviewed). For role ``r``, over the turns of ``r`` in a batch
whose advantage is not zero,

    fidelity_r = mean( sign(A_t) == (+1 if reward_t > 0.5 else -1) )

(0.5 is chance: an advantage unrelated to the turn's own outcome). ``signal_r`` is the share of
``r``'s turns whose advantage is not zero (a group of equal rewards gives 0). Under the ``identity``
credit every role's turns get the episode's outcome (the judge's final answer), so a solver whose
slip the debate repaired is rewarded for the slip: its fidelity measures how often that happens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards

__all__ = ["credit_fidelity"]

#: Advantages whose magnitude is below this count as zero (no sign).
ZERO = 1e-8


def credit_fidelity(records: Sequence[EpisodeRewards], per_turn: Sequence[np.ndarray]) -> dict[str, float]:
    """Fidelity and signal per trained role of one batch.

    Args:
        records: ``B`` graded records (their turns' ``reward`` is each turn's own outcome).
        per_turn: ``B`` arrays, each turn's advantage (indexed by ``t``; judge turns are ignored).

    Returns:
        ``{"credit/fidelity/<role>": ..., "credit/signal/<role>": ...}`` for the solver and the
        verifier where the batch has turns of that role (fidelity only where some advantage is
        not zero).

    Raises:
        ValueError: the lengths differ, or an advantage array is shorter than its record's turns.
    """
    if len(records) != len(per_turn):
        raise ValueError(f"{len(records)} records for {len(per_turn)} advantage rows")
    agree: dict[Role, list[bool]] = {Role.SOLVER: [], Role.VERIFIER: []}
    turns: dict[Role, int] = {Role.SOLVER: 0, Role.VERIFIER: 0}
    for record, values in zip(records, per_turn, strict=True):
        if len(values) < len(record.turns):
            raise ValueError(f"episode {record.episode_id}: {len(values)} advantages for {len(record.turns)} turns")
        for turn in record.turns:
            if turn.role not in agree:
                continue
            turns[turn.role] += 1
            advantage = float(values[turn.t])
            if abs(advantage) > ZERO:
                agree[turn.role].append((advantage > 0) == (turn.reward > 0.5))
    metrics: dict[str, float] = {}
    for role, count in turns.items():
        if count:
            metrics[f"credit/signal/{role.value}"] = len(agree[role]) / count
            if agree[role]:
                metrics[f"credit/fidelity/{role.value}"] = float(np.mean(agree[role]))
    return metrics
