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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CHANNEL_CONTRASTS", "Interval", "PairedGain", "contrast", "mean_interval", "paired_gain"]


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


def contrast(arms: Mapping[str, Sequence[Sequence[bool]] | np.ndarray], weights: Mapping[str, float],
             confidence: float = 0.95) -> PairedGain:
    """A paired contrast between arms trained on the same seeds and evaluated on the same problems.

    With ``C[a]`` the ``(S, N)`` correctness of arm ``a`` (seed ``s`` of every arm paired: the
    same warm-up, seed and problems), the contrast is ``D = Σ_a w_a · C[a]``: e.g. ``{full: 1,
    baseline: -1}`` for a channel's effect, ``{full: 1, sdpo: -1, replay: -1, baseline: 1}`` for
    the interaction of two channels (the full arm's gain beyond the sum of the single channels').
    Intervals as in :func:`paired_gain`: over seeds, the mean over problems of ``D``; over
    problems, the mean over seeds of ``D``.

    Raises:
        ValueError: an arm named in ``weights`` that is missing, or shapes that differ.
    """
    missing = [a for a in weights if a not in arms]
    if missing:
        raise ValueError(f"contrast needs arms {missing}")
    stacked = {a: np.asarray(arms[a], dtype=np.float64) for a in weights}
    shapes = {c.shape for c in stacked.values()}
    if len(shapes) != 1 or next(iter(shapes))[0] == 0 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every arm must be (S, N) with the same S >= 1 and N; got {sorted(shapes)}")
    d = sum(w * stacked[a] for a, w in weights.items())
    assert isinstance(d, np.ndarray)
    return PairedGain(mean_interval(d.mean(axis=1), confidence), mean_interval(d.mean(axis=0), confidence))


#: The factorial contrasts of the four loss-channel arms (name -> weights).
CHANNEL_CONTRASTS: dict[str, dict[str, float]] = {
    "sdpo - baseline": {"sdpo": 1.0, "baseline": -1.0},
    "replay - baseline": {"replay": 1.0, "baseline": -1.0},
    "full - baseline": {"full": 1.0, "baseline": -1.0},
    "interaction (full - sdpo - replay + baseline)": {"full": 1.0, "sdpo": -1.0, "replay": -1.0, "baseline": 1.0},
}
