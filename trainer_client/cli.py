"""The ``mathdebate`` entry point: the server's commands plus ``train``, ``tiny-model``, ``demo``,
``ablate``, ``eval`` and ``export``.

- ``mathdebate train --config PATH --preset baseline|sdpo|replay|full --env-url URL --max-steps N
  --output-dir DIR [--model ID_OR_PATH] [--resume [DIR]] [-o key=value ...]``
- ``mathdebate tiny-model DIR``: write the offline tiny model and tokenizer.
- ``mathdebate demo``: the README's main job: start an env server, play scripted debates, train
  a few steps (CPU, or CUDA where there is one) with the tiny model on built-in problems, write
  metrics and the plot, stop.

Nothing heavy is imported until a training command runs, so ``mathdebate serve`` starts fast
and works without the ``train`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from env_server import cli as server_cli
from env_server.client.failures import DEFAULT_MAX_FAILED_SHARE, FAILED_RUN_EXIT_CODE, TooManyFailuresError
from env_server.usage import UsageError

__all__ = ["SERVER_COMMANDS", "TRAIN_FLAGS", "add_failure_options", "demo_config", "main", "train_config_checked"]

#: Commands that ``env_server.cli`` serves alone: they start without loading the trainer.
SERVER_COMMANDS = frozenset({"serve", "play", "view"})

log = logging.getLogger(__name__)


#: The config fields ``mathdebate train`` also takes as flags (``env_url`` as ``--env-url``), with
#: their help; each flag's type and choices are the field's own (``TrainConfig``), so the flags
#: accept exactly what the config accepts.
TRAIN_FLAGS = {
    "env_url": "the env server's URL (several replicas: comma-separated)",
    "max_steps": "optimiser steps",
    "output_dir": "metrics, plot, checkpoints and pairs go here",
    "model": "Hugging Face causal LM id or path, or 'tiny' / 'tiny-learning' / 'tiny-sums' / 'tiny-div' / 'tiny-div-r2'",
    "advantage_estimator": "per-role group normalisation (grpo), per role and turn (grpo_turn), GiGPO step-level "
                           "credit (gigpo) or grpo plus K actions from one state at the verifier's and revision "
                           "turns, graded on forks (grpo_state; -o state.branches=, state.continuation=)",
    "verdict_balance": "class-balanced verdict credit: weight each verifier turn's advantage by the inverse frequency "
                       "of its reviewed answer's class in the batch (batch; RL Tango) or not (none)",
    "eval_steps": "evaluate the policy on validation problems every N steps, logged as eval/... (0: never; "
                  "-o eval.problems=, eval.k= set what it measures)",
}


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    from typing import Literal, get_args, get_origin

    from trainer_client.config import PRESETS, TrainConfig

    parser.add_argument("--config", default=None, help="YAML config (see configs/)")
    parser.add_argument("--preset", choices=list(PRESETS), default=None,
                        help="loss-channel ablation preset, (alpha, beta): "
                             + ", ".join(f"{name} {weights}" for name, weights in PRESETS.items()))
    for name, text in TRAIN_FLAGS.items():
        field = TrainConfig.model_fields[name]
        options: dict[str, Any] = {"default": None, "help": f"{text} (config `{name}`; default {field.default!r})"}
        if get_origin(field.annotation) is Literal:
            options["choices"] = list(get_args(field.annotation))
        elif field.annotation in (int, float):
            options["type"] = field.annotation
        parser.add_argument("--" + name.replace("_", "-"), **options)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="any config field, dotted (e.g. -o sdpo.token_clip=5 -o reward_shaping.strategy=difference_rewards)")


def add_failure_options(sub: Any) -> None:
    """``--max-failed-share`` on the commands that train (``train``, ``ablate``), defined once:
    a run stops, writes its outputs and exits 3 when more than that share of its model requests
    (endpoint roles, endpoint teachers) failed (``docs/failures.md``)."""
    for name in ("train", "ablate"):
        sub.choices[name].add_argument(
            "--max-failed-share", type=float, default=DEFAULT_MAX_FAILED_SHARE,
            help="stop and exit 3 when more than this share of a run's model requests (endpoint roles, endpoint "
                 f"teachers) failed (default {DEFAULT_MAX_FAILED_SHARE:g}; docs/failures.md)")


def _add_resume_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                        help="continue from the last complete checkpoint: of --output-dir, or of the run folder DIR "
                             "(its config.yaml is the config unless --config is given), or the checkpoint DIR")


def _train_config(args: argparse.Namespace):
    from trainer_client.config import load_config, parse_overrides

    overrides = {name: getattr(args, name) for name in TRAIN_FLAGS if getattr(args, name) is not None}
    config_path = args.config
    resume = getattr(args, "resume", None)
    if isinstance(resume, str):  # a run folder, or a checkpoint inside one: continue that run
        from trainer_client.training.checkpoints import STATE_FILE

        run_dir = Path(resume).parent if (Path(resume) / STATE_FILE).is_file() else Path(resume)
        overrides.setdefault("output_dir", str(run_dir))
        if config_path is None and (run_dir / "config.yaml").is_file():
            config_path = run_dir / "config.yaml"
    if resume is not None:
        overrides["resume_from_checkpoint"] = resume
    overrides.update(parse_overrides(args.override))
    return load_config(config_path, args.preset, overrides)


def train_config_checked(args: argparse.Namespace):
    """The validated config of ``train``'s flags.

    Raises:
        UsageError: a config file that is not there or not YAML, an unknown key, preset or value.
    """
    from pydantic import ValidationError

    from trainer_client.config import config_error_line

    try:
        return _train_config(args)
    except (ValidationError, ValueError, KeyError, FileNotFoundError, yaml.YAMLError) as exc:
        raise UsageError(f"invalid configuration: {config_error_line(exc)}") from exc


def cmd_train(args: argparse.Namespace) -> int:
    """``mathdebate train``: check the config, the env server and the model (before anything
    starts), then train. A mistake there is a ``UsageError`` (exit 2); 3 when more than
    ``--max-failed-share`` of the model requests failed (after writing and printing the run's
    outputs)."""
    from trainer_client.training.checkpoints import ResumeError, resume_checkpoint
    from trainer_client.training.train import require_model, run_training

    config = train_config_checked(args)
    if not 0.0 <= args.max_failed_share <= 1.0:
        raise UsageError("--max-failed-share is a share in [0, 1]")
    if config.resume_from_checkpoint:
        try:  # a run with nothing to resume from is a mistake, whatever the server
            resume_checkpoint(config.resume_from_checkpoint, config.output_dir)
        except ResumeError as exc:
            raise UsageError(f"cannot resume: {exc}") from exc
    server_cli.require_play_servers(config.env_url, "--env-url")
    require_model(config.model)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failed: TooManyFailuresError | None = None
    try:
        output_dir = run_training(config, max_failed_share=args.max_failed_share)
    except ResumeError as exc:
        raise UsageError(f"cannot resume: {exc}") from exc
    except TooManyFailuresError as exc:
        failed, output_dir = exc, Path(exc.output_dir or config.output_dir)
    if int(os.environ.get("RANK", "0")) == 0:  # set by torchrun / accelerate launch
        print(f"metrics: {output_dir / 'metrics.jsonl'}\nplot: {output_dir / 'training.png'}\nmodel: {output_dir / 'final'}")
    if failed is not None:
        print(f"mathdebate train: {failed}", file=sys.stderr)
        return FAILED_RUN_EXIT_CODE
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    """``mathdebate tiny-model DIR``."""
    from trainer_client.tiny_models.build import tiny_model_main

    return tiny_model_main(args.dir)


#: The demo's model and problems: the honest protocol's (``tiny-sums``, whose held-out problems are
#: unseen by content: ``two_digit_sum`` is split by content between warm-up, RL, validation and held-out).
DEMO_MODEL = "tiny-sums"
DEMO_TRAIN_PROBLEMS = "gen:two_digit_sum"
#: Samples per problem of the demo's sampled held-out accuracy (avg@k at the run's temperature).
DEMO_SAMPLES = 8
#: The demo's evaluation during training: every this many steps (and before the first) ...
DEMO_EVAL_STEPS = 10
#: ... on this many validation problems (never the held-out ones the demo reports at the end).
DEMO_EVAL_PROBLEMS = 64


def demo_config(output_dir: str, env_url: str, max_steps: int):
    """The CPU demo's training: the protocol's recipe (:func:`trainer_client.tiny_models.run_recipe.tiny_run_settings`
    of ``tiny-sums``: its committed start, credit, learning rate and temperature; GRPO only, no
    teachers) on :data:`DEMO_TRAIN_PROBLEMS`, for ``max_steps`` steps (the protocol runs more:
    ``docs/learning.md``), evaluated on :data:`DEMO_EVAL_PROBLEMS` validation problems every
    :data:`DEMO_EVAL_STEPS` steps (the curve in ``training.png``)."""
    from trainer_client.config import load_config
    from trainer_client.tiny_models.run_recipe import recipe_shaping, tiny_run_settings

    return load_config(None, "baseline", {
        **tiny_run_settings(DEMO_MODEL),
        "reward_shaping.strategy": recipe_shaping(DEMO_MODEL),
        "model": DEMO_MODEL,
        "env_url": env_url,
        "problems": DEMO_TRAIN_PROBLEMS,
        "output_dir": output_dir,
        "max_steps": max_steps,
        "max_rounds": 1,
        "logging_steps": 1,
        "eval_steps": min(DEMO_EVAL_STEPS, max_steps),
        "eval.problems": DEMO_EVAL_PROBLEMS,
    })


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve ``--problems`` and play scripted debates on them; then, unless ``--train-steps 0``,
    train the tiny model (on CUDA where there is one, else CPU: :func:`run_training`'s choice)
    against a second server on its own family, print held-out accuracy before and after; stop
    the servers."""
    server_cli.load_problems(args.problems)  # a bad --problems is one line, before any server starts
    serve_args = ["--grading-workers", "1"]
    if args.problems:
        serve_args += ["--problems", args.problems]
    with server_cli.running_server(serve_args) as url:
        print(f"env server up at {url} ({args.problems or 'built-in generator'}); "
              f"playing {args.episodes} scripted debates", flush=True)
        args.url = url
        server_cli.cmd_play(args)
    if args.train_steps <= 0:
        return 0
    with server_cli.running_server(["--grading-workers", "1", "--problems", DEMO_TRAIN_PROBLEMS]) as url:
        config = demo_config(args.output_dir, url, args.train_steps)
        print(f"training {args.train_steps} steps on {_training_device()} ({DEMO_MODEL} model, GRPO with "
              f"{config.reward_shaping.strategy or 'identity'} credit, problems {DEMO_TRAIN_PROBLEMS}) into "
              f"{args.output_dir}", flush=True)
        from trainer_client.training.train import run_training

        output_dir = run_training(config)
    _print_training_summary(output_dir)
    _print_eval_curve(output_dir)
    _print_heldout(config, output_dir, args.heldout)
    return 0


def _print_eval_curve(output_dir: Path) -> None:
    """One line: the evaluation during training's greedy first-answer accuracy at each evaluated step."""
    from trainer_client.training.reporting import read_eval_metrics

    lines = [line for line in read_eval_metrics(output_dir / "metrics.jsonl") if "eval/first_answer_accuracy" in line]
    if not lines:
        return
    curve = ", ".join(f"{line['step']}: {100 * line['eval/first_answer_accuracy']:.0f}%" for line in lines)
    print(f"during training, greedy first-answer accuracy on {int(lines[-1].get('eval/problems', 0))} validation "
          f"problems (step: accuracy): {curve}")


def _training_device() -> str:
    """Where :func:`trainer_client.training.train.run_training` trains: ``"CUDA (<GPU name>, bf16)"``
    where torch sees a GPU (it then sets ``bf16`` where the GPU supports it), else ``"CPU"``."""
    import torch

    if not torch.cuda.is_available():
        return "CPU"
    return f"CUDA ({torch.cuda.get_device_name()}{', bf16' if torch.cuda.is_bf16_supported() else ''})"


def _print_heldout(config, output_dir: Path, n: int) -> None:
    """First-answer accuracy of the starting and the trained policy on ``n`` held-out problems
    (seeds >= 10^9, unseen by content), greedy and sampled (avg@:data:`DEMO_SAMPLES` at the run's
    temperature), through the one evaluation path (:mod:`trainer_client.evaluation.heldout`)."""
    if n <= 0:
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from trainer_client.config import TINY_MODELS
    from trainer_client.evaluation.heldout import evaluate_first_answers, heldout_seeds
    from trainer_client.tiny_models.build import tiny_model_path
    from trainer_client.training.reporting import weight_bars_off

    source, seeds = load_problem_source(config.problems), heldout_seeds(n)
    start = tiny_model_path(config.model, output_dir.parent) if config.model in TINY_MODELS else config.model
    reports = {}
    print(f"evaluating the starting and the trained model on {n} held-out problems (greedy, and {DEMO_SAMPLES} "
          f"samples each at temperature {config.temperature})", flush=True)
    for name, path in (("before", start), ("after", output_dir / "final")):
        with weight_bars_off():
            model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        reports[name] = evaluate_first_answers(model, tokenizer, source, seeds, k=DEMO_SAMPLES,
                                               temperature=config.temperature, max_rounds=config.max_rounds or 1,
                                               label=f"held-out, {name} training")
    b, a = reports["before"], reports["after"]
    print(f"held-out first-answer accuracy on {n} problems unseen in training: greedy {100 * b.accuracy:.1f}% -> "
          f"{100 * a.accuracy:.1f}%; sampled (avg@{DEMO_SAMPLES}, temperature {config.temperature}) "
          f"{100 * (b.sample_accuracy or 0):.1f}% -> {100 * (a.sample_accuracy or 0):.1f}%; valid submit_solution "
          f"calls {100 * b.valid_rate:.0f}% -> {100 * a.valid_rate:.0f}%")


def _print_training_summary(output_dir: Path) -> None:
    from rich.table import Table

    from env_server.tables import print_whole
    from trainer_client.training.reporting import read_metrics

    lines = read_metrics(output_dir / "metrics.jsonl")
    columns = {"grpo": "loss/grpo", "sdpo": "loss/sdpo_jsd", "replay": "loss/trace_replay_dpo", "total": "loss/total",
               "r solver": "debate/reward/solver", "r verifier": "debate/reward/verifier",
               "err sites": "debate/error_site_rate", "pairs": "pairs/stored"}
    table = Table(title=f"training: {len(lines)} steps (loss channels, per-role rewards, error-site rate, DPO pairs)")
    table.add_column("step", justify="right")
    for name in columns:
        table.add_column(name, justify="right")
    every = max(1, len(lines) // 12)  # about a dozen rows, always the last step
    for k, line in enumerate(lines):
        if k % every == 0 or k == len(lines) - 1:
            table.add_row(str(line["step"]), *(f"{line[key]:.3g}" if key in line else "-" for key in columns.values()))
    print_whole(table)  # whole when piped to a file too (rich would cut cells at 80 columns)
    solver = [line["debate/reward/solver"] for line in lines if "debate/reward/solver" in line]
    if len(solver) >= 4:
        window = max(1, min(10, len(solver) // 4))
        print(f"solver reward, mean of the first {window} steps {sum(solver[:window]) / window:.3f} -> "
              f"last {window} steps {sum(solver[-window:]) / window:.3f}")
    print(f"metrics: {output_dir / 'metrics.jsonl'}\nplot: {output_dir / 'training.png'}\nmodel: {output_dir / 'final'}")


def add_commands(sub: Any) -> None:
    """Register ``train``, ``tiny-model`` and ``demo`` on the ``mathdebate`` parser."""
    train = sub.add_parser("train", help="train with GRPO against a live env server")
    _add_train_args(train)
    _add_resume_arg(train)
    train.set_defaults(func=cmd_train)
    tiny = sub.add_parser("tiny-model", help="write the offline tiny model and tokenizer")
    tiny.add_argument("dir")
    tiny.set_defaults(func=cmd_tiny_model)
    demo = sub.add_parser("demo", help="serve, play scripted debates, train a few steps, stop (the main job)")
    server_cli.add_play_args(demo)
    demo.add_argument("--train-steps", type=int, default=80,
                      help="GRPO steps (on CUDA where there is one, else CPU; 0: serve and play only)")
    demo.add_argument("--output-dir", default="outputs/demo")
    demo.add_argument("--heldout", type=int, default=200,
                      help="held-out problems evaluated before and after training (0: skip)")
    demo.set_defaults(func=cmd_demo)


def main(argv: Sequence[str] | None = None) -> int:
    """``mathdebate``: the server's commands go to ``env_server.cli`` alone (no trainer import,
    no torch); the others add the trainer's commands (``train``, ``tiny-model``, ``demo``,
    ``ablate``, ``eval``, ``export``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SERVER_COMMANDS:
        return server_cli.main(args)
    from trainer_client.ablation.command import add_ablate_command
    from trainer_client.evaluation.command import add_eval_command
    from trainer_client.export.command import add_export_command

    # env_server.cli.main is where every command's errors become exit statuses (env_server.usage):
    # a UsageError 2, a run past its failed share 3 (`ablate`'s; `train` prints its outputs first), a bug 1
    return server_cli.main(args, extra_commands=[add_commands, add_ablate_command, add_eval_command,
                                                 add_export_command, add_failure_options])


if __name__ == "__main__":
    sys.exit(main())
