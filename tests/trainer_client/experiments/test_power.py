"""The power calculation beside the ablation's statistics (``trainer_client.experiments.stats``),
checked against values computed by hand and against a simulation."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_client.experiments.stats import paired_power, required_seeds, seed_variance


def test_seed_variance_splits_the_across_seed_variance_by_hand() -> None:
    # 3 seeds x 4 problems; per-problem variances across seeds (ddof 1): [0, 1/3, 1/3, 0] -> within 1/6
    x = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]], dtype=float)
    # seed means 0.5, 0.5, 0.75: variance (ddof 1) 1/48; minus within / N = 1/24: below 0, floored
    v = seed_variance(x)
    assert v.within == pytest.approx(1 / 6) and v.between == 0.0 and (v.seeds, v.problems) == (3, 4)
    assert v.difference_sd(4) == pytest.approx(np.sqrt(2 * (1 / 6) / 4))
    # a seed effect: every problem of seed s shifted alike (the same per-problem spread as before)
    y = np.array([[0.2] * 4, [0.4] * 4, [0.6] * 4])
    assert seed_variance(y).within == pytest.approx(0.04) and seed_variance(y).between == pytest.approx(0.04 - 0.01)
    with pytest.raises(ValueError, match="S >= 2"):
        seed_variance(x[:1])


def test_paired_power_is_the_noncentral_t_power_of_textbooks() -> None:
    # Cohen's d = 1 with n = 10 pairs, two-sided alpha 0.05: power 0.803 (G*Power, one-sample t test)
    assert paired_power(0.05, 0.05, 10) == pytest.approx(0.803, abs=0.002)
    assert required_seeds(0.05, 0.05) == 10
    # no effect: the test's own size
    assert paired_power(0.0, 0.05, 10) == pytest.approx(0.05, abs=1e-9)
    with pytest.raises(ValueError):
        paired_power(0.05, 0.0, 5)


def test_power_agrees_with_a_simulation_of_seed_level_intervals() -> None:
    from trainer_client.experiments.stats import mean_interval

    rng = np.random.default_rng(0)
    sd, seeds, effect = 0.04, 6, 0.05
    hits = sum(mean_interval(rng.normal(effect, sd, seeds)).low > 0 for _ in range(4000)) / 4000
    assert hits == pytest.approx(paired_power(effect, sd, seeds), abs=0.03)
