"""``mathdebate ablate`` on the command line: its flags, and the checks made before a plan runs
(the plan, the config and every ``-o``, the server, the model), each mistake one line and exit 2;
the plan itself runs in :mod:`trainer_client.ablation.ablate`."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from trainer_client.ablation.ablate import (
    CONTROLS,
    EVAL_PROBLEMS,
    PRESET_NAMES,
    ablation_model,
    arm_shapings,
    plan_arms,
    run_ablation,
)
from trainer_client.tiny_models.run_recipe import TINY_FAMILIES

__all__ = ["add_ablate_command", "cmd_ablate"]


def cmd_ablate(args: argparse.Namespace) -> int:
    """``mathdebate ablate``: validate the plan, run it, print where the report is."""
    import yaml
    from pydantic import ValidationError

    from env_server import cli as server_cli
    from env_server.usage import UsageError
    from trainer_client.config import config_error_line, load_config, parse_overrides
    from trainer_client.training.train import require_model

    if args.no_controls:
        args.controls = []
    try:  # the plan, the config file and every -o, checked before anything starts
        args.overrides = parse_overrides(args.override)
        plan_arms(args.arms, arm_shapings(args.shaping, args.overrides), args.modes or ["debate"],
                  shuffled_control="shuffled" in args.controls)
        load_config(args.config, None, args.overrides)
    except (ValidationError, ValueError, KeyError, FileNotFoundError, yaml.YAMLError) as exc:
        raise UsageError(f"invalid configuration: {config_error_line(exc)}") from exc
    if args.env_url:
        server_cli.require_play_servers(args.env_url, "--env-url")
    if (model := ablation_model(args.model, args.config)) is not None:
        require_model(model)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        out = run_ablation(args)
    except (ValidationError, ValueError, FileNotFoundError) as exc:
        raise UsageError(f"invalid configuration: {config_error_line(exc)}") from exc
    summary = json.loads((out / "summary.json").read_text())
    for name, arm in summary["arms"].items():
        print(f"{name:>24}: held-out accuracy {arm['accuracy_before']:.3f} -> {arm['accuracy_after']:.3f} "
              f"({len(arm['seeds'])} seeds)")
    print(f"report: {out / 'report.md'}\nplot: {out / 'report.png'}\nsummary: {out / 'summary.json'}")
    return 0


def add_ablate_command(sub: Any) -> None:
    """Register ``ablate`` on the ``mathdebate`` parser."""
    ablate = sub.add_parser("ablate", help="train every arm × seed, evaluate held-out accuracy, write a report")
    ablate.add_argument("--arms", nargs="+", default=["baseline"], choices=PRESET_NAMES)
    ablate.add_argument("--shaping", nargs="+", default=None,
                        help="reward-shaping strategies (one arm each); default: the tiny model's recipe credit "
                             "(tiny-sums: own_outcome, chosen on validation), else identity")
    ablate.add_argument("--modes", nargs="+", default=None,
                        help="episode modes: debate (solver, verifier, judge) and/or single (the solver alone); "
                             "default: the config's mode (debate without a config)")
    ablate.add_argument("--seeds", type=int, default=3)
    ablate.add_argument("--seed-start", type=int, default=0,
                        help="first seed (runs seeds S .. S + --seeds - 1): split one experiment's seeds over several "
                             "processes writing the same --output-dir, then report them all with --seed-start 0, "
                             "which reuses every finished run")
    ablate.add_argument("--max-steps", type=int, default=None,
                        help="RL steps per run (default: the tiny model's protocol, 100 for tiny-sums and 200 for "
                             "the others, else the config's max_steps)")
    ablate.add_argument("--model", default=None,
                        help="'tiny' (the learning experiment's tiny model; the default without --config) or a model id/path")
    ablate.add_argument("--config", default=None, help="YAML training config (e.g. configs/gpu_qwen.yaml)")
    ablate.add_argument("--env-url", default=None, help="an env server; default: start one here")
    ablate.add_argument("--problems", default=None,
                        help="problem source (default: the config's, or the tiny model's family: "
                             + ", ".join(f"{k}: {v}" for k, v in TINY_FAMILIES.items() if v) + ")")
    ablate.add_argument("--heldout", type=int, default=500, help="evaluation problems (of --split)")
    ablate.add_argument("--split", choices=["heldout", "validation"], default="heldout",
                        help="evaluate on held-out problems (seeds from 10^9: results) or validation problems "
                             "(seeds from 10^9 + 500,000: choosing settings)")
    ablate.add_argument("--eval-steps", type=int, default=None,
                        help="evaluate each run on validation problems every N steps during training (the curves in "
                             "each run's metrics.jsonl and training.png; default: a tenth of its steps; 0: never)")
    ablate.add_argument("--eval-problems", type=int, default=EVAL_PROBLEMS,
                        help=f"validation problems of that evaluation (default {EVAL_PROBLEMS})")
    ablate.add_argument("--pass-k", type=int, default=8,
                        help="first-answer samples per problem at the run's training temperature, for sampled "
                             "accuracy (avg@k) and pass@k (0: greedy only)")
    ablate.add_argument("--debate-k", type=int, default=None,
                        help="sampled whole debates per problem for the sampled final accuracy (default: --pass-k; 0: none)")
    ablate.add_argument("--controls", nargs="*", default=list(CONTROLS), choices=CONTROLS,
                        help="controls to run: static (best constant, copy from prompt), shuffled (rewards "
                             "shuffled within each batch), sft (SFT on gold debates for the baseline's wall-clock)")
    ablate.add_argument("--no-controls", action="store_true", help="skip every control (same as --controls with none)")
    ablate.add_argument("--control-seeds", type=int, default=None,
                        help="run the trained controls (shuffled, sft) on the first K seeds only (default: every seed)")
    ablate.add_argument("--output-dir", default="outputs/ablate")
    ablate.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="any training config field, dotted, for every arm")
    ablate.set_defaults(func=cmd_ablate)

