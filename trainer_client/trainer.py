"""``DebateGRPOTrainer``: TRL's ``GRPOTrainer`` with role-mapped advantages and extra loss channels.

Only TRL's hooks live here (through :class:`~trainer_client.trl_compat.GRPOHooks`, the one
seam to TRL's internals); the maths lives in small modules:

- :meth:`DebateGRPOTrainer.on_completions`: after TRL's tool loop, a debate the rollout left
  open is finished with the rollout's last assistant message (``EpisodeTrace.finish``).
- :meth:`DebateGRPOTrainer.on_scored_batch` (before TRL shuffles the batch): gathers the graded
  records (through each environment's ``trace``), the completion segments, which rollouts failed
  (an endpoint role's request failed for good: dropped from their groups, the pipeline's step 4,
  counted as ``rollouts/failed``) and, when needed, the policy's verdict probabilities (COMA) and
  GiGPO's step inputs, and runs the reward pipeline (:mod:`trainer_client.credit.pipeline`: every
  rewrite of a reward, then shaping, the estimator and the ``(B, T)`` advantages); each loss channel
  prepares what it needs from the batch (dropped rollouts are not shown to it); the pipeline alone
  writes the advantages and the loss mask into TRL's batch (judge tokens, tokens of no turn,
  dropped rollouts, untrained roles and the tokens a channel routes away leave the GRPO loss).
- :meth:`DebateGRPOTrainer.compute_loss`: ``total = grpo + Σ_i weight_i · loss_i`` over the channels
  (:mod:`trainer_client.losses.base`): hint distillation (``α``), trace-replay DPO (``β``) and any
  registered from the config; each term is divided by the gradient-accumulation steps exactly as TRL
  scales its own loss; what each costs is logged (:mod:`~trainer_client.losses.costs`).
- Role routing (``policies``, :mod:`trainer_client.policies.routing`): every generation round
  (:meth:`DebateGRPOTrainer.generate_round`) and every per-token log-prob
  (:meth:`DebateGRPOTrainer.token_logps`) goes through the policy of the role whose turn it is;
  tokens of untrained roles leave the loss.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any

import torch
from accelerate.utils import gather_object

from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.debate_metrics import debate_metrics, scored_only, unfinished_rate, without_dropped
from trainer_client.credit.gigpo import GiGPOConfig
from trainer_client.credit.pipeline import (
    ESTIMATORS,
    Estimator,
    batch_advantages,
    rescored_records,
    trl_loss_mask,
    user_rewards,
    write_advantages,
    write_loss_mask,
)
from trainer_client.credit.role_samples import announce_strategy
from trainer_client.credit.shaping import RewardShapingStrategy, get_strategy
from trainer_client.credit.shaping.base import VERIFIER_ACCEPT_PROB
from trainer_client.credit.state_groups import state_credit
from trainer_client.credit.step_credit import gathered_gigpo_inputs
from trainer_client.losses.base import LossChannel, LossContext, ScoredBatch
from trainer_client.losses.costs import ChannelCosts
from trainer_client.losses.hint_distillation import SDPOHintDistillation
from trainer_client.losses.settings import ReplayConfig, SDPOConfig
from trainer_client.losses.trace_replay import TraceReplayDPO
from trainer_client.model.verdict_probs import verdict_accept_probs
from trainer_client.policies.routing import ROUTES, RoleRouter
from trainer_client.policies.settings import PoliciesConfig
from trainer_client.rollout.branches import StateBrancher, StateSettings
from trainer_client.rollout.segments import completion_segments
from trainer_client.trl_compat import GRPOHooks, capture_body_forward

__all__ = ["DebateGRPOTrainer"]

log = logging.getLogger(__name__)


class DebateGRPOTrainer(GRPOHooks):
    """A ``GRPOTrainer`` for debates served by the env server.

    Args:
        *args, **kwargs: ``GRPOTrainer``'s (``environment_factory`` must build
            :class:`~trainer_client.rollout.environment.DebateEnvironment` instances).
        shaping_strategy: role-mapped reward shaping (default: identity).
        scale_advantages: divide by the per-role group std.
        sdpo: hint-distillation settings (default: off).
        replay: trace-replay settings (default: off).
        hints: hint templates, key -> text (the server's ``GET /hints``); required when
            ``sdpo.alpha > 0``.
        teacher_pool, pair_store: trace replay's teachers and pairs; required when ``replay.beta > 0``.
        channels: further :class:`~trainer_client.losses.base.LossChannel` terms.
        advantage_estimator: ``"grpo"`` (per-role group normalisation), ``"grpo_turn"`` (per role
            and turn, :func:`trainer_client.credit.role_samples.turn_group_values`), ``"gigpo"`` or
            ``"grpo_state"`` (``grpo``, and ``K`` actions from one state at branched turns, each
            trained with its within-state advantage: :mod:`trainer_client.rollout.branches`).
        gigpo, state, verdict_balance: GiGPO's and ``grpo_state``'s settings; ``"none"`` or
            ``"batch"`` (class-balanced verdict credit, pipeline step 7).
        reward_runner: a :class:`~trainer_client.credit.reward_functions.RewardFunctionRunner`
            scoring every rollout's messages (pipeline step 1; its step outputs give GiGPO's
            step rewards).
        reward_use_score: whether its valid scores replace the episode reward.
        ground_truth: ``problem_id -> reference answer`` passed to the reward function.
        shuffle_rewards: the shuffled-reward control (pipeline step 4; never for real training).
        unfinished_debate_reward: the episode reward of a rollout whose debate the adapter had
            to finish by forfeiting turns (pipeline step 2); ``None`` keeps the graded one.
        policies: per-role policies (the model then carries the adapters,
            :func:`~trainer_client.policies.adapters.attach_adapters`); ``None``: the shared policy.
        endpoint: plays the endpoint roles' turns (required when ``policies`` names an endpoint).
        reference_solution: ``problem_id -> reference solution or None`` (from the train config's
            ``problems``); required by ``sdpo.hint: reference`` (OPSD: gold-supervised).

    Raises:
        ValueError: a channel is on without what it needs, or an unknown estimator.
    """

    def __init__(self, *args: Any, shaping_strategy: RewardShapingStrategy | None = None, scale_advantages: bool = True,
                 sdpo: SDPOConfig | None = None, replay: ReplayConfig | None = None,
                 hints: dict[str, str] | None = None, teacher_pool: Any = None, pair_store: Any = None,
                 channels: list[LossChannel] | None = None,
                 advantage_estimator: Estimator = "grpo", gigpo: GiGPOConfig | None = None,
                 state: StateSettings | None = None, reward_runner: Any = None,
                 reward_use_score: bool = True, ground_truth: Any = None, shuffle_rewards: bool = False,
                 unfinished_debate_reward: float | None = 0.0, policies: PoliciesConfig | None = None, verdict_balance="none",
                 endpoint: Any = None, reference_solution: Any = None, **kwargs: Any) -> None:
        if advantage_estimator not in ESTIMATORS:
            raise ValueError(f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, got {advantage_estimator!r}")
        self.sdpo, self.replay = sdpo or SDPOConfig(), replay or ReplayConfig()
        # checked before TRL builds anything (and the channels are built only when on)
        hint = SDPOHintDistillation(self.sdpo, hints or {}, reference_solution) if self.sdpo.alpha > 0 else None
        trace = TraceReplayDPO(self.replay, teacher_pool, pair_store) if self.replay.beta > 0 else None
        super().__init__(*args, **kwargs)
        self.advantage_estimator: Estimator = advantage_estimator
        self.gigpo, self.verdict_balance, self.shuffle_rewards = gigpo or GiGPOConfig(), verdict_balance, shuffle_rewards
        self.reward_runner, self.reward_use_score, self.ground_truth = reward_runner, reward_use_score, ground_truth
        self.unfinished_debate_reward = unfinished_debate_reward
        if shuffle_rewards:
            log.info("CONTROL RUN: episode rewards are shuffled within each batch (shuffle_rewards=true)")
        self.shaping_strategy = shaping_strategy or get_strategy("identity")
        announce_strategy(self.shaping_strategy)
        self.scale_advantages = scale_advantages
        self.hint_distillation, self.trace_replay = hint, trace
        self.channels: list[LossChannel] = [c for c in (hint, trace) if c is not None] + list(channels or [])
        self.role_router = RoleRouter(policies, self.accelerator.unwrap_model, endpoint) if policies and policies.active else None
        self.brancher = (StateBrancher(state or StateSettings(), self.parse_turn, self.sampling_temperature,
                                       self.max_completion_length or 0) if advantage_estimator == "grpo_state" else None)
        if self.brancher is not None and (self.channels or self.role_router is not None):
            raise ValueError("grpo_state does not combine with loss channels or role policies yet")
        if endpoint is not None:  # endpoint turns are written in the chat template TRL renders with
            assert isinstance(self.chat_template_kwargs, dict), "TrainingArguments parses chat_template_kwargs"
            endpoint.bind(self.processing_class, chat_template=self.chat_template, **self.chat_template_kwargs)
        for channel in self.channels:
            if self.role_router is not None:  # a channel trains only roles that are trained
                channel.roles = self.role_router.trained_roles(channel.roles)
            channel.bind(self)
        if self.role_router is not None:
            log.info("role policies: %s", self.role_router.policies.describe())
        self.costs = ChannelCosts(self.accelerator.device, [c.cost_name for c in self.channels], self._log)
        self.add_callback(self.costs)  # logs each step's costs before the step's logs are written
        self._batch_completions: list[list[dict[str, Any]]] = []
        self._batch_routes: torch.Tensor | None = None  # per-token adapter of this batch, before scoring
        self._loss_routes: torch.Tensor | None = None  # of the micro-batch in the loss

    # ------------------------------------------------------------------ role routing

    def on_generation_start(self) -> None:
        for part in (p for p in (self.role_router, self.brancher) if p is not None):
            part.start_rollouts()

    def generate_round(self, prompt_ids: list[list[int]], generate: Any) -> tuple[list[list[int]], Any]:
        if self.brancher is not None:  # grpo_state: K actions from each branched turn's state
            return self.brancher.generate_round(prompt_ids, self.batch_environments() or [], generate)
        if self.role_router is None:
            return generate(prompt_ids)
        environments = self.batch_environments()
        assert environments is not None and self.model is not None, "TRL builds the environments before generating"
        return self.role_router.generate_round(self.model, prompt_ids, environments, generate)

    def on_completion_tokens(self, completion_ids: list[list[int]], tool_mask: list[list[int]] | None) -> None:
        if self.role_router is None or not self.role_router.adapter_routes:
            return
        masks = tool_mask or [[1] * len(ids) for ids in completion_ids]
        segments = [completion_segments(messages, env.trace.turns, mask) for messages, env, mask
                    in zip(self._batch_completions, self.batch_environments() or [], masks, strict=True)]
        self._batch_routes = self.role_router.token_routes(segments, max(map(len, completion_ids), default=0))

    def token_logps(self, model: torch.nn.Module, compute: Any) -> tuple[Any, ...]:
        if self.role_router is None:
            return compute(model)
        return self.role_router.logps(model, self._loss_routes if self._loss_routes is not None else self._batch_routes,
                                      compute)

    # ------------------------------------------------------------------ rollouts

    def on_completions(self, completions: list[list[dict[str, Any]]]) -> None:
        self._batch_completions = completions
        for environment, messages in zip(self.batch_environments() or [], completions, strict=True):
            if environment.trace.done:
                continue
            last = messages[-1] if messages else {}
            text = last.get("content") if last.get("role") == "assistant" and not last.get("tool_calls") else None
            environment.trace.finish(text if isinstance(text, str) else None)

    def on_scored_batch(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
        mode, completion_mask = self.mode, output["completion_mask"]
        environments = self.batch_environments()
        assert environments is not None, "TRL builds the batch's environments before scoring it"
        records: list[EpisodeRewards] = [env.trace.wait_record() for env in environments]
        results = None
        if self.reward_runner is not None:  # pipeline step 1: the user's reward function
            truths = [self.ground_truth(r.problem_id) if self.ground_truth else None for r in records]
            results, metrics = user_rewards(self.reward_runner, [row.get("prompt") or [] for row in inputs],
                                            self._batch_completions, truths)
            self._log(metrics, mode)
        unfinished = [any(turn.source == "forfeit" for turn in env.trace.turns) for env in environments]
        records = rescored_records(records, user_results=results, use_score=self.reward_use_score,  # steps 1-2
                                  unfinished=unfinished, unfinished_reward=self.unfinished_debate_reward)
        failed = [k in (self.role_router.failed_rows if self.role_router else {}) for k in range(len(environments))]
        self._log(unfinished_rate(unfinished, failed), mode)  # a failed rollout's forfeits are not the policy's
        model_tokens = (completion_mask * trl_loss_mask(output)).tolist()
        branch_tokens = self.brancher.extra_tokens if self.brancher else 0  # grpo_state's branches not continued
        self._log({"tokens/sampled": float(sum(map(sum, model_tokens)) + branch_tokens)}, mode)  # sampled, per step
        segments = [completion_segments(messages, env.trace.turns, tokens)
                    for messages, env, tokens in zip(self._batch_completions, environments, model_tokens, strict=True)]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        assert num_generations is not None, "GRPOConfig resolves num_generations(_eval)"
        all_records = gather_object(records)  # step 3; groups are contiguous, as TRL lays them out
        all_failed = gather_object(failed)  # logged as rollouts/failed, 0 without endpoint roles
        accept_probs = (list(gather_object(verdict_accept_probs(  # COMA's π(CORRECT) at each first verdict (no grad)
            self.accelerator.unwrap_model(self.model), self.processing_class, output["prompt_ids"], output["completion_ids"],
            segments, prompt_mask=output["prompt_mask"]))) if VERIFIER_ACCEPT_PROB in self.shaping_strategy.extra_columns
            else None)
        gigpo, unaligned = (gathered_gigpo_inputs(records, [env.trace.turns for env in environments], self._batch_completions,
                            results, self.gigpo, gather_object) if self.advantage_estimator == "gigpo" else (None, 0))
        self._log({"reward_function/unaligned_step_outputs": float(unaligned)} if gigpo and results is not None else {}, mode)
        first = self.accelerator.process_index * len(records)
        result = batch_advantages(  # steps 4-8
            all_records, num_generations, self.shaping_strategy, segments, completion_mask.shape[1], first,
            scale=self.scale_advantages, verifier_accept_probs=accept_probs, estimator=self.advantage_estimator,
            gigpo=gigpo, failed=all_failed, verdict_balance=self.verdict_balance,
            shuffle_seed=self.args.seed * 1_000_003 + self.state.global_step if self.shuffle_rewards and mode == "train"
            else None)
        self._log(result.metrics, mode)
        write_advantages(output, result)  # step 9
        routes = []  # step 9's further masks: the router's, then each channel's
        if self.role_router is not None:  # untrained roles' tokens leave every loss; each token knows its adapter
            width = completion_mask.shape[1]
            routes.append(self.role_router.untrained_mask(segments, width))
            output[ROUTES] = self.role_router.token_routes(segments, width).to(completion_mask.device)
            self._batch_routes = None
        batch = ScoredBatch(output, records, environments, without_dropped(segments, result.dropped, first),
                            self._batch_completions, mode, self.state.global_step)
        for channel in self.channels:
            routed = self.costs.timed(channel.cost_name, channel.prepare, batch)
            if routed is not None:  # the channel takes these tokens away from the GRPO term
                routes.append(routed)
            self._log(self.costs.timed(channel.cost_name, channel.batch_metrics), mode)
        write_loss_mask(output, result, routes, gather=self.accelerator.gather)  # step 9
        if self.brancher is not None:  # every branch's tokens into TRL's batch, with its within-state advantage
            dropped, pad = result.dropped[first:first + len(records)], self._tokenizer.pad_token_id
            self._log(state_credit(output, self.brancher.groups, records, segments, dropped, scale=self.scale_advantages,
                                   verdict_balance=self.verdict_balance, logps=self.sampling_logps, pad_token_id=pad,
                                   gather=self.accelerator.gather, multiple_of=self.args.steps_per_generation), mode)  # type: ignore[attr-defined]  # GRPOConfig's
        samples, shaped, scored = scored_only(result.samples, result.shaped, all_records, all_failed)
        if scored:  # a failed rollout's reward is not the policy's
            self._log(debate_metrics(samples, shaped, scored, segments), mode)
        return output

    def _log(self, metrics: dict[str, float], mode: str) -> None:
        for name, value in metrics.items():
            self.log_metric(name, value, mode)

    # ------------------------------------------------------------------ loss

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        captured: list[Any] = []
        with ExitStack() as stack:
            # with several adapters GRPO runs one forward per adapter, none of which is the policy
            # of every site: the channels run their own (capturing them would only hold R caches)
            single_pass = self.role_router is None or len(self.role_router.adapter_routes) <= 1
            if single_pass and any(channel.wants_policy_forward(inputs) for channel in self.channels):
                # a channel reuses GRPO's own forward (its hidden states, its keys and values)
                captured = stack.enter_context(capture_body_forward(self.accelerator.unwrap_model(model)))
            self._loss_routes = inputs.get(ROUTES)
            try:
                grpo = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            finally:
                self._loss_routes = None
        mode = self.mode
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        context = LossContext(mode, accumulation, self.state.global_step, captured[0] if len(captured) == 1 else None)
        total = self.costs.grpo_term(grpo)  # GRPO's backward comes after the channels' (losses.costs)
        logged = {SDPOHintDistillation.metric: 0.0, TraceReplayDPO.metric: 0.0}  # the built-in channels' keys, always
        for channel in self.channels:
            value, metrics = self.costs.loss(channel.cost_name, channel.loss, model, inputs, context)
            if value is not None:
                total = total + channel.weight * value / accumulation
            logged.pop(channel.metric, None)
            logged.update(metrics)
        self._log({"loss/grpo": grpo.item() * accumulation, **logged, "loss/total": total.item() * accumulation}, mode)
        return total

    def flush_replay_pairs(self) -> None:
        """Let every channel finish (trace replay stores the pairs its teachers finished since
        the last step); call after training so the last steps' pairs are kept."""
        for channel in self.channels:
            channel.finish()
