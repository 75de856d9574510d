"""The ``mathdebate`` entry point: the server's commands plus ``train``, ``tiny-model``, ``demo`` and ``ablate``.

- ``mathdebate train --config PATH --preset baseline|sdpo|replay|full --env-url URL --max-steps N
  --output-dir DIR [--model ID_OR_PATH] [-o key=value ...]``
- ``mathdebate tiny-model DIR``: write the offline tiny model and tokenizer.
- ``mathdebate demo``: the README's main job: start an env server, play scripted debates, train
  a few steps on CPU with the tiny model on built-in problems, write metrics and the plot, stop.

Nothing heavy is imported until a training command runs, so ``mathdebate serve`` starts fast
and works without the ``train`` extra.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from env_server import cli as server_cli
from env_server.replicas import parse_urls
from trainer_client.config import TINY_MODELS

__all__ = ["demo_config", "main", "parse_overrides", "run_training", "tiny_model_path"]

log = logging.getLogger(__name__)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``-o key=value`` pairs as ``{dotted key: YAML value}``.

    Raises:
        SystemExit: a pair without ``=`` or with an empty key (the message says what is expected).
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bad override {pair!r}: expected key=value (e.g. sdpo.alpha=0.1)")
        out[key] = yaml.safe_load(value)
    return out


def _fetch_json(url: str, token: str | None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _load_model(name: str, output_dir: Path):
    """(model, tokenizer) for a hub id or path, or the offline tiny model for ``"tiny"``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path: str | Path = tiny_model_path(name, output_dir.parent) if name in TINY_MODELS else name
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def tiny_model_path(name: str, parent: Path) -> Path:
    """Build (or reuse) the offline tiny model ``name`` (a key of ``TINY_MODELS``) under ``parent``
    (``parent/tiny-model`` for ``tiny``, ``parent/tiny-learning`` for ``tiny-learning``)."""
    from trainer_client import tiny_model

    spec = getattr(tiny_model, TINY_MODELS[name])()
    return tiny_model.build_tiny_model(parent / ("tiny-model" if name == "tiny" else name), spec)


def run_training(config, progress: bool = True, callbacks: Sequence[Any] = ()) -> Path:
    """Train with a validated :class:`~trainer_client.config.TrainConfig`; returns the output dir.

    Writes ``metrics.jsonl``, ``training.png``, ``config.yaml``, checkpoints (every
    ``save_steps``) and the final model (``final/``) into ``config.output_dir``. ``callbacks``
    are extra ``transformers.TrainerCallback`` objects (e.g. an outer progress bar).

    Raises:
        ConnectionError: the env server does not answer.
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl.trainer.grpo_config import GRPOConfig

    from trainer_client.env import DEBATE_SYSTEM_PROMPT, environment_factory
    from trainer_client.reporting import MetricsFileCallback, QuietProgressCallback, plot_metrics
    from trainer_client.shaping import create_strategy_from_config
    from trainer_client.trainer import DebateGRPOTrainer
    from trainer_client.trl_compat import checkpointing_off

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # The training arguments come first: under ``torchrun``/``accelerate launch`` they set up the
    # process group, and the rank decides who writes the run's shared files.
    cuda = torch.cuda.is_available()
    args = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        max_tool_calling_iterations=config.max_tool_calling_iterations,
        temperature=config.temperature,
        loss_type=config.loss_type,
        beta=config.kl_beta,
        seed=config.seed,
        logging_steps=config.logging_steps,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        report_to=config.report_to,
        use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        **checkpointing_off(GRPOConfig),
        use_vllm=config.use_vllm,
        vllm_mode=config.vllm_mode,
        **({"vllm_server_base_url": config.vllm_server_base_url} if config.vllm_server_base_url else {}),
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        disable_tqdm=not progress,
    )
    main = args.process_index == 0
    if main:
        (output_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    token = config.env_token
    env_urls = parse_urls(config.env_url)
    for url in env_urls:  # every replica must be up at start (later, sessions go to the healthy ones)
        try:
            server_cli.wait_healthy(url, timeout_s=30)
        except RuntimeError as exc:
            raise ConnectionError(f"env server at {url} is not reachable: start `mathdebate serve`") from exc
    hints = _fetch_json(f"{env_urls[0]}/hints", token)

    torch.manual_seed(config.seed)
    with args.main_process_first(local=False, desc="building or downloading the model"):
        # the first process builds the tiny model (or fills the hub cache); the others then load
        # what it wrote (or, on another machine's disk, build their own) instead of writing the
        # same files at the same time
        model, tokenizer = _load_model(config.model, output_dir)
    dataset = Dataset.from_list([
        {"prompt": [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": ""}],
         "seed": config.seed + i}
        for i in range(config.dataset_size)
    ])
    teacher_pool = pair_store = None
    if config.replay.beta > 0:
        from env_server.problems import load_problem_source
        from trainer_client.pairs import PairStore
        from trainer_client.teachers import TeacherPool

        teacher_pool = TeacherPool.from_configs(config.replay.teachers, problems=load_problem_source(config.problems),
                                                budget_per_step=config.replay.budget_per_step,
                                                max_workers=config.replay.max_workers)
        pair_store = PairStore(rank_path(Path(config.replay.pairs_path or output_dir / "replay_pairs.jsonl"),
                                         args.process_index, args.world_size))
        if config.gold_supervised and main:
            oracles = ", ".join(t.name for t in config.replay.teachers if t.kind == "oracle")
            log.info("trace replay uses oracle teachers (%s): this run is GOLD-SUPERVISED (its DPO pairs' chosen "
                     "responses are reference solutions)", oracles)
    else:
        log.info("trace replay is off (replay.beta = 0): no teacher is called; set replay.beta and replay.teachers "
                 "to turn it on")
    reward_runner = ground_truth = None
    if config.reward_function is not None:
        from env_server.problems import load_problem_source
        from trainer_client.reward_functions import RewardFunctionRunner

        reward_runner = RewardFunctionRunner(config.reward_function.spec(), workers=config.reward_function.workers)
        problems = load_problem_source(config.problems)

        def ground_truth(problem_id: str) -> str | None:
            try:
                return problems.get(problem_id).answer
            except Exception:  # the server serves problems this trainer's source lacks
                return None
    trainer = DebateGRPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=environment_factory(config.env_url, token, config.max_rounds, config.rewards_timeout_s,
                                                config.mode),
        callbacks=[MetricsFileCallback(output_dir / "metrics.jsonl"), *callbacks],
        shaping_strategy=create_strategy_from_config(config.reward_shaping),
        scale_advantages=config.scale_advantages,
        sdpo=config.sdpo,
        replay=config.replay,
        hints=hints,
        teacher_pool=teacher_pool,
        pair_store=pair_store,
        advantage_estimator=config.advantage_estimator,
        gigpo=config.gigpo,
        reward_runner=reward_runner,
        reward_use_score=config.reward_function.use_score if config.reward_function else True,
        ground_truth=ground_truth,
        shuffle_rewards=config.shuffle_rewards,
        unfinished_debate_reward=config.unfinished_debate_reward,
    )
    if progress:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgressCallback())
    else:  # no bar: transformers then prints every log dict (PrinterCallback); metrics.jsonl has them
        trainer.remove_callback(PrinterCallback)
    try:
        trainer.train()
        if teacher_pool is not None:  # keep the pairs of the last steps' replays
            teacher_pool.wait(timeout_s=60)
            trainer.flush_replay_pairs()
    finally:
        if teacher_pool is not None:
            teacher_pool.close()
        if reward_runner is not None:
            reward_runner.close()
    trainer.save_model(str(output_dir / "final"))  # TRL/transformers: the main process writes it
    if main:
        plot_metrics(output_dir / "metrics.jsonl", output_dir / "training.png")
    return output_dir


def rank_path(path: Path, process_index: int, world_size: int) -> Path:
    """The file of one training process when several train together (``torchrun``,
    ``accelerate launch``): ``replay_pairs.jsonl`` -> ``replay_pairs.rank1.jsonl``. Each process
    keeps its own replay pairs (made from its own rollouts) in its own file, so no two processes
    append to one file; one process alone keeps ``path``."""
    if world_size <= 1:
        return path
    return path.with_name(f"{path.stem}.rank{process_index}{path.suffix}")


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config (see configs/)")
    parser.add_argument("--preset", choices=["baseline", "sdpo", "replay", "full"], default=None,
                        help="loss-channel ablation preset: (alpha, beta) = (0,0), (0.1,0), (0,0.05), (0.1,0.05)")
    parser.add_argument("--env-url", default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--model", default=None, help="Hugging Face causal LM id or path, or 'tiny' / 'tiny-learning'")
    parser.add_argument("--advantage-estimator", choices=["grpo", "gigpo"], default=None,
                        help="per-role group normalisation (grpo, default) or GiGPO step-level credit (gigpo)")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="any config field, dotted (e.g. -o sdpo.token_clip=5 -o reward_shaping.strategy=difference_rewards)")


def _train_config(args: argparse.Namespace):
    from trainer_client.config import load_config

    flags = {"env_url": args.env_url, "max_steps": args.max_steps, "output_dir": args.output_dir, "model": args.model,
             "advantage_estimator": args.advantage_estimator}
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(parse_overrides(args.override))
    return load_config(args.config, args.preset, overrides)


def _train_config_or_exit(args: argparse.Namespace):
    """The validated config, or exit 2 with the error on one line (never a traceback)."""
    import yaml
    from pydantic import ValidationError

    from trainer_client.config import config_error_line

    try:
        return _train_config(args)
    except (ValidationError, ValueError, KeyError, FileNotFoundError, yaml.YAMLError) as exc:
        print(f"mathdebate train: invalid configuration: {config_error_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_train(args: argparse.Namespace) -> int:
    """``mathdebate train``: validate the config (before anything starts), then train."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = _train_config_or_exit(args)
    output_dir = run_training(config)
    if int(os.environ.get("RANK", "0")) == 0:  # set by torchrun / accelerate launch
        print(f"metrics: {output_dir / 'metrics.jsonl'}\nplot: {output_dir / 'training.png'}\nmodel: {output_dir / 'final'}")
    return 0


def cmd_tiny_model(args: argparse.Namespace) -> int:
    """``mathdebate tiny-model DIR``."""
    from trainer_client.tiny_model import tiny_model_main

    return tiny_model_main(args.dir)


#: The demo's training problems: the family the ``tiny-learning`` model was warmed up on.
DEMO_TRAIN_PROBLEMS = "gen:single_digit_sum"


def demo_config(output_dir: str, env_url: str, max_steps: int):
    """The CPU demo's training: the ``tiny-learning`` model (``tiny_model.learning_spec``, a
    policy right about half the time on single-digit sums) on :data:`DEMO_TRAIN_PROBLEMS`, all
    three loss channels (preset ``full``) with two ground-truth oracle teachers for trace
    replay, and the tiny ablation's settings (lr 3e-4; 4 problems x 8 rollouts per step). Measured
    with the demo's 80 steps on 2 quiet cores: solver reward 0.21 -> 0.38 (first vs last 10
    steps), held-out accuracy 55% -> 64% on 200 problems, 2 min 16 s for the whole demo."""
    from trainer_client.config import load_config

    return load_config(None, "full", {
        "model": "tiny-learning",
        "env_url": env_url,
        "problems": DEMO_TRAIN_PROBLEMS,
        "output_dir": output_dir,
        "max_steps": max_steps,
        "per_device_train_batch_size": 32,
        "num_generations": 8,
        "max_completion_length": 256,
        "learning_rate": 3e-4,
        "max_rounds": 1,
        "logging_steps": 1,
        "dataset_size": 4096,
        "replay.teachers": [{"name": "oracle-a", "kind": "oracle"}, {"name": "oracle-b", "kind": "oracle"}],
        "replay.budget_per_step": 8,
        "replay.pairs_per_step": 2,
    })


def cmd_demo(args: argparse.Namespace) -> int:
    """Serve ``--problems`` and play scripted debates on them; then, unless ``--train-steps 0``,
    train the tiny model on CPU against a second server on its own family, print held-out
    accuracy before and after; stop the servers."""
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
        print(f"training {args.train_steps} steps on CPU (tiny-learning model, preset full, problems "
              f"{DEMO_TRAIN_PROBLEMS}) into {args.output_dir}", flush=True)
        config = demo_config(args.output_dir, url, args.train_steps)
        output_dir = run_training(config)
    _print_training_summary(output_dir)
    _print_heldout(config, output_dir, args.heldout)
    return 0


def _print_heldout(config, output_dir: Path, n: int) -> None:
    """Held-out first-answer accuracy of the starting and the trained policy on ``n`` problems
    (seeds >= 10^9, greedy), through the one evaluation path (:mod:`trainer_client.heldout`)."""
    if n <= 0:
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.problems import load_problem_source
    from trainer_client.heldout import evaluate_first_answers, heldout_seeds

    source, seeds = load_problem_source(config.problems), heldout_seeds(n)
    start = tiny_model_path(config.model, output_dir.parent) if config.model in TINY_MODELS else config.model
    reports = {}
    for name, path in (("before", start), ("after", output_dir / "final")):
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        reports[name] = evaluate_first_answers(model, tokenizer, source, seeds, max_rounds=config.max_rounds or 1)
    b, a = reports["before"], reports["after"]
    print(f"held-out first-answer accuracy on {n} problems (greedy): before {100 * b.accuracy:.1f}% -> after "
          f"{100 * a.accuracy:.1f}%; valid submit_solution calls {100 * b.valid_rate:.0f}% -> {100 * a.valid_rate:.0f}%")


def _print_training_summary(output_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
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
    Console().print(table)
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
    train.set_defaults(func=cmd_train)
    tiny = sub.add_parser("tiny-model", help="write the offline tiny model and tokenizer")
    tiny.add_argument("dir")
    tiny.set_defaults(func=cmd_tiny_model)
    demo = sub.add_parser("demo", help="serve, play scripted debates, train a few CPU steps, stop (the main job)")
    server_cli.add_play_args(demo)
    demo.add_argument("--train-steps", type=int, default=80, help="GRPO steps on CPU (0: serve and play only)")
    demo.add_argument("--output-dir", default="outputs/demo")
    demo.add_argument("--heldout", type=int, default=200,
                      help="held-out problems evaluated before and after training (0: skip)")
    demo.set_defaults(func=cmd_demo)


def main(argv: Sequence[str] | None = None) -> int:
    from trainer_client.ablate import add_ablate_command
    from trainer_client.evaluation.command import add_eval_command

    return server_cli.main(argv, extra_commands=[add_commands, add_ablate_command, add_eval_command])


if __name__ == "__main__":
    sys.exit(main())
