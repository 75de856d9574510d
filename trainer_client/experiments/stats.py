"""Interval estimates for ``mathdebate ablate``: means over seeds and paired accuracy gains.

Two sources of noise in "training raised held-out accuracy by g points": which problems are in
the held-out set, and which seed the run had. Both are reported:

- :func:`mean_interval`: Student-t interval of a mean over seeds (``n - 1`` degrees of
  freedom; with 3 seeds ``t = 4.30``, so it is wide unless the seeds agree);
- :func:`paired_gain`: the gain after − before, paired on the same problems. The seed-level
  interval is the t interval of the per-seed gains (each seed's gain is itself paired over the
  same held-out problems, against the same warm-up policy); the problem-level interval is the
  t interval of the per-problem differences ``d_i = mean_s(after_{s,i}) − before_i`` (the
  paired-samples interval of a difference in proportions). The target of the learning
  experiment is judged on the seed-level bound, the more conservative of the two when seeds
  disagree.

``scipy.stats.t`` gives the quantiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Interval", "PairedGain", "mean_interval", "paired_gain"]


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided confidence interval (``low == high == mean`` with one value)."""

    mean: float
    low: float
    high: float

    def points(self) -> str:
        """As percentage points: ``"+24.1 [15.2, 33.0]"``."""
        return f"{100 * self.mean:+.1f} [{100 * self.low:+.1f}, {100 * self.high:+.1f}]"


@dataclass(frozen=True)
class PairedGain:
    """A paired gain in accuracy (fractions, not points).

    Attributes:
        by_seed: interval over the per-seed gains.
        by_problem: interval over the per-problem differences (seeds averaged first).
    """

    by_seed: Interval
    by_problem: Interval


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``values``.

    Args:
        values: one value per seed (or per problem), at least one.
        confidence: two-sided level in ``(0, 1)``.

    Returns:
        The mean with ``mean ± t_{(1+c)/2, n-1} · s / √n`` (sample std ``s``); with one value
        the interval is the value itself.

    Raises:
        ValueError: no values.
    """
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("an interval needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, mean, mean)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return Interval(mean, mean - half, mean + half)


def paired_gain(before: Sequence[bool] | np.ndarray, after: Sequence[Sequence[bool]] | np.ndarray,
                confidence: float = 0.95) -> PairedGain:
    """The paired gain of ``after`` over ``before`` on the same problems.

    Args:
        before: ``(N,)`` bool, each problem's correctness under the starting policy.
        after: ``(S, N)`` bool, each seed's trained policy's correctness on the same problems.
        confidence: two-sided level.

    Returns:
        :class:`PairedGain` (see the module docstring).

    Raises:
        ValueError: shapes that do not pair, or no seeds.
    """
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 1 or a.shape[1] != b.shape[0] or a.shape[0] == 0:
        raise ValueError(f"before must be (N,) and after (S, N) with S >= 1; got {b.shape} and {a.shape}")
    by_seed = mean_interval(a.mean(axis=1) - b.mean(), confidence)
    by_problem = mean_interval(a.mean(axis=0) - b, confidence)
    return PairedGain(by_seed, by_problem)
