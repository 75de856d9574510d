"""One training run (``mathdebate train``, the demo's training, every arm of ``ablate``): the
GRPO arguments from a validated :class:`~trainer_client.config.TrainConfig`, the model, the
teachers and pair store of trace replay, the user reward function, then TRL's loop and the
run's outputs (``metrics.jsonl``, ``training.png``, ``config.yaml``, ``provenance.json``,
checkpoints holding the whole run, ``final/``). With ``resume_from_checkpoint`` the run
continues from its last complete checkpoint (:mod:`trainer_client.training.checkpoints`).

Failed requests (``docs/failures.md``): the model requests of a run are those of its endpoint
roles and endpoint teachers. A rollout whose endpoint request failed is dropped from its group
(``rollouts/failed`` in ``metrics.jsonl``), a teacher call that failed gives no pair; when more
than ``max_failed_share`` of the requests have failed (over all processes, once at least
:data:`MIN_REQUESTS_BEFORE_STOP` were made) training stops after the step, the outputs are
written, and :func:`run_training` raises
:class:`~env_server.client.failures.TooManyFailuresError` (the commands exit 3); the same check
runs once more at the end.

Nothing heavy is imported until :func:`run_training` runs."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from env_server import cli as server_cli
from env_server.client.failures import DEFAULT_MAX_FAILED_SHARE, FailureTally, TooManyFailuresError
from env_server.client.replicas import parse_urls
from env_server.provenance import provenance, write_provenance
from env_server.usage import reading
from trainer_client.tiny_models.build import tiny_model_path
from trainer_client.tiny_models.recipes import is_tiny_model_name

__all__ = ["MIN_REQUESTS_BEFORE_STOP", "MODEL_HINT", "load_model", "rank_path", "require_model", "run_training"]

log = logging.getLogger(__name__)

#: Training stops early for failed requests only once this many were made (over all processes),
#: so that one failure among the first few requests does not end a run; the end-of-run check
#: has no minimum.
MIN_REQUESTS_BEFORE_STOP = 20


def _fetch_json(url: str, token: str | None) -> Any:
    """``GET url`` as JSON.

    Raises:
        httpx.HTTPError: no connection, a timeout (30 s) or an error status.
    """
    import httpx

    response = httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)
    return response.raise_for_status().json()


#: What to do about a ``--model`` that does not load.
MODEL_HINT = ("pass a local model folder, a tiny model (tiny, tiny-learning, tiny-sums, tiny-div, <name>@<seed>) or a Hugging "
              "Face model id this machine can download")


def require_model(name: str, flag: str = "--model") -> None:
    """``name`` is a tiny model's name, or its configuration loads (a local folder, or a hub id
    reachable from here): checked before a run starts anything.

    Raises:
        UsageError: neither (no such folder, no ``config.json`` in it, an unknown or unreachable id).
    """
    if is_tiny_model_name(name):
        return
    from transformers import AutoConfig

    with reading(f"{flag} {name}", MODEL_HINT):
        AutoConfig.from_pretrained(name)


def load_model(name: str, output_dir: Path):
    """(model, tokenizer) for a hub id or path, or the offline tiny model for ``"tiny"``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path: str | Path = tiny_model_path(name, output_dir.parent) if is_tiny_model_name(name) else name
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def resolve_tiny_teachers(teachers: Sequence[Any], parent: Path) -> list[Any]:
    """``teachers`` with each ``hf`` teacher whose ``model`` names an offline tiny model
    (``tiny-sums@1``...) pointed at its committed build (``tiny-sums@1..3``), else at one under
    ``parent``, built there if missing."""
    return [t.model_copy(update={"model": str(tiny_model_path(t.model, parent, why=f"{t.model}: a trace-replay teacher "
                                                                                  "with no committed build of its recipe"))})
            if t.kind == "hf" and is_tiny_model_name(t.model) else t for t in teachers]


def run_training(config, progress: bool = True, callbacks: Sequence[Any] = (),
                 max_failed_share: float | None = None) -> Path:
    """Train with a validated :class:`~trainer_client.config.TrainConfig`; returns the output dir.

    Writes ``metrics.jsonl``, ``training.png``, ``config.yaml``, ``provenance.json``, checkpoints
    (every ``save_steps``) and the final model (``final/``) into ``config.output_dir``.
    ``callbacks`` are extra ``transformers.TrainerCallback`` objects (e.g. an outer progress bar).
    Env sessions left open by an earlier process of the run (killed) are closed first; the
    run's own are closed at the end.

    transformers' own bars of each model load and save are off during the run
    (:func:`~trainer_client.training.reporting.weight_bars_off`): the training bar is the one shown.

    ``max_failed_share``: the share of the run's model requests (endpoint roles and teachers)
    that may fail (``None``: :data:`~env_server.client.failures.DEFAULT_MAX_FAILED_SHARE`); above
    it training stops and this raises, once the outputs are written (see the module docstring).

    Raises:
        ConnectionError: the env server does not answer.
        trainer_client.training.checkpoints.ResumeError: ``resume_from_checkpoint`` names no
            complete checkpoint, or one this run cannot continue (other process count, other
            initial policy, other loss channels).
        env_server.client.failures.TooManyFailuresError: more than ``max_failed_share`` of the
            model requests failed (the message has the counts and the first failure).
    """
    from trainer_client.training.reporting import weight_bars_off

    with weight_bars_off():
        return _run_training(config, progress, callbacks,
                             DEFAULT_MAX_FAILED_SHARE if max_failed_share is None else max_failed_share)


def _run_training(config, progress: bool, callbacks: Sequence[Any], max_failed_share: float) -> Path:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl.trainer.grpo_config import GRPOConfig

    from trainer_client.credit.shaping import create_strategy_from_config
    from trainer_client.losses.base import build_channel
    from trainer_client.model.fingerprint import weights_fingerprint
    from trainer_client.rollout.environment import environment_factory, shared_client
    from trainer_client.rollout.sessions import SessionLedger
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT
    from trainer_client.trainer import DebateGRPOTrainer
    from trainer_client.training import checkpoints
    from trainer_client.training.reporting import QuietProgressCallback, plot_metrics
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
        generation_kwargs=config.generation_kwargs,
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
        # evaluation during training: transformers' schedule, our evaluation (GRPOHooks.evaluate);
        # TRL checks its eval batch against num_generations though the validation evaluation batches its own
        **({"eval_strategy": "steps", "eval_steps": config.eval_steps,
            "per_device_eval_batch_size": config.num_generations} if config.eval_steps else {}),
    )
    main = args.process_index == 0
    config_data = config.model_dump(mode="json")
    resume_from = (checkpoints.resume_checkpoint(config.resume_from_checkpoint, output_dir)
                   if config.resume_from_checkpoint else None)
    # a resumed run's checkpoint step was evaluated already, or was not due
    args.eval_on_start = bool(config.eval_steps and config.eval.on_start and resume_from is None)
    if main and (resume_from is None or not (output_dir / "config.yaml").exists()):  # a resume keeps the run's
        (output_dir / "config.yaml").write_text(yaml.safe_dump(config_data, sort_keys=False))
    token = config.env_token
    env_urls = parse_urls(config.env_url)
    for url in env_urls:  # every replica must be up at start (later, sessions go to the healthy ones)
        try:
            server_cli.wait_healthy(url, timeout_s=30)
        except RuntimeError as exc:
            raise ConnectionError(f"env server at {url} is not reachable: start `mathdebate serve`") from exc
    hints = _fetch_json(f"{env_urls[0]}/hints", token)
    record = provenance(config_data, env_urls, token, vllm=config.use_vllm) if main else {}

    torch.manual_seed(config.seed)
    with args.main_process_first(local=False, desc="building or downloading the model"):
        # the first process builds the tiny model (or fills the hub cache); the others then load
        # what it wrote (or, on another machine's disk, build their own) instead of writing the
        # same files at the same time
        model, tokenizer = load_model(config.model, output_dir)
    initial_policy = weights_fingerprint(model)  # the reference policy's identity
    resume = (checkpoints.load_resume_state(resume_from, args.process_index, args.world_size, config_data,
                                            initial_policy) if resume_from is not None else None)
    # sessions an earlier process of this run left open (it was killed) end now, not with the
    # server's resume window; this process's own are written down as they open
    ledger = SessionLedger(rank_path(output_dir / "env_sessions.jsonl", args.process_index, args.world_size))
    closed, gone = ledger.close_left_open(token)
    if closed or gone:
        log.info("closed %d env session(s) an earlier process of this run left open (%d were gone already)",
                 closed, gone)
    if resume is not None and resume.step >= config.max_steps:  # Trainer.train would train one step more
        log.info("nothing to resume: %s is at step %d of max_steps %d", resume.checkpoint, resume.step, config.max_steps)
        if main and not (output_dir / "final").is_dir():
            checkpoints.final_model_from_checkpoint(resume.checkpoint, output_dir / "final")
        return output_dir
    from trainer_client.policies.setup import setup_policies

    policies = setup_policies(config, model, args)  # per-role adapters, endpoint; nothing without `policies`
    dataset = Dataset.from_list([
        {"prompt": [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": ""}],
         "seed": config.seed + i}
        for i in range(config.dataset_size)
    ])
    teacher_pool = pair_store = None
    if config.replay.beta > 0:
        from env_server.debate.problems import load_problem_source
        from trainer_client.losses.pair_store import PairStore
        from trainer_client.losses.teachers import TeacherPool

        with args.main_process_first(local=False, desc="building the tiny teachers"):
            teachers = resolve_tiny_teachers(config.replay.teachers, output_dir.parent)
        teacher_pool = TeacherPool.from_configs(teachers, problems=load_problem_source(config.problems),
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
        if not config.replay.train_pairs:  # not refused at load: an ablation's base config is loaded before its arms
            log.warning("replay.train_pairs=false (trace replay's control) does nothing with replay.beta = 0: set "
                        "replay.beta > 0 to build and monitor the pairs")
    reward_runner = ground_truth = None
    if config.reward_function is not None:
        from env_server.debate.problems import load_problem_source
        from trainer_client.credit.reward_functions import RewardFunctionRunner

        reward_runner = RewardFunctionRunner(config.reward_function.spec(), workers=config.reward_function.workers)
        problems = load_problem_source(config.problems)

        def ground_truth(problem_id: str) -> str | None:
            try:
                return problems.get(problem_id).answer
            except Exception:  # the server serves problems this trainer's source lacks
                return None
    reference_solution = None  # the hint of `sdpo.hint: reference`; else only the teacher's monitor reads it
    if config.sdpo.alpha > 0 and (config.sdpo.hint == "reference" or config.problems is not None):
        from env_server.debate.problems import load_problem_source

        reference_source = load_problem_source(config.problems)

        def reference_solution(problem_id: str) -> str | None:
            try:
                return reference_source.get(problem_id).solution
            except Exception:  # the server serves problems this trainer's source lacks: the template
                return None
        if main and config.sdpo.hint == "reference":
            log.info("hint distillation shows its teacher the reference solution (sdpo.hint = reference, OPSD): "
                     "this run is GOLD-SUPERVISED")
    validation = eval_dataset = None
    if config.eval_steps:
        validation, eval_dataset = _validation(config)
    trainer = DebateGRPOTrainer(
        model=policies.model,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        validation=validation,
        processing_class=tokenizer,
        environment_factory=environment_factory(config.env_url, token, config.max_rounds, config.rewards_timeout_s,
                                                config.mode, ledger=ledger),
        callbacks=[*policies.callbacks, _metrics_callback(output_dir / "metrics.jsonl", record, resume), *callbacks],
        shaping_strategy=create_strategy_from_config(config.reward_shaping),
        scale_advantages=config.scale_advantages,
        sdpo=config.sdpo,
        replay=config.replay,
        hints=hints,
        teacher_pool=teacher_pool,
        pair_store=pair_store,
        advantage_estimator=config.advantage_estimator,
        gigpo=config.gigpo,
        state=config.state,
        verdict_balance=config.verdict_balance,
        reward_runner=reward_runner,
        reward_use_score=config.reward_function.use_score if config.reward_function else True,
        ground_truth=ground_truth,
        channels=[build_channel(aux.name, aux.weight, aux.params, aux.roles) for aux in config.channels],
        shuffle_rewards=config.shuffle_rewards,
        unfinished_debate_reward=config.unfinished_debate_reward,
        reference_solution=reference_solution,
        **policies.trainer_kwargs,
    )
    trainer.add_callback(checkpoints.CheckpointStateCallback(
        trainer, {"config": config_data, "training_config_sha256": checkpoints.training_config_hash(config_data),
                  "reference_policy": {"model": config.model, "weights_fingerprint": initial_policy},
                  "provenance": record},
        output_dir / "metrics.jsonl",
        lambda: {"sessions_ledger": str(ledger.path), "env_urls": env_urls,
                 "reruns": shared_client(config.env_url, token).reruns}))
    if resume is not None:
        checkpoints.restore_trainer_state(trainer, resume)
        log.info("resuming from %s (step %d)", resume.checkpoint, resume.step)
    if main:
        _write_run_provenance(output_dir, record, resume)
    tallies = [t.failures for t in (policies.endpoint, teacher_pool) if t is not None]
    failure_check = _FailedRequests(tallies, max_failed_share) if tallies else None
    if failure_check is not None:
        trainer.add_callback(failure_check.callback())
    if progress:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgressCallback())
    else:  # no bar: transformers then prints every log dict (PrinterCallback); metrics.jsonl has them
        trainer.remove_callback(PrinterCallback)
    try:
        trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume is not None else None)
        if teacher_pool is not None:  # keep the pairs of the last steps' replays
            teacher_pool.wait(timeout_s=60)
            trainer.flush_replay_pairs()
    finally:
        if teacher_pool is not None:
            teacher_pool.close()
        if reward_runner is not None:
            reward_runner.close()
        ledger.close_own()
        policies.close()
    trainer.save_model(str(output_dir / "final"))  # TRL/transformers: the main process writes it (adapters: final/<name>/)
    if main:
        plot_metrics(output_dir / "metrics.jsonl", output_dir / "training.png")
    if failure_check is not None:  # every process: the counts are gathered
        failure_check.raise_if_exceeded(output_dir, trainer.state.global_step, config.max_steps)
    return output_dir


def _validation(config) -> tuple[Any, Any]:
    """The evaluation during training (``eval_steps``) and the dataset transformers schedules it
    with (the validation problems' seeds, never iterated: the evaluation draws the problems)."""
    from datasets import Dataset

    from trainer_client.evaluation.during_training import ValidationEvaluation, validation_seeds
    from trainer_client.policies.adapters import use_route

    play_as = None
    if config.policies.adapters:  # each role's adapter plays its turns; an endpoint role is played by the base
        def play_as(model: Any, role: Any) -> Any:
            route = config.policies.route(role)
            return use_route(model, "frozen" if route == "endpoint" else route)
    evaluation = ValidationEvaluation.from_config(config, play_as)
    log.info("evaluation during training: every %d steps, %d validation problems (greedy first answer, avg@%d, "
             "the greedy debate's final answer)", config.eval_steps, config.eval.problems, config.eval.k)
    return evaluation, Dataset.from_list([{"seed": seed} for seed in validation_seeds(config.eval.problems)])


class _FailedRequests:
    """The run's failed-request rule (see the module docstring): the model requests of every
    process, gathered after each step; training stops once more than ``max_share`` failed."""

    def __init__(self, tallies: Sequence[FailureTally], max_share: float) -> None:
        self.tallies, self.max_share = list(tallies), max_share
        self.stopped_at: int | None = None

    def local(self) -> FailureTally:
        """This process's requests, endpoint roles' and teachers' together."""
        out = FailureTally()
        for tally in self.tallies:
            out = out.merge(tally)
        return out

    def totals(self) -> tuple[int, int]:
        """``(requests, failed)`` over every process (a collective: every process calls it)."""
        from accelerate.utils import gather_object

        local = self.local()
        counts = gather_object([(local.requests, local.failed)])
        return sum(r for r, _ in counts), sum(f for _, f in counts)

    def exceeded(self, requests: int, failed: int) -> bool:
        return failed > 0 and failed / requests > self.max_share

    def callback(self) -> Any:
        from transformers import TrainerCallback

        check = self

        class StopOnFailedRequests(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                requests, failed = check.totals()
                if requests >= MIN_REQUESTS_BEFORE_STOP and check.exceeded(requests, failed):
                    first = check.local().first
                    log.error("stopping at step %d: %d of %d model requests failed (more than %g%%)%s",
                              state.global_step, failed, requests, 100 * check.max_share,
                              f"; the first: {first.describe()}" if first is not None else "")
                    check.stopped_at = state.global_step
                    control.should_training_stop = True

        return StopOnFailedRequests()

    def raise_if_exceeded(self, output_dir: Path, step: int, max_steps: int) -> None:
        """Raise :class:`TooManyFailuresError` when more than the share of requests failed."""
        requests, failed = self.totals()
        if not self.exceeded(requests, failed):
            return
        first = self.local().first
        stopped = f"; training stopped at step {step} of {max_steps}" if self.stopped_at is not None else ""
        raise TooManyFailuresError(
            f"{failed} of {requests} model requests (endpoint roles and teachers) failed ({100 * failed / requests:.1f}%, "
            f"more than --max-failed-share {100 * self.max_share:g}%){stopped}; the first failure: "
            f"{first.describe() if first is not None else '(on another process)'}; the run's outputs are in {output_dir}",
            str(output_dir))


def _metrics_callback(path: Path, record: dict[str, Any], resume: Any):
    """``metrics.jsonl``'s writer: a new file starting with the run's provenance, or, on a
    resume, the file cut back to the checkpoint with a line marking the resume."""
    from trainer_client.training.reporting import MetricsFileCallback

    if resume is None:
        return MetricsFileCallback(path, {"event": "start", "provenance": record})
    return MetricsFileCallback(path, {"event": "resume", "from_step": resume.step, "checkpoint": str(resume.checkpoint),
                                      "provenance": record}, keep_bytes=int(resume.run["metrics"]["offset"]))


def _write_run_provenance(output_dir: Path, record: dict[str, Any], resume: Any) -> None:
    """``provenance.json``: the run's start, with one entry per resume under ``resumes``."""
    path = output_dir / "provenance.json"
    if resume is None or not path.exists():
        write_provenance(output_dir, {**record, "resumes": []})
        return
    data = json.loads(path.read_text())
    data.setdefault("resumes", []).append({"from_step": resume.step, "checkpoint": str(resume.checkpoint), **record})
    write_provenance(output_dir, data)


def rank_path(path: Path, process_index: int, world_size: int) -> Path:
    """The file of one training process when several train together (``torchrun``,
    ``accelerate launch``): ``replay_pairs.jsonl`` -> ``replay_pairs.rank1.jsonl``. Each process
    keeps its own replay pairs (made from its own rollouts) in its own file, so no two processes
    append to one file; one process alone keeps ``path``."""
    if world_size <= 1:
        return path
    return path.with_name(f"{path.stem}.rank{process_index}{path.suffix}")
