"""The fixed review set of one or more finished runs (issue 54; docs/ablation/debate/validation.md):
the start's and the trained solver's greedy answers to the same validation problems, each
reviewed by the start's and by the trained verifier (:mod:`trainer_client.evaluation.review_set`).

    python scripts/fixed_review.py RUN_DIR [RUN_DIR ...] [--problems 200] [--out review.json]

Prints one line per run and pair, and writes the figures as JSON. Problems: the validation split
of each run's ``problems`` (``VALIDATION_SEED_BASE + i``), never the held-out one. The start is the
run's ``model`` (its ``config.yaml``), the trained policies each role's in ``final/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml


def review(run_dir: Path, problems: int) -> dict[str, Any]:
    """The four pairs' verdict figures of one run."""
    from env_server.debate.problems import load_problem_source
    from env_server.protocol.markers import Role
    from trainer_client.ablation.run_policies import load_run_policies
    from trainer_client.evaluation.during_training import validation_seeds
    from trainer_client.evaluation.review_set import fixed_review_set
    from trainer_client.training.train import load_model

    settings = yaml.safe_load((run_dir / "config.yaml").read_text())
    start_model, tokenizer = load_model(settings["model"], run_dir)
    final_model, _, play_as = load_run_policies(run_dir)
    trained = {role: (final_model, lambda role=role: play_as(role)) for role in Role}
    return fixed_review_set((start_model, nullcontext), trained, tokenizer, load_problem_source(settings["problems"]),
                            validation_seeds(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.run_dirs if not (d / "config.yaml").exists()]
    if missing:
        print(f"fixed_review.py: no config.yaml in {', '.join(missing)} (give finished run folders)", file=sys.stderr)
        return 2
    out = {}
    for run_dir in args.run_dirs:
        out[str(run_dir)] = figures = review(run_dir, args.problems)
        for pair, values in figures.items():
            shown = {k: None if v is None else round(100 * v, 1) for k, v in values.items()}
            print(f"{run_dir} {pair}: {shown}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
