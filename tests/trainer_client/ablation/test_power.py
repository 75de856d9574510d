"""The power calculation beside the ablation's statistics (``trainer_client.ablation.stats``),
checked against values computed by hand and against a simulation."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_client.ablation.stats import paired_power, required_seeds, seed_variance


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
    from trainer_client.ablation.stats import mean_interval

    rng = np.random.default_rng(0)
    sd, seeds, effect = 0.04, 6, 0.05
    hits = sum(mean_interval(rng.normal(effect, sd, seeds)).low > 0 for _ in range(4000)) / 4000
    assert hits == pytest.approx(paired_power(effect, sd, seeds), abs=0.03)


def test_paired_power_stays_a_probability_where_few_seeds_suffice() -> None:
    """scipy's noncentral t gave nan at 1-4 degrees of freedom and noncentralities above ~10 (a
    precise measurement: many samples per problem), and required_seeds then asked for more seeds
    at 1,000 problems than at 200. Power rises with the seeds and falls with the spread."""
    grid = [[paired_power(0.05, sd, seeds) for seeds in (2, 3, 4, 5)] for sd in (0.03, 0.01, 0.004, 0.001)]
    assert all(0.0 <= p <= 1.0 for row in grid for p in row)
    assert all(row[j] <= row[j + 1] + 1e-9 for row in grid for j in range(3))
    assert all(grid[i][j] <= grid[i + 1][j] + 1e-9 for i in range(3) for j in range(4))
    assert grid[3][0] > 0.99 and required_seeds(0.05, 0.001) == 2
    sds = [np.sqrt(2 * (1e-5 + 0.0078 / n)) for n in (200, 500, 1000)]  # a measured case
    assert [required_seeds(0.05, sd) for sd in sds] == sorted((required_seeds(0.05, sd) for sd in sds), reverse=True)


def test_the_power_script_reads_an_ablations_runs_and_sizes_the_next_experiment(tmp_path, capsys) -> None:
    """``scripts/power_calculation.py`` on an ablation folder of three finished runs (their
    ``result.json`` as ``save_run`` writes it): the variance split of each metric and the seeds
    needed, the sampled metric extrapolated to other sample counts."""
    import importlib.util
    import json
    from pathlib import Path

    from trainer_client.ablation.runs import RunResult, save_run

    rng = np.random.default_rng(1)
    for seed in range(3):
        greedy = (rng.random(50) < 0.4 + 0.05 * seed).tolist()
        sampled = (rng.integers(0, 9, 50) / 8).tolist()
        heldout = {"accuracy": float(np.mean(greedy)), "k": 8, "debate_k": 0}
        save_run(tmp_path / "runs" / "baseline" / f"seed{seed}",
                 RunResult("baseline", seed, 1.0, 1, False, [], {}, 0.0, heldout, greedy,
                           per_problem={"accuracy": [float(x) for x in greedy], "sampled_accuracy": sampled}),
                 "h", {})
    spec = importlib.util.spec_from_file_location("power_calculation",
                                                  Path(__file__).resolve().parents[3] / "scripts" / "power_calculation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(tmp_path), "--arm", "baseline", "--json", str(tmp_path / "power.json")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "power.json").read_text())
    greedy = result["metrics"]["accuracy"]
    assert greedy["seeds"] == 3 and greedy["problems"] == 50 and set(result["metrics"]) == {"accuracy",
                                                                                           "sampled_accuracy"}
    x = np.array([json.loads((tmp_path / "runs" / "baseline" / f"seed{s}" / "result.json").read_text())["result"]
                  ["correct"] for s in range(3)], dtype=float)
    assert greedy["within"] == pytest.approx(x.var(axis=0, ddof=1).mean())
    needed = greedy["required"]
    assert needed["measured, N=1000"] <= needed["measured, N=500"] <= needed["measured, N=200"]
    sampled = result["metrics"]["sampled_accuracy"]["required"]
    assert sampled["k=16, N=200"] <= sampled["k=8, N=200"] <= sampled["k=1, N=200"]
