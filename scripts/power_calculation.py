"""The power calculation of the learning protocol, from finished ``mathdebate ablate`` runs.

Reads every finished run of one arm in an ablation folder (``runs/<arm>/seed<k>/result.json``:
each run's per-problem correctness, greedy and sampled), splits the across-seed variance of its
accuracy into the seed effect and the per-problem part
(:func:`trainer_client.ablation.stats.seed_variance`), and prints, for each metric, how many
paired seeds detect a difference of ``--effect`` between two arms with a seed-level 95% interval
at 80% power, for several numbers of evaluation problems (:func:`~trainer_client.ablation.stats.required_seeds`).
Sampled accuracy is extrapolated to other sample counts ``k`` by splitting its per-problem
variance into the part between seeds and the binomial part ``p(1 - p) / k``.

Example::

    python scripts/power_calculation.py outputs/validation --arm baseline+own_outcome --json docs/ablation/power.json

Prints a Markdown table and, as the last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_runs(folder: Path, arm: str) -> list[dict[str, Any]]:
    """The finished runs of ``arm`` under ``folder/runs``, by seed (their ``result.json``'s result)."""
    runs = []
    for path in sorted((folder / "runs" / arm).glob("seed*/result.json")):
        runs.append(json.loads(path.read_text())["result"])
    return sorted(runs, key=lambda r: r["seed"])


def power_table(correct: np.ndarray, effect: float, problems: list[int], samples: int | None = None,
                k_values: list[int] | None = None) -> dict[str, Any]:
    """Variance components of ``correct`` ``(S, N)`` and the seeds a paired comparison needs.

    Args:
        correct: per seed and problem, the correctness (0/1) or the mean over ``samples`` samples.
        effect: the difference to detect (fraction).
        problems: numbers of evaluation problems to size for.
        samples: the samples per problem behind ``correct`` (``None``: greedy, 0/1).
        k_values: other sample counts to extrapolate to (sampled metrics only).

    Returns:
        ``{"between", "within", "seeds", "problems", "required": {label: seeds}}``.
    """
    from trainer_client.ablation.stats import SeedVariance, required_seeds, seed_variance

    measured = seed_variance(correct)
    out: dict[str, Any] = {"between": measured.between, "within": measured.within, "seeds": measured.seeds,
                           "problems": measured.problems, "required": {}}
    variants: list[tuple[str, SeedVariance]] = [("measured", measured)]
    if samples and k_values:
        p = correct.mean(axis=0)
        binomial = float(np.mean(p * (1 - p))) / samples  # the sampling part of the per-problem variance
        out["binomial_part"] = binomial
        for k in k_values:
            within = max(measured.within - binomial, 0.0) + binomial * samples / k
            variants.append((f"k={k}", SeedVariance(measured.between, within, measured.seeds, measured.problems)))
    for label, variance in variants:
        for n in problems:
            try:
                out["required"][f"{label}, N={n}"] = required_seeds(effect, variance.difference_sd(n))
            except ValueError:
                out["required"][f"{label}, N={n}"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an ablation output folder")
    parser.add_argument("--arm", required=True, help="the arm whose seeds measure the spread")
    parser.add_argument("--effect", type=float, default=0.05)
    parser.add_argument("--problems", type=int, nargs="+", default=[200, 500, 1000])
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    runs = load_runs(args.folder, args.arm)
    if len(runs) < 2:
        parser.error(f"{args.folder}/runs/{args.arm}: {len(runs)} finished runs; the spread needs at least 2 seeds")
    result: dict[str, Any] = {"folder": str(args.folder), "arm": args.arm, "effect": args.effect,
                              "seeds": [r["seed"] for r in runs], "metrics": {}}
    k = runs[0]["heldout"].get("k")
    for metric, samples in (("accuracy", None), ("sampled_accuracy", k), ("final_accuracy", None),
                            ("sampled_final_accuracy", runs[0]["heldout"].get("debate_k"))):
        vectors = [r["correct"] if metric == "accuracy" else r.get("per_problem", {}).get(metric) for r in runs]
        if not all(vectors):
            continue
        correct = np.asarray(vectors, dtype=np.float64)
        result["metrics"][metric] = power_table(correct, args.effect, args.problems, samples,
                                                [1, 8, 16] if metric == "sampled_accuracy" else None)
        result["metrics"][metric]["by_seed"] = [float(x) for x in correct.mean(axis=1)]
    print(f"| metric | seeds | mean by seed | sigma_u (seed) | tau (problem) | seeds for a {100 * args.effect:.0f}-point "
          "difference at 80% power |")
    print("|---|---|---|---|---|---|")
    for metric, figures in result["metrics"].items():
        needed = ", ".join(f"{label}: {n}" for label, n in figures["required"].items())
        print(f"| {metric} | {figures['seeds']} | {', '.join(f'{100 * x:.1f}' for x in figures['by_seed'])} | "
              f"{100 * np.sqrt(figures['between']):.2f} pts | {100 * np.sqrt(figures['within']):.1f} pts | {needed} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
