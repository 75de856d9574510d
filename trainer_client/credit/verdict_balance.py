"""Class-balanced verdict credit (``verdict_balance: batch``): each verifier turn's advantage is
weighted by the inverse frequency, in the batch, of the class of the answer it reviewed, so that
a verifier reviewing mostly right answers (a solver that improves) is not credited mostly for
accepting. The form of RL Tango (Zha et al. 2025, arXiv 2505.15034), which weights the
verifier's loss by inverse class frequency and reports balanced accuracy.

With ``n_c`` the batch's verifier turns reviewing an answer of class ``c`` (right or wrong; a turn
whose reviewed answer's grading timed out has no class and keeps weight 1), ``N = Σ_c n_c`` and
``K`` the number of classes present::

    w_c = N / (K · n_c)          (so Σ_c n_c · w_c = N: the mean weight over the turns is 1)

and a verifier turn's advantage ``A`` becomes ``w_c · A``. For the clipped policy-gradient loss of
GRPO this is the turn's loss weighted by ``w_c`` (a positive factor passes through ``min`` and the
clip on the ratio). A missing verdict counts in the class of the answer it did not review.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.verdicts import reviewed_verdicts

__all__ = ["VERDICT_BALANCES", "balance_verdict_credit", "verdict_class_weights"]

#: ``verdict_balance`` settings: ``none`` (off) or ``batch`` (class frequencies of the batch).
VERDICT_BALANCES = ("none", "batch")


def _reviewed_classes(record: EpisodeRewards) -> dict[int, bool]:
    """``{t: reviewed answer right}`` for each verifier turn of ``record`` with a known class."""
    return {t: right for t, right, _ in reviewed_verdicts(record)}


def verdict_class_weights(records: Sequence[EpisodeRewards]) -> dict[bool, float]:
    """``{reviewed answer right: w_c}`` over the verifier turns of ``records`` (module docstring);
    ``{}`` when no verifier turn has a class."""
    counts = {True: 0, False: 0}
    for record in records:
        for right in _reviewed_classes(record).values():
            counts[right] += 1
    present = {c: n for c, n in counts.items() if n}
    total = sum(present.values())
    return {c: total / (len(present) * n) for c, n in present.items()}


def balance_verdict_credit(records: Sequence[EpisodeRewards], per_turn: Sequence[np.ndarray],
                           dropped: Sequence[bool]) -> tuple[list[np.ndarray], dict[str, float]]:
    """Each verifier turn's advantage times its class weight.

    Args:
        records: every rollout's graded record, in batch order.
        per_turn: per rollout, its ``(T_k,)`` per-turn advantages (indexed by ``t``).
        dropped: per rollout, whether it left the batch (a failed episode): it neither counts in
            the class frequencies nor is weighted.

    Returns:
        ``(per_turn weighted, metrics)``: new arrays in the same dtype;
        ``credit/verdict_weight/right`` and ``/wrong`` (the weights, where the class is present).

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(records) == len(per_turn) == len(dropped):
        raise ValueError(f"{len(records)} records, {len(per_turn)} advantage rows, {len(dropped)} flags")
    weights = verdict_class_weights([r for r, out in zip(records, dropped, strict=True) if not out])
    weighted = []
    for record, values, out in zip(records, per_turn, dropped, strict=True):
        values = values.copy()
        if not out:
            for t, right in _reviewed_classes(record).items():
                values[t] = values[t] * values.dtype.type(weights[right])
        weighted.append(values)
    metrics = {f"credit/verdict_weight/{'right' if c else 'wrong'}": w for c, w in weights.items()}
    return weighted, metrics
