"""``DebateGRPOTrainer``: TRL's ``GRPOTrainer`` with role-mapped advantages and two extra losses.

Only a few TRL hooks are overridden; the maths lives in small modules:

- ``_generate``: after TRL's tool loop, a debate the rollout left open is finished with the
  rollout's last assistant message (``EpisodeTrace.finish``).
- ``_generate_and_score_completions`` (before TRL shuffles the batch, on gathered data):
  gathers the graded records (through each environment's ``trace``), the completion
  segments and, when needed, the policy's verdict probabilities (COMA) and GiGPO's step
  inputs, and hands them to ``advantages.batch_advantages``: the whole record -> shaping ->
  estimator -> ``(B, T)`` path, top to bottom in one module; judge tokens and tokens of no turn
  are masked out of the loss and of every group statistic. It also marks error sites for hint
  distillation and sends replays to the teacher pool.
- ``compute_loss``: ``total = grpo + α·sdpo + β·replay``; the extra terms are divided by the
  gradient-accumulation steps exactly as TRL scales its own loss.

Channel 2 (SDPO hint distillation): for a turn with an error-site marker, the teacher context
is the same context with the hint for its ``hint_template_key`` inserted as a user message
before the erring turn; teacher logits come from the same model without gradient; the loss is
the generalized JSD (``losses``) on that turn's tokens only. No error site: no extra forward.

Channel 3 (trace-replay DPO): after each generation batch the student's turns are replayed
to the teacher pool in background threads (the teachers answer the server's ``state(t)`` role
chat, what an external model needs; a request's teachers are asked in parallel). The pair
lives where the policy generated: its context is the rollout's own prompt + completion token
ids before the assistant message that produced turn ``t``, its rejected side that message's
tokens exactly as sampled, its chosen side the teacher's response as the same role's tool call
(``submit_solution`` / ``submit_verdict`` / ``submit_final_answer``) rendered by the training
chat template as TRL renders an assistant tool-call message (``trainer_client.replay_pairs``).
Pairs get reference log-probs under the frozen initial policy (the design's reference: the
student at step 0, see ``_reference_policy``) and go to a JSONL store (with their token ids;
pairs of an older format without them are never sampled); later steps add DPO's sigmoid loss
on a sample of stored pairs. Pairs an oracle teacher agreed on are marked gold-supervised.
"""

from __future__ import annotations

import copy
import logging
import random
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from accelerate.utils import gather_object, is_peft_model
from transformers import PreTrainedTokenizerBase, ProcessorMixin
from trl.trainer.grpo_trainer import GRPOTrainer

from env_server.models import EpisodeRewards, Role
from trainer_client.advantages import GiGPOInputs, batch_advantages, score_unfinished_debates, shuffle_episode_rewards
from trainer_client.config import GiGPOConfig, ReplayConfig, SDPOConfig
from trainer_client.forward import (
    CapturedForward,
    capture_body_forward,
    checkpointing_active,
    pack_responses,
    response_hidden,
    response_hidden_after_prefix,
    response_logits,
    shared_context_logps,
)
from trainer_client.losses import dpo_sigmoid_loss, masked_jsd_loss, sequence_logps
from trainer_client.reporting import DEPRECATED_SDPO_KEY
from trainer_client.role_mapping import (
    announce_strategy,
)
from trainer_client.shaping import RewardShapingStrategy, get_strategy, shaping_metrics
from trainer_client.shaping.base import TRAINED_ROLES, VERIFIER_ACCEPT_PROB
from trainer_client.spans import Segment, completion_segments
from trainer_client.step_credit import rollout_steps, step_rewards
from trainer_client.verdict_probs import verdict_accept_probs

if TYPE_CHECKING:
    from trainer_client.env import DebateEnvironment

__all__ = ["DebateGRPOTrainer", "replay_pair_logps"]

log = logging.getLogger(__name__)



class DebateGRPOTrainer(GRPOTrainer):
    """A ``GRPOTrainer`` for debates served by the env server.

    Args:
        *args, **kwargs: ``GRPOTrainer``'s (``environment_factory`` must build
            :class:`~trainer_client.env.DebateEnvironment` instances).
        shaping_strategy: role-mapped reward shaping (default: identity).
        scale_advantages: divide by the per-role group std.
        sdpo: channel-2 settings (default: off).
        replay: channel-3 settings (default: off).
        hints: hint templates, key -> text (the server's ``GET /hints``); required when
            ``sdpo.alpha > 0``.
        teacher_pool: a :class:`~trainer_client.teachers.TeacherPool`; required when
            ``replay.beta > 0``.
        pair_store: a :class:`~trainer_client.pairs.PairStore`; required when ``replay.beta > 0``.
        advantage_estimator: ``"grpo"`` (per-role group normalisation) or ``"gigpo"``
            (:mod:`trainer_client.gigpo`, settings in ``gigpo``).
        gigpo: GiGPO settings (default: :class:`~trainer_client.config.GiGPOConfig`).
        reward_runner: a :class:`~trainer_client.reward_functions.RewardFunctionRunner` scoring
            every rollout's messages; its valid scores replace the episode reward when
            ``reward_use_score``, its step outputs give GiGPO's step rewards.
        ground_truth: ``problem_id -> reference answer`` passed to the reward function
            (default: ``None`` for every rollout).
        shuffle_rewards: the shuffled-reward control (never for real training): the gathered
            batch's episode rewards are permuted across rollouts before shaping
            (:func:`~trainer_client.advantages.shuffle_episode_rewards`); logged rewards stay true.
        unfinished_debate_reward: the episode reward of a rollout whose debate the adapter had
            to finish by forfeiting turns (:func:`~trainer_client.advantages.score_unfinished_debates`);
            ``None`` keeps the server's graded reward.

    Raises:
        ValueError: a channel is on without what it needs.
    """

    def __init__(self, *args: Any, shaping_strategy: RewardShapingStrategy | None = None, scale_advantages: bool = True,
                 sdpo: SDPOConfig | None = None, replay: ReplayConfig | None = None,
                 hints: dict[str, str] | None = None, teacher_pool: Any = None, pair_store: Any = None,
                 advantage_estimator: str = "grpo", gigpo: GiGPOConfig | None = None, reward_runner: Any = None,
                 reward_use_score: bool = True, ground_truth: Any = None, shuffle_rewards: bool = False,
                 unfinished_debate_reward: float | None = 0.0, **kwargs: Any) -> None:
        if advantage_estimator not in ("grpo", "gigpo"):
            raise ValueError(f"advantage_estimator must be 'grpo' or 'gigpo', got {advantage_estimator!r}")
        super().__init__(*args, **kwargs)
        if self.use_vllm:  # TRL's colocate weight sync cannot reach vLLM's prepacked CPU weights
            from trainer_client.trl_compat import sync_vllm_cpu_weights_by_layerwise_reload

            sync_vllm_cpu_weights_by_layerwise_reload(self.vllm_generation)
        self.advantage_estimator = advantage_estimator
        self.gigpo = gigpo or GiGPOConfig()
        self.reward_runner = reward_runner
        self.reward_use_score = reward_use_score
        self.ground_truth = ground_truth
        self.shuffle_rewards = shuffle_rewards
        self.unfinished_debate_reward = unfinished_debate_reward
        if shuffle_rewards:
            log.info("CONTROL RUN: episode rewards are shuffled within each batch (shuffle_rewards=true)")
        self.shaping_strategy = shaping_strategy or get_strategy("identity")
        announce_strategy(self.shaping_strategy)
        self.scale_advantages = scale_advantages
        self.sdpo = sdpo or SDPOConfig()
        self.replay = replay or ReplayConfig()
        self.hints = hints or {}
        self.teacher_pool = teacher_pool
        self.pair_store = pair_store
        if self.sdpo.alpha > 0 and not self.hints:
            raise ValueError("sdpo.alpha > 0 needs the hint templates (the env server's GET /hints)")
        if self.replay.beta > 0 and (teacher_pool is None or pair_store is None):
            raise ValueError("replay.beta > 0 needs a teacher pool and a pair store")
        self._batch_completions: list[list[dict[str, Any]]] = []
        self._hint_ids: dict[str, list[int]] = {}
        self._gen_prompt_ids = self._chat_delta([{"role": "user", "content": "x"}], [], generation_prompt=True)
        # per process: under torchrun/accelerate each rank samples its own replay pairs (identical
        # stores, e.g. after a restart, would otherwise give every rank the same DPO batch)
        self._rng = random.Random(self.args.seed + self.accelerator.process_index)
        #: the current optimiser step's DPO pairs: (global_step, shares per micro-batch, count, next share)
        self._replay_shares: tuple[int, list[list[Any]], int, int] | None = None
        self._initial_policy = self._frozen_initial_policy() if self.replay.beta > 0 else None

    # ------------------------------------------------------------------ typed views of TRL's attributes

    @property
    def _chat_processor(self) -> PreTrainedTokenizerBase | ProcessorMixin:
        """``processing_class`` (TRL loads one when none is given), for its chat template."""
        processor = self.processing_class
        assert isinstance(processor, (PreTrainedTokenizerBase, ProcessorMixin)), \
            f"a tokenizer or processor is needed, got {type(processor).__name__}"
        return processor

    @property
    def _text_tokenizer(self) -> PreTrainedTokenizerBase:
        """``processing_class`` where a text tokenizer is needed (hints, padding, replay pairs)."""
        tokenizer = self.processing_class
        assert isinstance(tokenizer, PreTrainedTokenizerBase), f"a text tokenizer is needed, got {type(tokenizer).__name__}"
        return tokenizer

    def _debate_environments(self) -> list[DebateEnvironment] | None:
        """This batch's environments (``None`` before the first batch)."""
        # TRL 1.16 declares `environments` by its initial value, None; `_generate_and_score_completions` fills it
        # with one `environment_factory` instance (here a DebateEnvironment) per rollout before generating.
        return cast("list[DebateEnvironment] | None", self.environments)

    # ------------------------------------------------------------------ rollouts

    def _generate(self, prompts: list):
        out = super()._generate(prompts)
        # trl 1.16 GRPOTrainer._generate returns (prompt_ids, completion_ids, tool_mask, completions,
        # logprobs, extra_fields, images, tool_images); a different shape means another TRL release.
        if not isinstance(out, tuple) or len(out) != 8:
            raise RuntimeError(f"GRPOTrainer._generate returned {type(out).__name__} of length "
                               f"{len(out) if isinstance(out, tuple) else '?'}; this trainer needs trl 1.16's 8-tuple")
        completions = out[3]
        self._batch_completions = completions
        environments = self._debate_environments()
        if not environments:
            return out
        for environment, messages in zip(environments, completions, strict=True):  # one environment per rollout
            if environment.trace.done:
                continue
            last = messages[-1] if messages else {}
            text = last.get("content") if last.get("role") == "assistant" and not last.get("tool_calls") else None
            environment.trace.finish(text if isinstance(text, str) else None)
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        assert self.model is not None, "GRPOTrainer always has a model"
        mode = "train" if self.model.training else "eval"
        device = output["completion_ids"].device
        environments = self._debate_environments()
        assert environments is not None, "TRL builds the batch's environments before scoring it"
        records: list[EpisodeRewards] = [env.trace.wait_record() for env in environments]
        user_results = self._user_rewards(inputs, records, mode) if self.reward_runner is not None else None
        if user_results is not None and self.reward_use_score:
            records = [record.model_copy(update={"episode_reward": result.score}) if result.is_score_valid else record
                       for record, result in zip(records, user_results, strict=True)]
        unfinished = [any(turn.source == "forfeit" for turn in env.trace.turns) for env in environments]
        records = score_unfinished_debates(records, unfinished, self.unfinished_debate_reward)
        self._metrics[mode]["debate/unfinished_rate"].append(float(np.mean(unfinished)))
        completion_mask = output["completion_mask"]
        tool_mask = output.get("tool_mask")
        if tool_mask is None:
            tool_mask = torch.ones_like(completion_mask)
        model_tokens = (completion_mask * tool_mask).tolist()
        segments = [completion_segments(messages, env.trace.turns, tokens)
                    for messages, env, tokens in zip(self._batch_completions, environments, model_tokens, strict=True)]

        # The reward-to-loss path (trainer_client/advantages.py) on the gathered batch: groups are
        # contiguous, num_generations long, as TRL lays them out.
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        assert num_generations is not None, "GRPOConfig resolves num_generations(_eval)"
        all_records = gather_object(records)
        if self.shuffle_rewards and mode == "train":  # the shuffled-reward control (same seed on every process)
            all_records = shuffle_episode_rewards(all_records, seed=self.args.seed * 1_000_003 + self.state.global_step)
        accept_probs = (self._verdict_probs(output, segments)
                        if VERIFIER_ACCEPT_PROB in self.shaping_strategy.extra_columns else None)
        gigpo = self._gigpo_inputs(records, environments, user_results) if self.advantage_estimator == "gigpo" else None
        result = batch_advantages(all_records, num_generations, self.shaping_strategy, segments, completion_mask.shape[1],
                                  self.accelerator.process_index * len(records), scale=self.scale_advantages,
                                  verifier_accept_probs=accept_probs, gigpo=gigpo)
        for name, value in result.metrics.items():
            self._metrics[mode][name].append(value)
        items, shaped, values, loss_mask = result.items, result.shaped, result.values, result.loss_mask
        output["advantages"] = values.to(device)
        output["tool_mask"] = tool_mask * loss_mask.to(device=device, dtype=tool_mask.dtype)
        output["num_items_in_batch"] = self.accelerator.gather((completion_mask * output["tool_mask"]).sum()).sum()
        output["sdpo_sites"] = self._error_sites(records, segments) if self.sdpo.alpha > 0 else [[] for _ in records]

        self._log_debate_metrics(mode, items, shaped, all_records, segments)
        if self.replay.beta > 0 and mode == "train":
            self._replay_to_teachers(records, environments, segments, output)
            self._store_new_pairs()
        return output

    def _verdict_probs(self, output: dict[str, Any], segments: list[list[Segment] | None]) -> list[float | None]:
        """Per rollout of the gathered batch, the policy's π(CORRECT) at its first verdict
        (:func:`~trainer_client.verdict_probs.verdict_accept_probs`: one no-grad forward over
        this process's verdict sites), for strategies that read ``verifier_accept_prob`` (COMA)."""
        assert self.model is not None, "GRPOTrainer always has a model"
        local = verdict_accept_probs(self.accelerator.unwrap_model(self.model), self._text_tokenizer,
                                     output["prompt_ids"], output["completion_ids"], segments,
                                     prompt_mask=output["prompt_mask"])
        return list(gather_object(local))

    # ------------------------------------------------------------------ step-level credit

    def _user_rewards(self, inputs: list[dict[str, Any]], records: list[EpisodeRewards], mode: str):
        """Score each local rollout's messages (prompt + completion) with the user's function."""
        messages = [list(row.get("prompt") or []) + list(completion)
                    for row, completion in zip(inputs, self._batch_completions, strict=True)]
        truths = [self.ground_truth(record.problem_id) if self.ground_truth else None for record in records]
        results = self.reward_runner.evaluate(messages, truths)
        metrics = self._metrics[mode]
        metrics["reward_function/score"].append(float(np.mean([r.score for r in results])))
        metrics["reward_function/invalid_fraction"].append(float(np.mean([not r.is_score_valid for r in results])))
        invalid = [r.reason for r in results if not r.is_score_valid]
        if invalid:
            log.warning("%d/%d rollouts got an invalid user reward, e.g. %s", len(invalid), len(results), invalid[0])
        return results

    def _gigpo_inputs(self, records: list[EpisodeRewards], environments, user_results) -> GiGPOInputs:
        """GiGPO's inputs for the gathered batch: per rollout ``r_t`` and the acting role's
        observation per turn, with the configured settings."""
        local, unaligned, unmatched = [], 0, []
        for k, (record, environment) in enumerate(zip(records, environments, strict=True)):
            # step outputs index the rollout's assistant messages: the completion messages say which produced each turn
            completion = self._batch_completions[k] if k < len(self._batch_completions) else None
            rollout = rollout_steps(record, environment.trace.turns, completion)
            result = user_results[k] if user_results is not None else None
            rewards, problems = step_rewards(record, rollout, result, self.gigpo.step_reward_default,
                                             gamma=self.gigpo.gamma)
            unaligned += len(problems)
            for problem in problems:
                log.debug("rollout %d: %s", k, problem)
            if rollout.unmatched is not None and problems:
                unmatched.append(rollout.unmatched)
            local.append((rewards, [s.observation_data for s in rollout.steps]))
        if unmatched:
            log.warning("%d/%d rollouts: step outputs ignored, no assistant message index could be placed (%s)",
                        len(unmatched), len(records), unmatched[0])
        if user_results is not None:
            assert self.model is not None, "GRPOTrainer always has a model"
            self._metrics["train" if self.model.training else "eval"]["reward_function/unaligned_step_outputs"].append(
                float(unaligned))
        gathered = gather_object(local)
        return GiGPOInputs([rewards for rewards, _ in gathered], [observations for _, observations in gathered],
                           omega=self.gigpo.omega, gamma=self.gigpo.gamma, mode=self.gigpo.mode,
                           similarity_threshold=self.gigpo.similarity_threshold)

    # ------------------------------------------------------------------ loss

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        captured: list[CapturedForward] = []
        with ExitStack() as stack:
            if self.sdpo.alpha > 0 and any(inputs.get("sdpo_sites", [])):
                # Hint distillation reuses GRPO's own forward: its final hidden states are the
                # student side, its keys and values the teacher's context before the hint.
                captured = stack.enter_context(capture_body_forward(self.accelerator.unwrap_model(model)))
            grpo = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        assert self.model is not None, "GRPOTrainer always has a model"
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        total = grpo
        sdpo_value = 0.0
        if self.sdpo.alpha > 0:
            # one forward per micro-batch (TRL does not chunk it in compute_loss); else recompute
            sdpo = self._sdpo_loss(model, inputs, captured[0] if len(captured) == 1 else None)
            if sdpo is not None:
                total = total + self.sdpo.alpha * sdpo / accumulation
                sdpo_value = sdpo.item()
        replay_logged: float | None = 0.0
        if self.replay.beta > 0:
            replay, replay_logged = self._replay_loss(model, mode, accumulation)
            if replay is not None:
                total = total + self.replay.beta * replay / accumulation
        metrics = self._metrics[mode]
        metrics["loss/grpo"].append(grpo.item() * accumulation)
        metrics["loss/sdpo_jsd"].append(sdpo_value)
        metrics[DEPRECATED_SDPO_KEY].append(sdpo_value)  # the old name, for one release
        if replay_logged is not None:
            metrics["loss/trace_replay_dpo"].append(replay_logged)
        metrics["loss/total"].append(total.item() * accumulation)
        return total

    # ------------------------------------------------------------------ channel 2: SDPO

    def _error_sites(self, records: list[EpisodeRewards], segments: list[list[Segment] | None]) -> list[list[tuple]]:
        """Per rollout, ``(start, end, hint_key)`` of every segment that produced an erring turn."""
        roles = set(self.sdpo.roles)
        out = []
        for record, segs in zip(records, segments, strict=True):
            sites = []
            for seg in segs or []:
                if seg.owner is None or not seg.owner.produced or seg.owner.role not in roles:
                    continue
                turn = record.turns[seg.owner.t]
                if turn.error_kind is not None and turn.hint_template_key in self.hints and seg.end > seg.start:
                    sites.append((seg.start, seg.end, turn.hint_template_key))
            out.append(sites)
        return out

    def _chat_delta(self, base: list[dict[str, str]], added: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        """Token ids the chat template adds when ``added`` messages (and, optionally, the
        generation prompt) follow ``base``."""
        template_kwargs = self.chat_template_kwargs
        assert isinstance(template_kwargs, dict), "TrainingArguments parses chat_template_kwargs into a dict"
        kwargs = {"chat_template": self.chat_template, "tokenize": True, "return_dict": False, **template_kwargs}
        # tokenize=True, return_dict=False on one conversation: its token ids
        processor = self._chat_processor
        prefix = cast("list[int]", processor.apply_chat_template(base, add_generation_prompt=False, **kwargs))
        full = cast("list[int]", processor.apply_chat_template(base + added, add_generation_prompt=generation_prompt, **kwargs))
        if list(full[: len(prefix)]) != list(prefix):
            raise ValueError("the chat template is not prefix-preserving; hint insertion needs one that is")
        return list(full[len(prefix):])

    def _with_hint(self, context: list[int], key: str) -> list[int]:
        """``context`` (ending with the generation prompt of the erring turn) with the hint
        inserted as a user message right before that turn."""
        kept, inserted = self._hint_insertion(context, key)
        return context[:kept] + inserted

    def _hint_insertion(self, context: list[int], key: str) -> tuple[int, list[int]]:
        """How the hinted context is built from ``context``: ``(kept, inserted)`` for
        ``context[:kept] + inserted``. With a prefix-preserving chat template the generation
        prompt is dropped and the hint's user message plus a new generation prompt follow;
        otherwise the hint is appended as plain text."""
        if key not in self._hint_ids:
            self._hint_ids[key] = self._chat_delta([{"role": "user", "content": "x"}],
                                                   [{"role": "user", "content": self.hints[key]}], generation_prompt=True)
        gen = self._gen_prompt_ids
        if gen and context[-len(gen):] == gen:
            return len(context) - len(gen), list(self._hint_ids[key])
        hint_text = self._text_tokenizer(f"Hint: {self.hints[key]}\n", add_special_tokens=False)["input_ids"]
        return len(context), list(hint_text)

    def _sdpo_loss(self, model, inputs, policy_forward: CapturedForward | None = None) -> torch.Tensor | None:
        """Generalized JSD between the policy and its hint-conditioned self on erring turns.

        Args:
            model: the policy.
            inputs: the micro-batch (``sdpo_sites`` lists ``(start, end, hint_key)`` per row).
            policy_forward: the policy's GRPO forward over this micro-batch
                (:func:`~trainer_client.forward.capture_body_forward`). Its ``(B, P + C, H)``
                final hidden states are the student side; its cache, where it kept one, holds
                the teacher's context before the hint, so the teacher runs only the hint and
                the turn. ``None`` runs both sides in full (the same values up to float order).

        Returns:
            The mean per-token divergence over the sites' tokens, or ``None`` without sites.
        """
        sites = [(row, start, end, key) for row, row_sites in enumerate(inputs.get("sdpo_sites", []))
                 for start, end, key in row_sites][: self.sdpo.max_sites_per_batch]
        if not sites:
            return None
        prompt_ids, prompt_mask, completion_ids = inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"]
        prompt_width = prompt_ids.shape[1]
        contexts, insertions, responses = [], [], []
        for row, start, end, key in sites:
            context = prompt_ids[row][prompt_mask[row].bool()].tolist() + completion_ids[row][:start].tolist()
            contexts.append(context)
            insertions.append(self._hint_insertion(context, key))
            responses.append(completion_ids[row][start:end].tolist())
        pad = self._text_tokenizer.pad_token_id
        device = completion_ids.device
        hinted = [context[:kept] + inserted for context, (kept, inserted) in zip(contexts, insertions, strict=True)]
        teacher = pack_responses(hinted, responses, pad, device)
        unwrapped = self.accelerator.unwrap_model(model)
        if policy_forward is not None:
            student_hidden = self._site_hidden(policy_forward.hidden, sites, prompt_width, teacher.response_length)
        else:
            student_hidden = response_hidden(unwrapped, pack_responses(contexts, responses, pad, device))
        with torch.no_grad():
            teacher_hidden = None
            if policy_forward is not None and policy_forward.cache is not None:
                # the kept context ends where the dropped generation prompt (if any) began
                teacher_hidden = response_hidden_after_prefix(
                    unwrapped, policy_forward, [row for row, *_ in sites],
                    [prompt_width + start - (len(context) - kept)
                     for (_, start, _, _), context, (kept, _) in zip(sites, contexts, insertions, strict=True)],
                    [kept for kept, _ in insertions], [inserted for _, inserted in insertions], responses, pad)
            if teacher_hidden is None:
                teacher_hidden = response_hidden(unwrapped, teacher)
        head = unwrapped.get_output_embeddings()
        if self.sdpo.backend == "liger":
            from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

            loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=self.sdpo.jsd_beta,
                                              temperature=self.sdpo.temperature, compiled=False)
            mask = teacher.mask
            return loss_fn(student_hidden[mask], head.weight, teacher_hidden[mask], head.weight, teacher.labels[mask])
        with torch.no_grad():
            teacher_logits = head(teacher_hidden)
        return masked_jsd_loss(head(student_hidden), teacher_logits, teacher.mask, beta=self.sdpo.jsd_beta,
                               temperature=self.sdpo.temperature, token_clip=self.sdpo.token_clip)

    @staticmethod
    def _site_hidden(hidden: torch.Tensor, sites: list[tuple], prompt_width: int, length: int) -> torch.Tensor:
        """``(n, L, H)`` hidden states predicting each site's tokens, right-aligned like
        :class:`~trainer_client.forward.ResponseBatch` (zeros before shorter sites)."""
        out = hidden.new_zeros((len(sites), length, hidden.shape[-1]))
        for i, (row, start, end, _) in enumerate(sites):
            n = end - start
            # completion token k sits at prompt_width + k and is predicted from the position before
            out[i, length - n:] = hidden[row, prompt_width + start - 1: prompt_width + end - 1]
        return out

    # ------------------------------------------------------------------ channel 3: replay DPO

    def _replay_to_teachers(self, records, environments, segments, output: dict[str, Any]) -> None:
        """Queue this batch's student turns for the teachers (wrong ones first); non-blocking.

        Each request carries the rollout's exact token context before the assistant message
        that produced the turn and that message's own tokens (``output``'s ``prompt_ids``,
        ``prompt_mask``, ``completion_ids`` cut at the turn's segment): the pair is trained on
        the very tokens the policy saw and generated, never on a re-rendering of them.
        """
        from trainer_client.replay_pairs import rollout_pair_ids
        from trainer_client.teachers import ReplayRequest

        prompt_ids, prompt_mask, completion_ids = output["prompt_ids"], output["prompt_mask"], output["completion_ids"]
        requests = []
        roles = set(self.replay.roles)
        for k, (record, env, segs) in enumerate(zip(records, environments, segments, strict=True)):
            producing = {seg.owner.t: seg for seg in segs or []
                         if seg.owner is not None and seg.owner.produced and seg.end > seg.start}
            observation = env.trace.observation
            transcript = observation.transcript if observation is not None else []
            for turn in record.turns:
                seg = producing.get(turn.t)
                if turn.role not in roles or seg is None or turn.t >= len(transcript):
                    continue
                requests.append((turn.correct is True, k, record, env, turn, seg, transcript[turn.t].content))
        requests.sort(key=lambda r: r[0])  # wrong answers first
        budget = self.replay.budget_per_step
        batch = []
        for _, k, record, env, turn, seg, content in requests[:budget]:
            context, rejected = rollout_pair_ids(prompt_ids[k].tolist(), prompt_mask[k].tolist(),
                                                 completion_ids[k].tolist(), seg.start, seg.end)
            messages = [message.model_dump() for message in env.trace.replay(turn.t).messages]
            batch.append(ReplayRequest(episode_id=record.episode_id, t=turn.t, role=turn.role,
                                       problem_id=record.problem_id, messages=messages,
                                       student_response=content, student_answer=turn.answer,
                                       context_ids=tuple(context), rejected_ids=tuple(rejected)))
        if batch:
            self.teacher_pool.submit_step(self.state.global_step, batch)

    def _store_new_pairs(self) -> None:
        """Give pairs finished since the last step their chosen side's token ids (the teacher's
        response as the role's tool call, in the training chat template) and their reference
        log-probs (under the frozen initial policy), and store them. Runs on the training
        thread: the tokenizer is never used from the teacher threads."""
        from trainer_client.replay_pairs import tool_call_message, tool_call_response_ids

        tokenizer = self._text_tokenizer
        template_kwargs = self.chat_template_kwargs
        assert isinstance(template_kwargs, dict), "TrainingArguments parses chat_template_kwargs into a dict"
        pairs = []
        for pair in self.teacher_pool.collect():
            message = tool_call_message(pair.role, pair.chosen)
            if message is None or not (pair.context_ids and pair.rejected_ids):
                log.warning("replay pair (episode %s, t=%d) dropped: %s", pair.episode_id, pair.t,
                            "no rollout tokens" if message is not None else f"no {pair.role.value} answer in the teacher's text")
                continue
            pair.chosen_ids = tool_call_response_ids(tokenizer, message, chat_template=self.chat_template,
                                                     eos_token_id=tokenizer.eos_token_id,
                                                     template_kwargs=template_kwargs)
            pairs.append(pair)
        if not pairs:
            return
        with torch.no_grad(), self._reference_policy() as reference:
            chosen, rejected = self._pair_logps(reference, pairs)
        for pair, c, r in zip(pairs, chosen.tolist(), rejected.tolist(), strict=True):
            pair.ref_chosen_logp, pair.ref_rejected_logp = c, r
        self.pair_store.add(pairs)

    def flush_replay_pairs(self) -> None:
        """Store the replay pairs the teachers finished since the last step (with their
        reference log-probs); call after training so the last steps' pairs are kept."""
        self._store_new_pairs()

    def _frozen_initial_policy(self) -> torch.nn.Module | None:
        """A frozen copy of the policy at step 0, when nothing else already holds one.

        trl 1.16 ``GRPOTrainer`` keeps the initial policy as ``ref_model`` when ``beta != 0``
        and ``sync_ref_model`` is off, and under PEFT the base model is the initial policy with
        the adapters disabled; in those cases no copy is made. Otherwise (full fine-tuning with
        ``beta == 0``, or a reference TRL re-synchronises) the copy costs one more set of
        weights in memory, the price of the design's fixed reference.
        """
        assert self.model is not None, "GRPOTrainer always has a model"
        unwrapped = self.accelerator.unwrap_model(self.model)
        if is_peft_model(unwrapped) or self._ref_model_is_initial():
            return None
        frozen = copy.deepcopy(unwrapped)
        # trl 1.16 replaces ``forward`` on the policy instance (``trl.trainer.utils``: fused LM-head
        # log-probs) by a closure over the original bound method, which deepcopy does not rebind:
        # the copy would run the live policy. Give the copy its class's forward back (we never use
        # the fused path); tests/test_train_e2e.py checks the reference against the step-0 weights.
        for module in frozen.modules():
            module.__dict__.pop("forward", None)
        frozen.requires_grad_(False)
        frozen.train(False)
        return cast("torch.nn.Module", frozen)

    def _ref_model_is_initial(self) -> bool:
        """Whether TRL's ``ref_model`` exists and stays the initial policy (``GRPOConfig.sync_ref_model`` off)."""
        return self.ref_model is not None and not getattr(self.args, "sync_ref_model", False)

    @contextmanager
    def _reference_policy(self) -> Iterator[torch.nn.Module]:
        """The reference policy of trace-replay DPO: the student's initial policy (never the
        policy of the moment, which would give every new pair a zero margin and a moving
        reference). Yields the frozen copy, TRL's ``ref_model``, or the PEFT model with its
        adapters disabled (trl 1.16 ``trl.trainer.utils.use_adapter``, as TRL's own KL term does)."""
        assert self.model is not None, "GRPOTrainer always has a model"
        if self._initial_policy is not None:
            yield self._initial_policy
        elif self.ref_model is not None and self._ref_model_is_initial():
            yield self.ref_model
        else:
            from trl.trainer.utils import use_adapter  # trl 1.16: the adapter switch TRL's KL term uses

            unwrapped = self.accelerator.unwrap_model(self.model)
            with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                yield self.model

    def _pair_logps(self, model: torch.nn.Module, pairs: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-probs of chosen and rejected token ids given each pair's context under
        ``model``: two ``(N,)`` tensors."""
        assert self.max_completion_length is not None, "GRPOConfig always sets max_completion_length"
        return replay_pair_logps(model, pairs, pad_token_id=self._text_tokenizer.pad_token_id,
                                 max_completion_length=self.max_completion_length, device=self.accelerator.device)

    def _replay_loss(self, model: torch.nn.Module, mode: str,
                     accumulation: int) -> tuple[torch.Tensor | None, float | None]:
        """This micro-batch's share of DPO's sigmoid loss on the step's sample of stored pairs.

        ``replay.pairs_per_step`` pairs are drawn once per optimiser step (only pairs with token
        ids and reference log-probs) and dealt round-robin over the step's ``accumulation``
        micro-batches, so the DPO batch of a step does not depend on how gradient accumulation
        splits it (a memory setting, not an algorithm setting). Micro-batch ``j`` with pairs
        ``P_j`` of the step's ``N`` returns ``accumulation · Σ_{p∈P_j} loss_p / N``; after the
        caller's ``/ accumulation`` the step's gradient is that of the mean loss over its ``N``
        pairs, as with one micro-batch. Outside training (or with one micro-batch) each call
        draws its own pairs and returns their mean.

        Returns:
            ``(loss, logged)``: the scalar term (``None``: no pair for this micro-batch) and the
            value logged as ``loss/trace_replay_dpo``: the mean loss over this micro-batch's
            pairs; 0 on the first micro-batch of a step that drew none; ``None`` (nothing
            logged, so the logged mean is not diluted) on a later micro-batch left without a share.
        """
        if mode != "train" or accumulation == 1:
            loss = self._dpo_loss(model, self.pair_store.sample(self.replay.pairs_per_step, self._rng))
            return loss, (0.0 if loss is None else loss.item())
        step = self.state.global_step
        if self._replay_shares is None or self._replay_shares[0] != step:
            drawn = self.pair_store.sample(self.replay.pairs_per_step, self._rng)
            self._replay_shares = (step, [drawn[j::accumulation] for j in range(accumulation)], len(drawn), 0)
        step, shares, drawn_count, index = self._replay_shares
        self._replay_shares = (step, shares, drawn_count, index + 1)
        share = shares[index] if index < len(shares) else []
        if not share:
            return None, (0.0 if index == 0 else None)
        loss = self._dpo_loss(model, share)
        assert loss is not None
        return loss * (accumulation * len(share) / drawn_count), loss.item()

    def _dpo_loss(self, model: torch.nn.Module, pairs: list[Any]) -> torch.Tensor | None:
        """DPO's sigmoid loss averaged over ``pairs`` (``None`` for no pair).

        The pairs run through the unwrapped policy, never the DDP wrapper: a wrapped forward is a
        collective (DDP broadcasts buffers from rank 0 on each one), and processes draw different
        numbers of pairs, so wrapped forwards would leave the ranks waiting on each other. The
        gradient still reaches DDP's all-reduce in the same backward (one summed gradient per
        parameter), as for SDPO's forwards; ``tests/test_multiprocess_training.py`` runs it."""
        if not pairs:
            return None
        chosen, rejected = self._pair_logps(self.accelerator.unwrap_model(model), pairs)
        ref_chosen = torch.tensor([p.ref_chosen_logp for p in pairs], device=chosen.device, dtype=chosen.dtype)
        ref_rejected = torch.tensor([p.ref_rejected_logp for p in pairs], device=chosen.device, dtype=chosen.dtype)
        return dpo_sigmoid_loss(chosen, rejected, ref_chosen, ref_rejected, self.replay.dpo_beta)

    # ------------------------------------------------------------------ metrics

    def _log_debate_metrics(self, mode: str, items, shaped: np.ndarray, records: list[EpisodeRewards],
                            segments: list[list[Segment] | None]) -> None:
        metrics = self._metrics[mode]
        for name, value in shaping_metrics(items.rewards, shaped, items.roles, items.group_ids).items():
            metrics[name].append(value)
        per_role: dict[Role, list[float]] = defaultdict(list)
        sites = trained = 0
        for record in records:
            for turn in record.turns:
                per_role[turn.role].append(turn.reward)
                if turn.role in TRAINED_ROLES:
                    trained += 1
                    sites += turn.error_kind is not None
        for role in TRAINED_ROLES:
            values = per_role.get(role)
            if values:
                metrics[f"debate/reward/{role.value}"].append(float(np.mean(values)))
        judged = [r.facts.judge_correct for r in records if r.facts.judge_correct is not None]
        if judged:
            metrics["debate/judge_accuracy"].append(float(np.mean(judged)))
        metrics["debate/episode_reward"].append(float(np.mean([r.episode_reward for r in records])))
        metrics["debate/error_site_rate"].append(sites / trained if trained else 0.0)
        metrics["debate/unaligned_rollouts"].append(float(sum(s is None for s in segments)))
        if self.teacher_pool is not None:
            for name, value in self.teacher_pool.counters().items():
                metrics[name].append(float(value))
        if self.pair_store is not None:
            metrics["pairs/stored"].append(float(len(self.pair_store)))


def replay_pair_logps(model: torch.nn.Module, pairs: list[Any], *, pad_token_id: int | None,
                      max_completion_length: int, device: torch.device | str,
                      max_context_tokens: int = 4096, shared_context: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of each pair's chosen and rejected token ids given its context ids.

    Args:
        model: the policy or the reference policy.
        pairs: :class:`~trainer_client.pairs.DpoPair` items with token ids (``context_ids``,
            ``chosen_ids``, ``rejected_ids``; the rollout's own tokens, see
            :mod:`trainer_client.replay_pairs`).
        pad_token_id: the tokenizer's padding id.
        max_completion_length: responses are cut to this many tokens (their last token kept).
        device: where the batch goes.
        max_context_tokens: contexts are cut from the left to this many tokens.
        shared_context: run each context once for both sides
            (:func:`~trainer_client.forward.shared_context_logps`); ``False``, or a model under
            activation checkpointing, runs one ``context + response`` row per side (same values
            and gradients, about 1.6x the tokens with a 384-token context and 128-token turns).

    Returns:
        ``(chosen, rejected)``, two ``(N,)`` float tensors (nats, summed over response tokens).

    Raises:
        ValueError: a pair without token ids (an older pair format: never sampled for training).
    """
    from trainer_client.replay_pairs import cap_response

    contexts, responses = [], []
    for pair in pairs:
        if not pair.has_token_ids:
            raise ValueError(f"replay pair (episode {pair.episode_id}, t={pair.t}) has no token ids: pairs of the "
                             "format without context_ids/chosen_ids/rejected_ids cannot be scored")
        contexts.append(list(pair.context_ids)[-max_context_tokens:])
        responses.append([cap_response(ids, max_completion_length) for ids in (pair.chosen_ids, pair.rejected_ids)])
    pad = pad_token_id if pad_token_id is not None else 0
    if shared_context and not checkpointing_active(model):
        # chosen and rejected share the context: run it once (its KV cache serves both), which
        # makes a pair cost one context + two turns instead of two contexts + two turns
        logps = shared_context_logps(model, contexts, responses, pad, device)
        return logps[:, 0], logps[:, 1]
    # one ``context + response`` row per side (under activation checkpointing, which drops caches)
    batch = pack_responses([c for c in contexts for _ in (0, 1)], [r for group in responses for r in group], pad, device)
    flat = sequence_logps(response_logits(model, batch), batch.labels, batch.mask)
    return flat[0::2], flat[1::2]
