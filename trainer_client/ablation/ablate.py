"""``mathdebate ablate``: loss-channel arms × seeds, held-out accuracy before and after, controls.

For every arm (a preset ``baseline|sdpo|replay|full`` × a shaping strategy × a mode) and seed,
train with :func:`trainer_client.training.train.run_training` against one env server (started here unless
``--env-url`` is given), then evaluate the trained policy on held-out problems with the one
evaluation path, :func:`trainer_client.evaluation.heldout.evaluate_first_answers` (the tool-call format the
policy was trained in; greedy first answer, avg@k and pass@k at the runs' training temperature),
plus greedy and sampled whole debates for the final accuracy
(:func:`trainer_client.evaluation.episode_eval.evaluate_episodes`), all through
:func:`trainer_client.evaluation.policy_eval.evaluate_policy`, in the arm's episode mode (the
solver's prompt differs by mode). The starting policy is evaluated on the same problems
in every mode an arm uses, so every gain is paired with the start in the arm's own mode.

Controls, in the same report:

- ``best constant``: the best single answer for every held-out problem;
- ``copy from prompt``: answering with a number copied from the problem (first or last: the
  better of the two);
- ``shuffled``: the baseline arm with episode rewards shuffled within each batch
  (``shuffle_rewards``), for the same steps and seeds;
- ``sft``: supervised fine-tuning of the starting policy on gold debates of the RL training
  problems, for the same wall-clock as the seed's baseline RL run.

Outputs in ``--output-dir``: ``report.md``, ``report.png``, ``summary.json`` (per arm
``accuracy_before``, ``accuracy_after`` (means over seeds), ``seeds`` and more) and
``runs/<arm>/seed<k>/`` (each run's ``metrics.jsonl``, ``config.yaml``, ``heldout.json``).
Arms whose replay teachers are oracles are labelled gold-supervised.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_client.ablation.run_figures import replay_figures, run_means, static_controls
from trainer_client.ablation.runs import (
    RunResult,
    clear_unfinished,
    load_run,
    model_identity,
    run_protocol_hash,
    save_run,
)
from trainer_client.tiny_models.run_recipe import (
    DEFAULT_TINY_MODEL,
    TINY_ABLATION_SETTINGS,
    TINY_FAMILIES,
    TINY_MODEL_SETTINGS,
    ablation_temperature,
    recipe_shaping,
    tiny_run_settings,
)

__all__ = [
    "Arm",
    "ablation_model",
    "ablation_modes",
    "ablation_rounds",
    "arm_shapings",
    "plan_arms",
    "replay_figures",
    "run_ablation",
    "run_overrides",
]

log = logging.getLogger(__name__)

PRESET_NAMES = ("baseline", "sdpo", "replay", "full")
#: Distinct gold debates the SFT control builds from the RL training problems (the first ones).
SFT_CONTROL_DEBATES = 512


@dataclass(frozen=True)
class Arm:
    """One trained configuration.

    Attributes:
        preset: loss channels (``baseline``: GRPO only; ``sdpo``, ``replay``, ``full``).
        shaping: reward-shaping strategy name.
        mode: ``debate`` or ``single`` (the single-agent baseline: the solver answers once;
            RFC 0006), the training config's ``mode``.
        shuffle_rewards: the shuffled-reward control.
    """

    preset: str
    shaping: str = "identity"
    mode: str = "debate"
    shuffle_rewards: bool = False

    @property
    def name(self) -> str:
        parts = ["shuffled" if self.shuffle_rewards else self.preset]
        if self.shaping != "identity":
            parts.append(self.shaping)
        if self.mode != "debate":
            parts.append(self.mode)
        return "+".join(parts)


def ablation_modes(modes: Sequence[str] | None, config_mode: str) -> list[str]:
    """The episode modes of an ablation: ``--modes`` when given, else the config's own ``mode``
    (a config that trains in ``single`` mode ablates in it, not in the CLI's default)."""
    return list(modes) if modes else [config_mode]


def ablation_rounds(overrides: dict[str, Any], config_rounds: int | None) -> int:
    """The rounds of the debates an ablation evaluates before and after training: the rounds its
    runs train with, ``-o max_rounds=...`` when given (it wins over the config in every run), else
    the config's ``max_rounds``, else 1 (a run whose config leaves the rounds to the server trains
    on one round, :func:`run_overrides`). Before, ``-o max_rounds=2`` trained two-round debates and
    evaluated one-round ones.

    Raises:
        ValueError: a ``max_rounds`` override that is not an integer >= 1.
    """
    rounds = overrides.get("max_rounds", config_rounds)
    rounds = 1 if rounds is None else rounds
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"max_rounds must be an integer >= 1, got {rounds!r}")
    return rounds


def arm_shapings(shapings: Sequence[str] | None, overrides: dict[str, Any], recipe: str | None = None) -> list[str] | None:
    """The reward-shaping strategies of an ablation's arms: ``--shaping`` when given, else the one
    ``-o reward_shaping.strategy=...`` names (so the arm is named after the credit it trains with:
    before, such a run was trained with the ``-o`` strategy and named after the recipe's), else
    ``recipe`` (a tiny model's recipe credit; ``None``: :func:`plan_arms`' ``identity``).

    Raises:
        ValueError: both ``--shaping`` and ``-o reward_shaping.strategy`` are given.
    """
    chosen = overrides.get("reward_shaping.strategy")
    if shapings and chosen is not None:
        raise ValueError("--shaping and -o reward_shaping.strategy both set the arms' credit: give it with --shaping")
    if shapings:
        return list(shapings)
    if chosen is not None:
        return [str(chosen)]
    return [recipe] if recipe else None


def plan_arms(presets: Sequence[str], shapings: Sequence[str] | None, modes: Sequence[str],
              shuffled_control: bool) -> list[Arm]:
    """Every preset × shaping × mode, then the shuffled-reward control (baseline, identity, first mode).
    ``shapings`` ``None``: ``identity`` (``run_ablation`` passes a tiny model's recipe credit,
    :func:`~trainer_client.tiny_models.run_recipe.recipe_shaping`).

    Raises:
        ValueError: an unknown preset or mode.
    """
    unknown = [p for p in presets if p not in PRESET_NAMES]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; choose from {', '.join(PRESET_NAMES)}")
    bad_modes = [m for m in modes if m not in ("debate", "single")]
    if bad_modes:
        raise ValueError(f"unknown modes {bad_modes}; choose from debate, single")
    arms = [Arm(p, s, m) for p in presets for s in (shapings or ["identity"]) for m in modes]
    if shuffled_control:
        arms.append(Arm("baseline", "identity", modes[0], shuffle_rewards=True))
    return arms


# --------------------------------------------------------------------------- running


@contextmanager
def _server(env_url: str | None, problems: str | None) -> Iterator[str]:
    if env_url:
        yield env_url
        return
    from env_server import cli as server_cli

    serve_args = ["--grading-workers", "1", *(["--problems", problems] if problems else [])]
    with server_cli.running_server(serve_args) as url:
        yield url


def _step_bar_callback(bar: Any) -> Any:
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            bar.update(1)

    return StepBar()


def _load(path: str | Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.training.reporting import weight_bars_off

    with weight_bars_off():  # under the runs and steps bars
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def ablation_model(model: str | None, config: str | None) -> str | None:
    """The ``model`` override of an ablation: ``--model`` wins (``tiny`` means
    :data:`DEFAULT_TINY_MODEL`, the learning experiment's tiny model); without it, ``None`` (the
    config's model) when a config is given, else :data:`DEFAULT_TINY_MODEL`."""
    if model == "tiny" or (model is None and config is None):
        return DEFAULT_TINY_MODEL
    return model


def run_ablation(args: argparse.Namespace) -> Path:
    """Run the plan in ``args`` (see :func:`trainer_client.ablation.command.add_ablate_command`) and write the report.

    Returns:
        The output directory.

    Raises:
        ValueError: a bad plan (arms, modes) or config.
        ConnectionError: the env server does not answer.
    """
    from tqdm.auto import tqdm

    from env_server.debate.problems import load_problem_source
    from env_server.debate.problems.splits import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from env_server.provenance import provenance
    from trainer_client.ablation.hint_probe import probe_hints
    from trainer_client.ablation.report import write_ablation_report
    from trainer_client.ablation.sft import gold_debate_family
    from trainer_client.config import PRESETS, TINY_MODELS, load_config, tiny_model_teachers
    from trainer_client.evaluation.heldout import heldout_seeds
    from trainer_client.evaluation.policy_eval import evaluate_policy
    from trainer_client.losses.teachers import TeacherConfig
    from trainer_client.tiny_models.build import tiny_model_path
    from trainer_client.training.train import resolve_tiny_teachers, run_training

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if "mode" in args.overrides:
        raise ValueError("-o mode=...: the episode mode is set per arm; use --modes")
    model_name = ablation_model(args.model, args.config)
    base = load_config(args.config, None, {"model": model_name} if model_name else {})
    arms = plan_arms(args.arms, arm_shapings(args.shaping, args.overrides, recipe_shaping(base.model)),
                     ablation_modes(args.modes, base.mode),
                     shuffled_control="shuffled" in args.controls)
    problems = args.problems or base.problems or TINY_FAMILIES.get(base.model)
    model_path = tiny_model_path(base.model, out) if base.model in TINY_MODELS else base.model
    # the tiny model's default teachers (replay arms, no teachers configured), built once under
    # the output directory, not once per run directory
    default_teachers = None
    if base.model in TINY_MODELS and not base.replay.teachers and "replay.teachers" not in args.overrides and any(
            PRESETS[arm.preset][1] > 0 for arm in arms):
        default_teachers = [t.model_dump(mode="json") for t in resolve_tiny_teachers(
            [TeacherConfig.model_validate(t) for t in tiny_model_teachers(base.model)], out)]
    source = load_problem_source(problems)
    # the evaluation problems: the held-out split (reported results) or the validation split
    # (choosing settings; from VALIDATION_SEED_BASE, disjoint by seed, and by content for split families)
    seeds_heldout = heldout_seeds(args.heldout, start=0 if args.split == "heldout" else
                                  VALIDATION_SEED_BASE - HELDOUT_SEED_BASE)
    eval_kwargs = {"k": args.pass_k, "debate_k": args.pass_k if args.debate_k is None else args.debate_k,
                   "temperature": ablation_temperature(args.overrides, base, base.model in TINY_MODELS),
                   "max_rounds": ablation_rounds(args.overrides, base.max_rounds)}

    t0 = time.perf_counter()
    model, tokenizer = _load(model_path)
    # The starting policy is evaluated in every mode an arm trains in (the solver's prompt
    # differs by mode, RFC 0006), and in debate mode for the SFT control's gold debates.
    befores: dict[str, tuple[dict[str, Any], dict[str, list[float]]]] = {}
    eval_seconds: list[float] = []
    for mode in dict.fromkeys(["debate", *(arm.mode for arm in arms)]):
        start_figures = evaluate_policy(model, tokenizer, source, seeds_heldout, **eval_kwargs, mode=mode)
        eval_seconds.append(start_figures.figures["seconds"])
        befores[mode] = (start_figures.figures, start_figures.per_problem)
    before = befores["debate"][0]
    heldout_problems = [source.by_seed(s) for s in seeds_heldout]
    controls: dict[str, Any] = (static_controls([p.answer for p in heldout_problems],
                                                [p.problem for p in heldout_problems])
                                if "static" in args.controls else {})
    log.info("starting policy: %s accuracy %.3f (sampled %s, final %.3f) on %d problems (%.0f s)", args.split,
             before["accuracy"], before["sampled_accuracy"], before["final_accuracy"], before["n"],
             time.perf_counter() - t0)
    # does the starting policy read hints? (the hints hint distillation distils; validation problems)
    hint_probe = probe_hints(model, tokenizer, source, heldout_seeds(
        min(args.heldout, 200), start=VALIDATION_SEED_BASE - HELDOUT_SEED_BASE),
        style=args.overrides.get("sdpo.hint", base.sdpo.hint),
        restate=bool(args.overrides.get("sdpo.restate", base.sdpo.restate))).summary()
    log.info("hint probe (validation): %s", hint_probe)

    results: list[RunResult] = []
    # what every run's protocol hash includes besides its config (ablate_runs.run_protocol_hash)
    evaluation = {"seeds": [seeds_heldout[0], len(seeds_heldout)], **eval_kwargs}
    sft_control = "sft" in args.controls and gold_debate_family(problems) is not None
    if "sft" in args.controls and not sft_control:
        log.warning("no SFT control: it builds gold debates from a one-family generator source (gen:<family>), "
                    "and the problems are %s", problems)
    control_seeds = args.seeds if args.control_seeds is None else min(args.control_seeds, args.seeds)
    shuffled_runs = sum(arm.shuffle_rewards for arm in arms)
    total_runs = ((len(arms) - shuffled_runs) * args.seeds + shuffled_runs * control_seeds
                  + (control_seeds if sft_control else 0))
    runs_bar = tqdm(total=total_runs, desc="runs (arm × seed)", position=0)
    steps_bar = tqdm(total=0, desc="steps", position=1, leave=False)
    with _server(args.env_url, problems) as url:
        record = provenance({"train": base.model_dump(mode="json"), "ablate": {k: v for k, v in vars(args).items()
                                                                            if k != "func"}}, [url], base.env_token)
        for seed in range(args.seed_start, args.seed_start + args.seeds):
            for arm in arms:
                if arm.shuffle_rewards and seed >= args.seed_start + control_seeds:
                    continue
                runs_bar.set_postfix_str(f"{arm.name} seed {seed}")
                run_dir = out / "runs" / arm.name / f"seed{seed}"
                overrides = run_overrides(
                    arm, seed, args, model_path=model_path, env_url=url, run_dir=run_dir, problems=problems,
                    default_max_rounds=base.max_rounds is None, tiny=base.model in TINY_MODELS,
                    default_teachers=default_teachers, tiny_model=base.model)
                config = with_default_eval_steps(load_config(args.config, arm.preset, overrides),
                                                 "eval_steps" in overrides or "eval_steps" in base.model_fields_set)
                run_settings = {"config": config.model_dump(mode="json", exclude={"output_dir", "env_url"}),
                                "model": model_identity(model_path), "problems": problems, "evaluation": evaluation}
                run_hash = run_protocol_hash(run_settings)
                reused = load_run(run_dir, run_hash)
                if reused is None:
                    clear_unfinished(run_dir)
                    steps_bar.reset(total=config.max_steps)
                    start = time.perf_counter()
                    run_training(config, False, [_step_bar_callback(steps_bar)], getattr(args, "max_failed_share", None))
                    rl_seconds = time.perf_counter() - start
                    result = _evaluate_run(arm.name, seed, run_dir, rl_seconds, config.gold_supervised, source,
                                           seeds_heldout, eval_kwargs | {"mode": arm.mode}, eval_seconds)
                    save_run(run_dir, result, run_hash, run_settings)
                else:
                    log.info("%s seed %d: reused the finished run in %s", arm.name, seed, run_dir)
                    result = reused
                results.append(result)
                runs_bar.update(1)
            if sft_control and seed < args.seed_start + control_seeds:
                runs_bar.set_postfix_str(f"sft seed {seed}")
                baseline_seconds = next((r.rl_seconds for r in results if r.arm == "baseline" and r.seed == seed),
                                        None) or next(r.rl_seconds for r in results if r.seed == seed)
                sft_dir = out / "runs" / "sft" / f"seed{seed}"
                sft_settings = {"control": "sft", "seed": seed, "seconds": baseline_seconds, "problems": problems,
                                "model": model_identity(model_path), "dataset_size": base.dataset_size,
                                "evaluation": evaluation}
                sft_hash = run_protocol_hash(sft_settings)
                sft_result = load_run(sft_dir, sft_hash)
                if sft_result is None:
                    clear_unfinished(sft_dir)
                    sft_result = _sft_control(model_path, problems, seed, baseline_seconds, out, source, seeds_heldout,
                                              eval_kwargs, eval_seconds, base.dataset_size)
                    save_run(sft_dir, sft_result, sft_hash, sft_settings)
                results.append(sft_result)
                runs_bar.update(1)
    runs_bar.close()
    steps_bar.close()

    protocol = {
        "model": str(base.model), "model_path": str(model_path), "problems": problems or "built-in generator",
        "split": args.split, "hint_probe": hint_probe,
        "heldout_problems": len(seeds_heldout), "heldout_seeds": [seeds_heldout[0], seeds_heldout[-1]],
        "seeds": args.seeds, "seed_start": args.seed_start, "control_seeds": control_seeds,
        "max_steps": config.max_steps, "pass_k": args.pass_k,
        "debate_k": eval_kwargs["debate_k"], "temperature": eval_kwargs["temperature"],
        "eval_seconds_mean": sum(eval_seconds) / len(eval_seconds),
        "settings": {**(tiny_run_settings(str(base.model)) if base.model in TINY_MODELS else {}), **args.overrides},
        "command": " ".join(sys.argv),
    }
    write_ablation_report(out, protocol, befores, results, controls, provenance=record)
    return out


#: Validation problems of each run's evaluation during training (``--eval-problems``).
EVAL_PROBLEMS = 64


def default_eval_steps(max_steps: int) -> int:
    """Each run's ``eval_steps`` unless ``--eval-steps`` or ``-o eval_steps=`` says: ten
    evaluations a run (and one before the first step), at least one step apart."""
    return max(1, max_steps // 10)


def with_default_eval_steps(config: Any, chosen: bool) -> Any:
    """``config`` with :func:`default_eval_steps` of its ``max_steps`` unless its ``eval_steps``
    was ``chosen`` (``--eval-steps``, ``-o eval_steps=``, or the ``--config`` file's own)."""
    return config if chosen else config.model_copy(update={"eval_steps": default_eval_steps(config.max_steps)})


def run_overrides(arm: Arm, seed: int, args: argparse.Namespace, *, model_path: str | Path, env_url: str,
                  run_dir: Path, problems: str | None, default_max_rounds: bool, tiny: bool,
                  default_teachers: list[dict[str, Any]] | None = None, tiny_model: str | None = None) -> dict[str, Any]:
    """The training-config overrides of one (arm, seed) run, applied over ``--config`` and the
    arm's preset: the model, server, output directory and seed; the arm's reward shaping,
    shuffled-reward flag and episode ``mode`` (a ``single`` arm trains on single-answer
    episodes, RFC 0006); ``max_rounds: 1`` where the config leaves the rounds to the server
    (``default_max_rounds``); :data:`TINY_ABLATION_SETTINGS` for a tiny model (then
    :data:`TINY_MODEL_SETTINGS` of ``tiny_model``, its name), with the tiny
    model's default teachers (``default_teachers``, built: the run's ``model`` is the built
    model's path, which ``TrainConfig`` does not recognise as a tiny model, so its own default
    would not apply); ``--max-steps``; ``--eval-steps`` and ``--eval-problems`` (the evaluation
    during training on validation problems; without ``--eval-steps``, :func:`default_eval_steps`
    of the run's steps, set by :func:`run_ablation`); then the ``-o`` overrides
    (``args.overrides``), except that the arm's mode and its channels always win: ``-o sdpo.alpha=1``
    weights the ``sdpo`` and ``full`` arms, ``baseline`` keeps 0 (likewise ``replay.beta``).
    """
    overrides: dict[str, Any] = {
        "model": str(model_path), "env_url": env_url, "output_dir": str(run_dir), "seed": seed,
        "reward_shaping.strategy": arm.shaping, "shuffle_rewards": arm.shuffle_rewards, "problems": problems,
    }
    if default_max_rounds:
        overrides["max_rounds"] = 1
    if tiny:
        overrides.update(TINY_ABLATION_SETTINGS)
        overrides.update(TINY_MODEL_SETTINGS.get(tiny_model or "", {}))
        if default_teachers:
            overrides["replay.teachers"] = default_teachers
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    if args.eval_steps is not None:
        overrides["eval_steps"] = args.eval_steps
    overrides["eval.problems"] = args.eval_problems
    overrides.update(args.overrides)
    overrides["mode"] = arm.mode
    from trainer_client.config import PRESETS  # an arm without a channel keeps it off, whatever -o says
    overrides.update({k: 0.0 for k, w in zip(("sdpo.alpha", "replay.beta"), PRESETS[arm.preset], strict=True) if not w})
    return overrides


#: The controls ``--controls`` chooses from (all by default).
CONTROLS = ("static", "shuffled", "sft")


def _evaluate_run(arm: str, seed: int, run_dir: Path, rl_seconds: float, gold: bool, source: Any,
                  seeds_heldout: list[int], eval_kwargs: dict[str, Any], eval_seconds: list[float]) -> RunResult:
    from trainer_client.ablation.run_policies import load_run_policies
    from trainer_client.evaluation.policy_eval import evaluate_policy
    from trainer_client.training.reporting import read_metrics

    model, tokenizer, play_as = load_run_policies(run_dir)  # per-role adapters: each role's own
    evaluation = evaluate_policy(model, tokenizer, source, seeds_heldout, **eval_kwargs, play_as=play_as)
    eval_seconds.append(evaluation.figures["seconds"])
    heldout = evaluation.figures
    mode = eval_kwargs.get("mode", "debate")
    (run_dir / "heldout.json").write_text(json.dumps(heldout, indent=2))
    metrics = run_dir / "metrics.jsonl"
    curve = read_metrics(metrics) if metrics.exists() else []
    pairs = max((line.get("pairs/stored", 0.0) for line in curve), default=0.0)
    return RunResult(arm, seed, rl_seconds, len(curve), gold, curve, run_means(curve), pairs, heldout,
                     evaluation.correct, mode, replay_figures(curve), per_problem=evaluation.per_problem)


def _sft_control(model_path: str | Path, problems: str | None, seed: int, seconds: float, out: Path, source: Any,
                 seeds_heldout: list[int], eval_kwargs: dict[str, Any], eval_seconds: list[float],
                 dataset_size: int) -> RunResult:
    """Supervised fine-tuning on gold debates of the RL training problems for ``seconds``."""
    from trainer_client.ablation.sft import supervised_fine_tune
    from trainer_client.training.reporting import weight_bars_off

    run_dir = out / "runs" / "sft" / f"seed{seed}"
    model, tokenizer = _load(model_path)
    start = time.perf_counter()
    steps = supervised_fine_tune(model, tokenizer, problems, seed, min(dataset_size, SFT_CONTROL_DEBATES),
                                 seconds=seconds, seed=seed)
    elapsed = time.perf_counter() - start
    with weight_bars_off():
        model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    result = _evaluate_run("sft", seed, run_dir, elapsed, True, source, seeds_heldout, eval_kwargs, eval_seconds)
    result.steps = steps
    return result
