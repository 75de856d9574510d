"""Two ablations' runs of one arm compared seed by seed: the same arm trained two ways (e.g.
per-role adapters against one shared adapter, each a ``mathdebate ablate`` folder with its own
``-o`` settings), evaluated on the same held-out problems.

It reads each finished run's ``result.json`` (:mod:`~trainer_client.ablation.runs`)
and gives the paired contrast of :func:`~trainer_client.ablation.stats.contrast` over the
seeds both folders finished, beside each side's accuracy, per-role rewards and time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer_client.ablation.runs import RESULT_FILE
from trainer_client.ablation.stats import contrast

__all__ = ["compare_ablations"]

#: Per-role training figures averaged over a run's steps (``RunResult.means``), reported per side.
ROLE_MEANS = ("debate/reward/solver", "debate/reward/verifier", "step_time")


def _runs(folder: Path, arm: str) -> dict[int, dict[str, Any]]:
    runs = {}
    for path in sorted((folder / "runs" / arm).glob(f"seed*/{RESULT_FILE}")):
        result = json.loads(path.read_text())["result"]
        runs[int(result["seed"])] = result
    return runs


def compare_ablations(first: str | Path, second: str | Path, arm: str = "baseline") -> dict[str, Any]:
    """``first`` − ``second`` on held-out first-answer accuracy for ``arm``, paired by seed and problem.

    Args:
        first, second: ablation output folders (``mathdebate ablate --output-dir``).
        arm: the arm of both (its runs under ``runs/<arm>/seed<k>/``).

    Returns:
        ``{"arm", "seeds": [k...], "difference": {"by_seed": [mean, low, high], "by_problem":
        [...]}, "sides": {folder: {"accuracy_by_seed": [...], "rl_seconds": [...], "means": {...}}}}``;
        accuracies are fractions, the intervals two-sided 95% (Student t over the ``S`` per-seed
        differences and over the ``N`` per-problem ones, as in :func:`~trainer_client.ablation.stats.contrast`).

    Raises:
        ValueError: no seed finished in both folders, or their held-out problems differ in number.
    """
    sides = {str(first): _runs(Path(first), arm), str(second): _runs(Path(second), arm)}
    a, b = sides.values()
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed of arm {arm!r} finished in both {first} and {second}")
    difference = contrast({"first": [a[s]["correct"] for s in seeds], "second": [b[s]["correct"] for s in seeds]},
                          {"first": 1.0, "second": -1.0})
    out: dict[str, Any] = {"arm": arm, "seeds": seeds, "difference": {
        "by_seed": [difference.by_seed.mean, difference.by_seed.low, difference.by_seed.high],
        "by_problem": [difference.by_problem.mean, difference.by_problem.low, difference.by_problem.high]}, "sides": {}}
    for name, runs in sides.items():
        out["sides"][name] = {
            "accuracy_by_seed": [runs[s]["heldout"]["accuracy"] for s in seeds],
            "rl_seconds": [runs[s]["rl_seconds"] for s in seeds],
            "means": {key: sum(runs[s]["means"].get(key, float("nan")) for s in seeds) / len(seeds) for key in ROLE_MEANS},
        }
    return out
