"""Two ablation folders' runs of one arm compared, on hand-written ``result.json`` files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_client.ablation.compare_runs import compare_ablations
from trainer_client.ablation.runs import RunResult, save_run


def _folder(root: Path, correct_by_seed: dict[int, list[bool]]) -> Path:
    for seed, correct in correct_by_seed.items():
        result = RunResult("baseline", seed, 10.0 + seed, 5, False, [], {"debate/reward/solver": 0.5, "step_time": 2.0},
                           0.0, {"accuracy": sum(correct) / len(correct)}, correct)
        save_run(root / "runs" / "baseline" / f"seed{seed}", result, "h", {})
    return root


def test_the_difference_is_paired_by_seed_and_problem(tmp_path) -> None:
    # seed 0: 3/4 against 1/4 (+0.5); seed 1: 2/4 against 2/4 (0); seed 2 only in the first folder
    first = _folder(tmp_path / "a", {0: [True, True, True, False], 1: [True, True, False, False],
                                     2: [True, True, True, True]})
    second = _folder(tmp_path / "b", {0: [True, False, False, False], 1: [False, True, True, False]})
    result = compare_ablations(first, second)
    assert result["seeds"] == [0, 1]
    mean, low, high = result["difference"]["by_seed"]
    assert mean == pytest.approx(0.25)  # (0.5 + 0) / 2
    # t(0.975, 1 df) = 12.706; the two seeds' differences 0.5 and 0 have sd 0.3536, se 0.25
    assert (low, high) == pytest.approx((0.25 - 12.706 * 0.25, 0.25 + 12.706 * 0.25), abs=1e-3)
    # per problem, seeds averaged: differences (0, 1, 1, 0) and (1, 0, -1, 0) -> (0.5, 0.5, 0, 0)
    mean, low, high = result["difference"]["by_problem"]
    assert mean == pytest.approx(0.25)
    # sd of (0.5, 0.5, 0, 0) = 0.2887, se 0.1443, t(0.975, 3 df) = 3.182
    assert (low, high) == pytest.approx((0.25 - 3.182 * 0.1443, 0.25 + 3.182 * 0.1443), abs=1e-3)
    assert result["sides"][str(first)]["accuracy_by_seed"] == [0.75, 0.5]
    assert result["sides"][str(second)]["means"]["debate/reward/solver"] == 0.5


def test_no_common_seed_or_other_problems_are_refused(tmp_path) -> None:
    first = _folder(tmp_path / "a", {0: [True, False]})
    with pytest.raises(ValueError, match="no seed"):
        compare_ablations(first, _folder(tmp_path / "b", {1: [True, False]}))
    with pytest.raises(ValueError, match="same S"):
        compare_ablations(first, _folder(tmp_path / "c", {0: [True, False, True]}))
    assert json.loads((first / "runs" / "baseline" / "seed0" / "result.json").read_text())["hash"] == "h"
