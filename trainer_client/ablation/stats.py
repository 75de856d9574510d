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

Power (:func:`seed_variance`, :func:`paired_power`, :func:`required_seeds`): how many seeds a
paired comparison of two arms needs to see an effect with a seed-level interval. With
``X[s, i]`` the correctness (or the mean over ``k`` samples) of seed ``s`` on problem ``i``, one
seed's accuracy on ``N`` problems is ``acc_s = mu + u_s + e_s``: ``u_s`` the seed's effect on the
accuracy over all problems (variance ``sigma_u^2``), ``e_s`` how that seed's model happens to do
on these ``N`` problems (variance ``tau^2 / N``, ``tau^2`` the mean over problems of the variance
of ``X[s, i]`` across seeds). The difference of two arms on one seed, taken independent, has
variance ``2 (sigma_u^2 + tau^2 / N)``, and the seed-level test is a one-sample t test of ``S``
such differences (power from the noncentral t distribution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CHANNEL_CONTRASTS", "Interval", "PairedGain", "SeedVariance", "contrast", "mean_interval", "paired_gain",
           "paired_power", "required_seeds", "seed_variance"]


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


def paired_gain(before: Sequence[bool] | Sequence[float] | np.ndarray,
                after: Sequence[Sequence[bool]] | Sequence[Sequence[float]] | np.ndarray,
                confidence: float = 0.95) -> PairedGain:
    """The paired gain of ``after`` over ``before`` on the same problems.

    Args:
        before: ``(N,)`` bool or float, each problem's correctness under the starting policy (a
            float: a mean over samples).
        after: ``(S, N)`` bool or float, each seed's trained policy's correctness on the same problems.
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


@dataclass(frozen=True)
class SeedVariance:
    """The two variance components of one arm's accuracy across seeds (fractions squared).

    Attributes:
        between: ``sigma_u^2``, the variance across seeds of the accuracy over all problems.
        within: ``tau^2``, the mean over problems of the across-seed variance of a problem's
            correctness; it enters one seed's accuracy on ``N`` problems as ``tau^2 / N``.
        seeds, problems: the measurement's size.
    """

    between: float
    within: float
    seeds: int
    problems: int

    def difference_sd(self, problems: int) -> float:
        """The standard deviation of one seed's paired difference of two arms on ``problems``
        problems: ``sqrt(2 (between + within / problems))``."""
        return float(np.sqrt(2.0 * (self.between + self.within / problems)))


def seed_variance(correct: Sequence[Sequence[float]] | np.ndarray) -> SeedVariance:
    """The variance components of ``correct`` (see the module docstring).

    Args:
        correct: ``(S, N)`` float, seed ``s``'s correctness on problem ``i`` (0/1, or a mean over
            samples), ``S >= 2``.

    Returns:
        :class:`SeedVariance`; ``between`` is the observed variance of the seed means less
        ``within / N``, floored at 0 (a method-of-moments estimate).

    Raises:
        ValueError: fewer than two seeds, or not a 2-D array.
    """
    x = np.asarray(correct, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] == 0:
        raise ValueError(f"seed_variance needs (S, N) with S >= 2 seeds; got shape {x.shape}")
    within = float(x.var(axis=0, ddof=1).mean())
    observed = float(x.mean(axis=1).var(ddof=1))
    return SeedVariance(max(observed - within / x.shape[1], 0.0), within, x.shape[0], x.shape[1])


def paired_power(effect: float, difference_sd: float, seeds: int, confidence: float = 0.95) -> float:
    """Power of the two-sided seed-level t test of a paired difference.

    Args:
        effect: the true mean difference (fraction, e.g. 0.05 for 5 points).
        difference_sd: the standard deviation of one seed's difference
            (:meth:`SeedVariance.difference_sd`).
        seeds: paired seeds ``S >= 2``.
        confidence: the interval's level.

    Returns:
        ``P(|T| > t_{(1+c)/2, S-1})`` with ``T`` noncentral t, ``S - 1`` degrees of freedom and
        noncentrality ``effect / (difference_sd / sqrt(S))``: the chance that the interval
        excludes 0.

    Raises:
        ValueError: fewer than two seeds or a non-positive standard deviation.
    """
    from scipy import stats

    if seeds < 2 or difference_sd <= 0:
        raise ValueError(f"power needs seeds >= 2 and difference_sd > 0; got {seeds}, {difference_sd}")
    from scipy import integrate

    df = seeds - 1
    noncentrality = effect / (difference_sd / np.sqrt(seeds))
    critical = stats.t.ppf((1 + confidence) / 2, df)

    # T = (Z + nc) / sqrt(V / df), V ~ chi2(df): integrate the normal tails over V. scipy's
    # ``nct.sf`` returns nan for 1-4 degrees of freedom at noncentralities above about 10
    # (scipy 1.17), exactly where a precise measurement needs few seeds.
    def rejects(v: float) -> float:
        scale = critical * np.sqrt(v / df)
        return float((stats.norm.sf(scale - noncentrality) + stats.norm.cdf(-scale - noncentrality)) * stats.chi2.pdf(v, df))

    value, _ = integrate.quad(rejects, 0.0, np.inf, limit=200)
    return float(min(max(value, 0.0), 1.0))


def required_seeds(effect: float, difference_sd: float, power: float = 0.8, confidence: float = 0.95,
                   max_seeds: int = 1000) -> int:
    """The fewest paired seeds whose seed-level test (:func:`paired_power`) reaches ``power``.

    Raises:
        ValueError: not reached within ``max_seeds``.
    """
    for seeds in range(2, max_seeds + 1):
        if paired_power(effect, difference_sd, seeds, confidence) >= power:
            return seeds
    raise ValueError(f"power {power} for an effect of {effect} is not reached with {max_seeds} seeds")
