"""Trace-replay DPO: the policy's own turns replayed to a pool of teachers, trained on the pairs.

After each generation batch the student's turns are replayed to the teacher pool in background
threads (the teachers answer the server's ``state(t)`` role chat, what an external model needs;
a request's teachers are asked in parallel). The pair lives where the policy generated: its
context is the rollout's own prompt + completion token ids before the assistant message that
produced turn ``t``, its rejected side that message's tokens exactly as sampled, its chosen
side the teacher's response as the same role's tool call (``submit_solution`` /
``submit_verdict`` / ``submit_final_answer``) rendered by the training chat template as TRL
renders an assistant tool-call message (:mod:`trainer_client.losses.replay_pairs`). Pairs get
reference log-probs under the frozen initial policy (the student at step 0) and go to a JSONL
store; later steps add DPO's sigmoid loss (Rafailov et al. 2023, arXiv 2305.18290, Eq. 7):

    L = −log σ(β · [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])

averaged over a sample of stored pairs, plus, with ``replay.rpo_alpha > 0``, RPO's negative
log-likelihood of the chosen side (Pang et al. 2024, arXiv 2404.19733, Eq. 3):
``− rpo_alpha · log π(y_w|x) / |y_w|``. With ``replay.pair_tokens: disagreement`` the two log-probs
in the margin are sums weighted per token (``Σ_j w_j · log π(y_j | x, y_<j)``, the same weights
on the reference's), where the weights
(:func:`~trainer_client.losses.replay_pairs.disagreement_weights`) leave out the sides' shared
prefix and weigh the text they share after the first difference by ``replay.shared_weight``:
the rejected side is pushed down only where it disagrees with the chosen one. Pairs an oracle
teacher agreed on are marked gold-supervised.

Saturation is logged, not guessed: the trained pairs' mean chosen and rejected log-probs
(``replay/chosen_logp``, ``replay/rejected_logp``, nats per pair) each step, and every
``monitor_every`` steps the same plus the preference accuracy on held-out pairs, a share of the
pairs never trained on, and the share of them whose margin is above the start policy's
(``replay/heldout/*``). ``loss/trace_replay_dpo`` is DPO's term alone; with ``rpo_alpha > 0``
RPO's chosen-side NLL is logged beside it as ``loss/trace_replay_nll`` (nats per token, before
its weight ``rpo_alpha``).

Three settings let the pairs be learned while GRPO moves the policy (issue 56):

- ``replay.ref_model_sync_steps``: TR-DPO's reference that follows the policy (Gorbatovski et al.
  2024, arXiv 2404.09656, Eq. 4-5, as TRL's ``DPOConfig.sync_ref_model``): every that many
  optimizer steps ``θ_ref ← α·θ + (1 − α)·θ_ref`` (``α = replay.ref_model_mixup_alpha``, TRL's
  ``SyncRefModelCallback.sync_target_model``). Each pair remembers after how many syncs its
  reference log-probs were computed (``DpoPair.ref_sync``); a drawn (or monitored) pair whose
  count is not the current one gets them again under the reference of the moment, so DPO's
  margin is always taken against the current reference.
- ``replay.draws_per_pair``: each pair trained on at most that many times, the least drawn first
  (:meth:`~trainer_client.losses.pair_store.PairStore.sample`).
- ``replay.pair_source``: pairs from the policy's own GRPO group (a right first turn against a
  wrong one on the same prompt tokens, :meth:`TraceReplayDPO.store_group_pairs`), with or
  without the teachers'.

Why this module is longer than 500 lines: one channel's pairs (from teachers and from groups),
its two references (the start, the following one) and its held-out monitor share the pairs'
reference bookkeeping (``ref_sync``, per-token references, the draw counts) in one class; the
split that keeps that bookkeeping in one place (the following reference and group pairs into
their own modules, the class delegating) is the next tidy-up, named in the issue-56 note.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate.utils import is_peft_model
from transformers import TrainerCallback
from trl.trainer.callbacks import SyncRefModelCallback

from env_server.protocol.markers import Role
from trainer_client.losses.base import LossChannel, LossContext, ScoredBatch, register_channel
from trainer_client.losses.functional import chosen_nll, dpo_sigmoid_loss
from trainer_client.losses.pair_store import DpoPair
from trainer_client.losses.replay_pairs import (
    as_policy_writes,
    cap_response,
    disagreement_weights,
    rollout_pair_ids,
    tool_call_message,
    tool_call_response_ids,
)
from trainer_client.losses.settings import ReplayConfig
from trainer_client.losses.teachers import ReplayRequest
from trainer_client.model.forward import (
    checkpointing_active,
    head_logps,
    pack_responses,
    response_hidden,
    shared_context_logps,
)
from trainer_client.trl_compat import reference_adapter, restore_class_forward

__all__ = ["ReferenceSyncCallback", "ReplayConfig", "TraceReplayDPO", "replay_pair_logps"]

#: the file, in a checkpoint's ``mathdebate/`` folder, that holds the following reference's weights
REFERENCE_FILE = "replay_reference.pt"
#: Our state's folder inside a checkpoint: ``trainer_client.training.checkpoints.RANK_DIR`` (a higher
#: layer, which this one may not import; tests/trainer_client/losses/test_replay_learning.py checks they agree).
CHECKPOINT_STATE_DIR = "mathdebate"


log = logging.getLogger(__name__)


@register_channel("trace_replay_dpo")
class TraceReplayDPO(LossChannel):
    """Trace-replay DPO as an :class:`~trainer_client.losses.base.LossChannel` (weight ``β``).

    Args:
        config: the channel's settings (``replay`` in the config).
        teacher_pool: a :class:`~trainer_client.losses.teachers.TeacherPool`.
        pair_store: a :class:`~trainer_client.losses.pair_store.PairStore`.

    Raises:
        ValueError: ``beta > 0`` without a pair store, or without a teacher pool when
            ``pair_source`` is not ``group``.
    """

    metric = "loss/trace_replay_dpo"
    nll_metric = "loss/trace_replay_nll"
    cost_key = "replay"

    def __init__(self, config: ReplayConfig, teacher_pool: Any, pair_store: Any) -> None:
        super().__init__(config.beta, config.roles)
        if config.beta > 0 and (pair_store is None or (teacher_pool is None and config.pair_source != "group")):
            raise ValueError("replay.beta > 0 needs a pair store and, unless replay.pair_source is group, a teacher pool")
        self.config = config
        self.teacher_pool = teacher_pool
        self.pair_store = pair_store
        #: the current optimiser step's DPO pairs: (global_step, shares per micro-batch, count, next share)
        self._shares: tuple[int, list[list[Any]], int, int] | None = None
        #: the trained pairs' log-probs, logged with the next batch's metrics
        self._pending_metrics: dict[str, float] = {}
        self._share_pairs = 0  # pairs in the last micro-batch's term, logged as replay/pairs
        #: the last dpo_loss's two terms (DPO's loss, RPO's NLL; floats), logged separately
        self._terms: tuple[float, float | None] = (0.0, None)
        self._group_pairs = 0  # group pairs stored by the last training batch (replay/group_pairs)
        self._syncs = 0  # reference syncs so far (replay.ref_model_sync_steps)
        self._following: torch.nn.Module | None = None  # the reference that follows the policy
        self.sync_callback: ReferenceSyncCallback | None = None

    def bind(self, trainer: Any) -> None:
        """Keep the trainer; seed this process's pair sampling; freeze the initial policy; with
        ``ref_model_sync_steps``, copy the policy once more as the following reference and
        register :class:`ReferenceSyncCallback` with the trainer.

        Raises:
            ValueError: ``ref_model_sync_steps`` with a PEFT policy (per-role adapters): a
                following reference is wired for full fine-tuning of the shared policy only.
        """
        self.trainer = trainer
        if not self.config.train_pairs:
            log.info("CONTROL RUN: trace replay builds and monitors its pairs but adds no DPO term "
                     "(replay.train_pairs=false)")
        # per process: under torchrun/accelerate each rank samples its own replay pairs (identical
        # stores, e.g. after a restart, would otherwise give every rank the same DPO batch)
        self.rng = random.Random(trainer.args.seed + trainer.accelerator.process_index)
        self._initial_policy = self._frozen_initial_policy()
        if self.config.ref_model_sync_steps is not None:
            unwrapped = trainer.accelerator.unwrap_model(trainer.model)
            if is_peft_model(unwrapped):
                raise ValueError("replay.ref_model_sync_steps (a reference that follows the policy) is wired for the "
                                 "shared policy only, not with LoRA adapters")
            self._following = self._frozen_copy(unwrapped)
            self.sync_callback = ReferenceSyncCallback(self)
            trainer.add_callback(self.sync_callback)

    # ------------------------------------------------------------------ the batch: replays out, pairs in

    def prepare(self, batch: ScoredBatch) -> torch.Tensor | None:
        if batch.mode == "train":
            self.store_new_pairs()  # before this batch's replays go out: none of them can race in
            if self.config.pair_source != "group":
                self.submit_replays(batch)
            if self.config.pair_source != "teachers":
                self._group_pairs = self.store_group_pairs(batch)
        return None

    def store_group_pairs(self, batch: ScoredBatch) -> int:
        """Pairs from the policy's own GRPO groups (``pair_source: group`` or ``both``), stored
        with their reference log-probs; returns how many.

        TRL lays a generation batch out as groups of ``num_generations`` consecutive rollouts of
        one prompt (over all processes: this process's row ``k`` is global row
        ``process_index · B + k``, group ``⌊row / num_generations⌋``). For each group and each
        replayed role (``replay.roles``), each rollout's FIRST turn of that role (the lowest
        ``t``; skipped when that turn produced no tokens of its own, e.g. a forfeit) is a
        candidate with its context (the rollout's prompt + completion ids before the message,
        :func:`~trainer_client.losses.replay_pairs.rollout_pair_ids`, as teacher pairs have it)
        and its server reward (``TurnReward.reward``: 1 right, 0 wrong; other values are left
        out). Only turns on the same context tokens can be compared: for the solver's turn 0
        every rollout of a group shares the problem prompt; later roles' first turns follow
        different rollouts and rarely share a context. Rule: among the group's candidates of a
        role, take the first context (in row order) that has both a right and a wrong turn,
        and pair its first right turn (chosen) with its first wrong turn (rejected), rows in
        batch order (a group's rollouts are exchangeable samples, so the first ones are as good
        as any). At most one pair per (group, role) per batch; none when every reward is equal
        or the two sides' tokens are identical.

        Chosen and rejected ids are the two rollouts' tokens of the turn exactly as sampled;
        the pair is marked ``source: "group"``, its ``teacher`` is ``"group:<right episode>"``,
        its ``episode_id`` the wrong rollout's, its texts are the decoded tokens (for humans).
        """
        output = batch.output
        prompt_ids, prompt_mask, completion_ids = output["prompt_ids"], output["prompt_mask"], output["completion_ids"]
        size = self.trainer.num_generations
        first = self.trainer.accelerator.process_index * len(batch.records)
        candidates: dict[tuple[int, Role], list[tuple[tuple[int, ...], list[int], float, str, int]]] = {}
        for k, (record, segs) in enumerate(zip(batch.records, batch.segments, strict=True)):
            producing = {seg.owner.t: seg for seg in segs or []
                         if seg.owner is not None and seg.owner.produced and seg.end > seg.start}
            firsts: dict[Role, Any] = {}
            for turn in sorted(record.turns, key=lambda turn: turn.t):
                firsts.setdefault(Role(turn.role), turn)
            for role, turn in firsts.items():
                seg = producing.get(turn.t)
                if role not in self.roles or seg is None or turn.reward not in (0.0, 1.0):
                    continue
                context, response = rollout_pair_ids(prompt_ids[k].tolist(), prompt_mask[k].tolist(),
                                                     completion_ids[k].tolist(), seg.start, seg.end)
                candidates.setdefault(((first + k) // size, role), []).append(
                    (tuple(context), response, float(turn.reward), record.episode_id, turn.t))
        tokenizer = self.trainer.processing_class
        pairs = []
        for (_, role), rows in candidates.items():
            for shared in dict.fromkeys(row[0] for row in rows):  # contexts in row order
                right = next((row for row in rows if row[0] == shared and row[2] == 1.0), None)
                wrong = next((row for row in rows if row[0] == shared and row[2] == 0.0), None)
                if right is None or wrong is None:
                    continue
                if right[1] != wrong[1]:
                    pairs.append(DpoPair(prompt_messages=[], chosen=tokenizer.decode(right[1]),
                                         rejected=tokenizer.decode(wrong[1]), episode_id=wrong[3], t=wrong[4], role=role,
                                         teacher=f"group:{right[3]}", created_step=batch.step, context_ids=list(shared),
                                         chosen_ids=list(right[1]), rejected_ids=list(wrong[1]), source="group"))
                break
        if pairs:
            self._set_references(pairs)
            self.pair_store.add(pairs)
        return len(pairs)

    def submit_replays(self, batch: ScoredBatch) -> None:
        """Queue this batch's student turns for the teachers (wrong ones first); non-blocking.

        Each request carries the rollout's exact token context before the assistant message
        that produced the turn and that message's own tokens (``prompt_ids``, ``prompt_mask``,
        ``completion_ids`` cut at the turn's segment): the pair is trained on the very tokens
        the policy saw and generated, never on a re-rendering of them.
        """
        output = batch.output
        prompt_ids, prompt_mask, completion_ids = output["prompt_ids"], output["prompt_mask"], output["completion_ids"]
        requests = []
        for k, (record, env, segs) in enumerate(zip(batch.records, batch.environments, batch.segments, strict=True)):
            producing = {seg.owner.t: seg for seg in segs or []
                         if seg.owner is not None and seg.owner.produced and seg.end > seg.start}
            observation = env.trace.observation
            transcript = observation.transcript if observation is not None else []
            for turn in record.turns:
                seg = producing.get(turn.t)
                if turn.role not in self.roles or seg is None or turn.t >= len(transcript):
                    continue
                requests.append((turn.correct is True, k, record, env, turn, seg, transcript[turn.t].content))
        requests.sort(key=lambda r: r[0])  # wrong answers first
        chosen = []
        for _, k, record, env, turn, seg, content in requests[: self.config.budget_per_step]:
            context, rejected = rollout_pair_ids(prompt_ids[k].tolist(), prompt_mask[k].tolist(),
                                                 completion_ids[k].tolist(), seg.start, seg.end)
            messages = [message.model_dump() for message in env.trace.state_at(turn.t).messages]
            chosen.append(ReplayRequest(episode_id=record.episode_id, t=turn.t, role=turn.role,
                                        problem_id=record.problem_id, messages=messages,
                                        student_response=content, student_answer=turn.answer,
                                        context_ids=tuple(context), rejected_ids=tuple(rejected)))
        if chosen:
            self.teacher_pool.submit_step(batch.step, chosen)

    def store_new_pairs(self) -> None:
        """Give pairs finished since the last step their chosen side's token ids (the teacher's
        response as the role's tool call, in the training chat template) and their reference
        log-probs (under the frozen initial policy), and store them. Runs on the training
        thread: the tokenizer is never used from the teacher threads."""
        if self.teacher_pool is None:  # pair_source: group, without a pool
            return
        trainer = self.trainer
        tokenizer = trainer.processing_class
        template_kwargs = trainer.chat_template_kwargs
        assert isinstance(template_kwargs, dict), "TrainingArguments parses chat_template_kwargs into a dict"
        pairs = []
        # in an order that does not depend on which teacher thread finished first
        collected = sorted(self.teacher_pool.collect(), key=lambda p: (p.created_step, p.t, p.role.value,
                                                                       p.context_ids or [], p.rejected_ids or []))
        for pair in collected:
            message = tool_call_message(pair.role, pair.chosen)
            if message is None or not (pair.context_ids and pair.rejected_ids):
                log.warning("replay pair (episode %s, t=%d) dropped: %s", pair.episode_id, pair.t,
                            "no rollout tokens" if message is not None else f"no {pair.role.value} answer in the teacher's text")
                continue
            rendered = tool_call_response_ids(tokenizer, message, chat_template=trainer.chat_template,
                                              eos_token_id=tokenizer.eos_token_id, template_kwargs=template_kwargs)
            pair.chosen_ids = as_policy_writes(tokenizer, rendered, pair.rejected_ids)
            pairs.append(pair)
        if not pairs:
            return
        self._set_references(pairs)
        self.pair_store.add(pairs)

    def _set_references(self, pairs: list[Any]) -> None:
        """Each pair's reference log-probs under the reference of the moment (per token too with
        ``pair_tokens: disagreement``), one no-grad forward over the pairs; ``ref_sync`` set to
        the current sync count."""
        if self.config.pair_tokens == "disagreement":
            self._set_token_references(pairs)
            return
        with torch.no_grad(), self.reference_policy() as reference:
            chosen, rejected = self.pair_logps(reference, pairs)
        for pair, c, r in zip(pairs, chosen.tolist(), rejected.tolist(), strict=True):
            pair.ref_chosen_logp, pair.ref_rejected_logp = c, r
            pair.ref_sync = self._syncs

    def _set_token_references(self, pairs: list[Any]) -> None:
        """Each pair's per-token reference log-probs (and their sums) under the reference (the
        frozen initial policy, or the following one), one no-grad forward over the pairs
        (``pair_tokens: disagreement``)."""
        limit = self.trainer.max_completion_length
        with torch.no_grad(), self.reference_policy() as reference:
            chosen, rejected = self.pair_logps(reference, pairs, per_token=True)
        for pair, c, r in zip(pairs, chosen.tolist(), rejected.tolist(), strict=True):
            c, r = c[:len(cap_response(pair.chosen_ids, limit))], r[:len(cap_response(pair.rejected_ids, limit))]
            pair.ref_chosen_token_logps, pair.ref_rejected_token_logps = c, r
            pair.ref_chosen_logp, pair.ref_rejected_logp = float(sum(c)), float(sum(r))
            pair.ref_sync = self._syncs

    def _refresh_references(self, pairs: list[Any]) -> None:
        """Recompute the reference log-probs of the pairs computed before the reference's last
        sync (``ref_sync`` not the current count). A pair whose references were the start
        policy's (``ref_sync == 0``) keeps them as its start log-probs first (for
        ``replay/heldout/margin_above_start``)."""
        stale = [p for p in pairs if p.ref_sync != self._syncs]
        if not stale:
            return
        for pair in stale:
            if pair.ref_sync == 0 and pair._start_logps is None:
                pair._start_logps = (pair.ref_chosen_logp, pair.ref_rejected_logp)
        self._set_references(stale)

    def finish(self) -> None:
        """Store the pairs the teachers finished since the last step (call after training)."""
        self.store_new_pairs()

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint: the replays in flight are awaited (up to 10 min: each teacher call
        has its own timeout and retries) and their pairs stored, so the checkpoint holds every pair
        of its steps; then the pair sampling stream, the store's position and draw counts
        (:meth:`PairStore.state_dict`), the teachers' counters, the last trained pairs'
        log-probs (logged with the next step's metrics) and the reference syncs so far.

        With ``ref_model_sync_steps`` the main process also writes the following reference's
        weights (``torch.save`` of its ``state_dict``, one model's size on disk) to
        ``<output_dir>/checkpoint-<step>/mathdebate/replay_reference.pt`` (the checkpoint being
        saved; transformers does not save it) and the state names that file."""
        if self.teacher_pool is not None and not self.teacher_pool.wait(timeout_s=600):
            log.warning("checkpoint at step %d: teacher replays still in flight after 10 min; their pairs come after "
                        "this checkpoint and a resume from it will not have them", self.trainer.state.global_step)
        self.store_new_pairs()
        version, internal, gauss = self.rng.getstate()
        state = {"rng": [version, list(internal), gauss], "pair_store": self.pair_store.state_dict(),
                 "teacher_pool": self.teacher_pool.state_dict() if self.teacher_pool is not None else None,
                 "pending_metrics": dict(self._pending_metrics), "ref_syncs": self._syncs}
        if self._following is not None:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = (Path(self.trainer.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.trainer.state.global_step}"
                      / CHECKPOINT_STATE_DIR)
            if self.trainer.accelerator.is_main_process:  # every process's reference is the same
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(self._following.state_dict(), folder / REFERENCE_FILE)
            state["reference"] = str(folder / REFERENCE_FILE)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the store cut back to its position (draw counts
        included), the stream and the counters where they were, the following reference's sync
        count and weights (a missing weights file: a warning, and the reference restarts from
        the policy as it was built)."""
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        dropped = self.pair_store.load_state_dict(state["pair_store"])
        if dropped:
            log.info("replay pair store: %d pair(s) stored after the checkpoint dropped (their steps are trained "
                     "again)", dropped)
        if self.teacher_pool is not None and state.get("teacher_pool") is not None:
            self.teacher_pool.load_state_dict(state["teacher_pool"])
        self._pending_metrics = dict(state.get("pending_metrics", {}))  # absent in checkpoints before it was kept
        self._syncs = int(state.get("ref_syncs", 0))
        if self._following is not None:
            path = state.get("reference")
            if path is not None and Path(path).exists():
                device = next(self._following.parameters()).device
                self._following.load_state_dict(torch.load(path, map_location=device, weights_only=True))
            else:
                log.warning("replay: the checkpoint has no following reference's weights (%s); the reference restarts "
                            "from the policy as it was built", path)

    def batch_metrics(self) -> dict[str, float]:
        metrics = ({name: float(value) for name, value in self.teacher_pool.counters().items()}
                   if self.teacher_pool is not None else {})
        metrics["pairs/stored"] = float(len(self.pair_store))
        if self.config.pair_source != "teachers":
            metrics["replay/group_pairs"] = float(self._group_pairs)  # stored from this generation batch
            self._group_pairs = 0
        if self._following is not None:
            metrics["replay/ref_syncs"] = float(self._syncs)
        metrics.update(self._pending_metrics)  # the previous step's trained pairs
        self._pending_metrics = {}
        step = self.trainer.state.global_step
        if step % self.config.monitor_every == 0:
            metrics.update(self.monitor(self.trainer.model))
        return metrics

    # ------------------------------------------------------------------ the reference policy

    def _frozen_initial_policy(self) -> torch.nn.Module | None:
        """A frozen copy of the policy at step 0, when nothing else already holds one.

        trl 1.16 ``GRPOTrainer`` keeps the initial policy as ``ref_model`` when ``beta != 0``
        and ``sync_ref_model`` is off, and under PEFT the base model is the initial policy with
        the adapters disabled; in those cases no copy is made. Otherwise (full fine-tuning with
        ``beta == 0``, or a reference TRL re-synchronises) the copy costs one more set of
        weights in memory, the price of the design's fixed reference.
        """
        trainer = self.trainer
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if is_peft_model(unwrapped) or self._ref_model_is_initial():
            return None
        return self._frozen_copy(unwrapped)

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        """A deep copy of ``model`` without gradients, in eval mode, with its class's own forward."""
        frozen = copy.deepcopy(model)
        restore_class_forward(frozen)  # tests/e2e/test_train.py checks the copy against the step-0 weights
        frozen.requires_grad_(False)
        frozen.train(False)
        return frozen

    def sync_reference(self, step: int) -> bool:
        """TR-DPO's soft update of the following reference after optimizer step ``step``
        (Gorbatovski et al. 2024, arXiv 2404.09656, Eq. 4; TRL's ``SyncRefModelCallback``):
        when ``step`` is a multiple of ``ref_model_sync_steps``,
        ``θ_ref ← α·θ_policy + (1 − α)·θ_ref`` parameter by parameter (``α =
        ref_model_mixup_alpha``; 1: a hard copy), and the sync count goes up by one (the pairs'
        stored references are now stale: :meth:`_refresh_references`). Uses TRL 1.16's
        ``SyncRefModelCallback.sync_target_model`` (``target.mul_(1 − α).add_(policy, alpha=α)``
        on each parameter's data; gathered under DeepSpeed ZeRO-3). Returns whether it synced;
        a no-op without ``ref_model_sync_steps``. Buffers are not mixed (TRL mixes parameters only)."""
        every = self.config.ref_model_sync_steps
        if self._following is None or every is None or step <= 0 or step % every:
            return False
        policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
        SyncRefModelCallback.sync_target_model(policy, self._following, self.config.ref_model_mixup_alpha)
        self._syncs += 1
        return True

    def _ref_model_is_initial(self) -> bool:
        """Whether TRL's ``ref_model`` exists and stays the initial policy (``GRPOConfig.sync_ref_model`` off)."""
        return self.trainer.ref_model is not None and not getattr(self.trainer.args, "sync_ref_model", False)

    @contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The reference policy: the student's initial policy (never the policy of the moment,
        which would give every new pair a zero margin and a moving reference), or with
        ``ref_model_sync_steps`` the following reference (TR-DPO), a copy that moves towards
        the policy only at its syncs. Yields that copy, or the start policy
        (:meth:`start_policy`)."""
        if self._following is not None:
            yield self._following
            return
        with self.start_policy() as start:
            yield start

    @contextmanager
    def start_policy(self) -> Iterator[torch.nn.Module]:
        """The student's initial policy, frozen: the frozen copy, TRL's ``ref_model``, or the
        PEFT model with its adapters disabled. Kept as well when the reference follows the
        policy (``replay/heldout/margin_above_start`` reads it): the following reference is the
        one more model copy that costs."""
        trainer = self.trainer
        if self._initial_policy is not None:
            yield self._initial_policy
        elif trainer.ref_model is not None and self._ref_model_is_initial():
            yield trainer.ref_model
        else:
            with reference_adapter(trainer.accelerator.unwrap_model(trainer.model)):
                yield trainer.model

    # ------------------------------------------------------------------ the loss

    def pair_logps(self, model: torch.nn.Module, pairs: list[Any],
                   per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log-probs of chosen and rejected token ids given each pair's context under
        ``model``: two ``(N,)`` tensors (``per_token``: two ``(N, max_completion_length)``, see
        :func:`replay_pair_logps`)."""
        trainer = self.trainer
        assert trainer.max_completion_length is not None, "GRPOConfig always sets max_completion_length"

        def score(subset: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
            return replay_pair_logps(model, subset, pad_token_id=trainer.processing_class.pad_token_id,
                                     max_completion_length=trainer.max_completion_length,
                                     device=trainer.accelerator.device, per_token=per_token)
        router = getattr(trainer, "role_router", None)  # per-role policies: each pair under its role's adapter
        return score(pairs) if router is None else router.per_role(model, pairs, lambda pair: pair.role, score)  # type: ignore[return-value]  # per_role returns score's two tensors

    def loss(self, model: torch.nn.Module, inputs: dict[str, Any],
             context: LossContext) -> tuple[torch.Tensor | None, dict[str, float]]:
        if not self.config.train_pairs:  # the control (replay.train_pairs: false): pairs built and monitored only
            return None, {}
        value, logged = self.share_loss(model, context.mode, context.accumulation, context.step)
        if logged is None:
            return value, {}
        metrics = {self.metric: logged, "replay/pairs": float(self._share_pairs)}
        if self.config.rpo_alpha > 0:
            nll = self._terms[1] if value is not None else 0.0
            metrics[self.nll_metric] = 0.0 if nll is None else nll
        return value, metrics

    def share_loss(self, model: torch.nn.Module, mode: str, accumulation: int,
                   step: int | None = None) -> tuple[torch.Tensor | None, float | None]:
        """This micro-batch's share of DPO's sigmoid loss on the step's sample of stored pairs.

        ``pairs_per_step`` pairs are drawn once per optimiser step (only pairs with token ids
        and reference log-probs) and dealt round-robin over the step's ``accumulation``
        micro-batches, so the DPO batch of a step does not depend on how gradient accumulation
        splits it (a memory setting, not an algorithm setting). Micro-batch ``j`` with pairs
        ``P_j`` of the step's ``N`` returns ``accumulation · Σ_{p∈P_j} loss_p / N``; after the
        caller's ``/ accumulation`` the step's gradient is that of the mean loss over its ``N``
        pairs, as with one micro-batch. Outside training (or with one micro-batch) each call
        draws its own pairs and returns their mean.

        Returns:
            ``(loss, logged)``: the scalar term (``None``: no pair for this micro-batch) and the
            value logged as ``loss/trace_replay_dpo`` (beside it, ``replay/pairs``: how many
            pairs the micro-batch's term holds): the mean DPO loss over this micro-batch's
            pairs (DPO's term alone: RPO's NLL is logged apart, :meth:`loss`); 0 on the first
            micro-batch of a step that drew none; ``None`` (nothing logged, so the logged mean
            is not diluted) on a later micro-batch left without a share.
        """
        if mode != "train" or accumulation == 1:
            drawn = self._draw(self.trainer.state.global_step if step is None else step)
            self._share_pairs = len(drawn)
            loss = self.dpo_loss(model, drawn)
            return loss, (0.0 if loss is None else self._terms[0])
        step = self.trainer.state.global_step if step is None else step
        if self._shares is None or self._shares[0] != step:
            drawn = self._draw(step)
            self._shares = (step, [drawn[j::accumulation] for j in range(accumulation)], len(drawn), 0)
        step, shares, drawn_count, index = self._shares
        self._shares = (step, shares, drawn_count, index + 1)
        share = shares[index] if index < len(shares) else []
        self._share_pairs = len(share)
        if not share:
            return None, (0.0 if index == 0 else None)
        loss = self.dpo_loss(model, share)
        assert loss is not None
        return loss * (accumulation * len(share) / drawn_count), self._terms[0]

    def _draw(self, step: int) -> list[Any]:
        """The step's DPO pairs: ``pairs_per_step`` stored pairs, not held out, no older than
        ``max_pair_age`` steps, each drawn at most ``draws_per_pair`` times (the least drawn
        first; ``None``: uniformly), their reference log-probs brought up to the current
        reference (:meth:`_refresh_references`)."""
        age = self.config.max_pair_age
        drawn = self.pair_store.sample(self.config.pairs_per_step, self.rng,
                                       min_step=None if age is None else step - age,
                                       heldout_share=self.config.heldout_pair_share,
                                       max_draws=self.config.draws_per_pair)
        self._refresh_references(drawn)
        return drawn

    def dpo_loss(self, model: torch.nn.Module, pairs: list[Any]) -> torch.Tensor | None:
        """DPO's sigmoid loss averaged over ``pairs`` (``None`` for no pair), plus RPO's
        chosen-side NLL times ``rpo_alpha`` when ``rpo_alpha > 0`` (see the module docstring).
        The two terms' values (DPO's, and the unweighted NLL in nats per token or ``None``)
        are kept for logging (``loss/trace_replay_dpo``, ``loss/trace_replay_nll``).

        The pairs run through the unwrapped policy, never the DDP wrapper: a wrapped forward is a
        collective (DDP broadcasts buffers from rank 0 on each one), and processes draw different
        numbers of pairs, so wrapped forwards would leave the ranks waiting on each other. The
        gradient still reaches DDP's all-reduce in the same backward (one summed gradient per
        parameter), as for hint distillation's forwards; ``tests/e2e/test_multiprocess_training.py`` runs it."""
        if not pairs:
            return None
        unwrapped = self.trainer.accelerator.unwrap_model(model)
        if self.config.pair_tokens == "disagreement":
            chosen, rejected, ref_chosen, ref_rejected = self._disagreement_logps(unwrapped, pairs)
        else:
            chosen, rejected = self.pair_logps(unwrapped, pairs)
            ref_chosen = torch.tensor([p.ref_chosen_logp for p in pairs], device=chosen.device, dtype=chosen.dtype)
            ref_rejected = torch.tensor([p.ref_rejected_logp for p in pairs], device=chosen.device, dtype=chosen.dtype)
            self._pending_metrics.update({"replay/chosen_logp": chosen.detach().mean().item(),
                                          "replay/rejected_logp": rejected.detach().mean().item()})
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        self._pending_metrics["replay/margin"] = margin.detach().mean().item()
        loss = dpo_sigmoid_loss(chosen, rejected, ref_chosen, ref_rejected, self.config.dpo_beta)
        self._terms = (loss.item(), None)
        if self.config.rpo_alpha > 0:
            lengths = torch.tensor([len(cap_response(p.chosen_ids, self.trainer.max_completion_length)) for p in pairs],
                                   device=chosen.device, dtype=chosen.dtype)
            nll = chosen_nll(chosen, lengths)
            self._terms = (self._terms[0], nll.item())
            loss = loss + self.config.rpo_alpha * nll
        return loss

    def _disagreement_logps(self, model: torch.nn.Module, pairs: list[Any]) -> tuple[torch.Tensor, ...]:
        """``pair_tokens: disagreement``: the policy's and the reference's log-probs of each
        side summed with :func:`~trainer_client.losses.replay_pairs.disagreement_weights`, four
        ``(N,)`` tensors (chosen, rejected, reference chosen, reference rejected). Pairs stored
        without per-token references (another run's store) get them first, not persisted. Logs
        the whole sides' log-probs (``replay/chosen_logp``, ``replay/rejected_logp``, comparable
        with plain DPO's) and the share of the rejected side's tokens the margin weighs fully
        (``replay/disagreement_share``)."""
        missing = [p for p in pairs if p.ref_chosen_token_logps is None or p.ref_rejected_token_logps is None]
        if missing:
            self._set_token_references(missing)
        chosen_tok, rejected_tok = self.pair_logps(model, pairs, per_token=True)
        width, limit = chosen_tok.shape[1], self.trainer.max_completion_length
        weights = torch.zeros((2, len(pairs), width), dtype=chosen_tok.dtype)
        refs = torch.zeros((2, len(pairs), width), dtype=chosen_tok.dtype)
        fully = []
        for i, pair in enumerate(pairs):
            w_c, w_r = disagreement_weights(cap_response(pair.chosen_ids, limit), cap_response(pair.rejected_ids, limit),
                                            self.config.shared_weight)
            weights[0, i, :len(w_c)], weights[1, i, :len(w_r)] = torch.tensor(w_c), torch.tensor(w_r)
            refs[0, i, :len(w_c)] = torch.tensor(pair.ref_chosen_token_logps)
            refs[1, i, :len(w_r)] = torch.tensor(pair.ref_rejected_token_logps)
            fully.append(sum(w == 1.0 for w in w_r) / len(w_r))
        weights, refs = weights.to(chosen_tok.device), refs.to(chosen_tok.device)
        self._pending_metrics.update({"replay/chosen_logp": chosen_tok.detach().sum(-1).mean().item(),
                                      "replay/rejected_logp": rejected_tok.detach().sum(-1).mean().item(),
                                      "replay/disagreement_share": sum(fully) / len(fully)})
        return ((chosen_tok * weights[0]).sum(-1), (rejected_tok * weights[1]).sum(-1),
                (refs[0] * weights[0]).sum(-1), (refs[1] * weights[1]).sum(-1))

    def monitor(self, model: torch.nn.Module) -> dict[str, float]:
        """Held-out pairs under the current policy (no gradient): ``replay/heldout/accuracy``
        (share whose implicit reward ``β·(log π − log π_ref)`` is higher for the chosen side,
        TRL's ``rewards/accuracies``; against the reference of the moment, the pairs' references
        brought up to it first), ``replay/heldout/margin_above_start`` (share whose margin
        ``log π(c) − log π(r)``, sums over each side's tokens, is strictly above the same margin
        under the frozen start policy, :meth:`start_logps`), ``replay/heldout/chosen_logp``,
        ``.../rejected_logp`` (mean nats per pair) and ``.../pairs``; empty without held-out pairs."""
        pairs = self.pair_store.heldout(self.config.monitor_pairs, self.config.heldout_pair_share)
        if not pairs:
            return {}
        start_chosen, start_rejected = self.start_logps(pairs)
        self._refresh_references(pairs)
        unwrapped = self.trainer.accelerator.unwrap_model(model)
        was_training = unwrapped.training
        unwrapped.train(False)
        try:
            with torch.no_grad():
                chosen, rejected = self.pair_logps(unwrapped, pairs)
        finally:
            unwrapped.train(was_training)
        ref_chosen = torch.tensor([p.ref_chosen_logp for p in pairs], dtype=chosen.dtype, device=chosen.device)
        ref_rejected = torch.tensor([p.ref_rejected_logp for p in pairs], dtype=chosen.dtype, device=chosen.device)
        wins = ((chosen - ref_chosen) > (rejected - ref_rejected)).float()
        start_margin = torch.tensor(start_chosen, dtype=torch.float64) - torch.tensor(start_rejected, dtype=torch.float64)
        above = ((chosen - rejected).double().cpu() > start_margin).double()
        return {"replay/heldout/accuracy": wins.mean().item(), "replay/heldout/chosen_logp": chosen.mean().item(),
                "replay/heldout/rejected_logp": rejected.mean().item(), "replay/heldout/pairs": float(len(pairs)),
                "replay/heldout/margin_above_start": above.mean().item()}

    def start_logps(self, pairs: list[Any]) -> tuple[list[float], list[float]]:
        """Each pair's summed chosen and rejected log-probs (nats, over the capped sides) under
        the frozen start policy: the reference values of a pair whose references were never
        recomputed after a sync (``ref_sync == 0``: the start policy's), values kept from
        before such a recompute, else one no-grad forward of :meth:`start_policy` over the
        pairs that need it (kept on the pair in memory). Two lists of ``len(pairs)`` floats."""
        missing = [p for p in pairs if p._start_logps is None and p.ref_sync != 0]
        if missing:
            with torch.no_grad(), self.start_policy() as start:
                chosen, rejected = self.pair_logps(start, missing)
            for pair, c, r in zip(missing, chosen.tolist(), rejected.tolist(), strict=True):
                pair._start_logps = (c, r)
        values = [p._start_logps if p._start_logps is not None else (p.ref_chosen_logp, p.ref_rejected_logp)
                  for p in pairs]
        return [float(c) for c, _ in values], [float(r) for _, r in values]


class ReferenceSyncCallback(TrainerCallback):
    """Runs :meth:`TraceReplayDPO.sync_reference` at the end of every optimizer step (as TRL's
    ``SyncRefModelCallback.on_step_end`` does for ``DPOConfig.sync_ref_model``), so the replay
    reference follows the policy every ``replay.ref_model_sync_steps`` steps. Registered by
    :meth:`TraceReplayDPO.bind`.

    Args:
        channel: the trace-replay channel whose reference it syncs.
    """

    def __init__(self, channel: TraceReplayDPO) -> None:
        self.channel = channel

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.channel.sync_reference(state.global_step)


def replay_pair_logps(model: torch.nn.Module, pairs: list[Any], *, pad_token_id: int | None,
                      max_completion_length: int, device: torch.device | str,
                      max_context_tokens: int = 4096, shared_context: bool = True,
                      per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of each pair's chosen and rejected token ids given its context ids (or,
    with ``per_token``, each token's).

    Args:
        model: the policy or the reference policy.
        pairs: :class:`~trainer_client.losses.pair_store.DpoPair` items with token ids
            (``context_ids``, ``chosen_ids``, ``rejected_ids``; the rollout's own tokens, see
            :mod:`trainer_client.losses.replay_pairs`).
        pad_token_id: the tokenizer's padding id.
        max_completion_length: responses are cut to this many tokens (their last token kept).
        device: where the batch goes.
        max_context_tokens: contexts are cut from the left to this many tokens.
        shared_context: run each context once for both sides
            (:func:`~trainer_client.model.forward.shared_context_logps`); ``False``, or a model
            under activation checkpointing, runs one ``context + response`` row per side (same
            values and gradients, about 1.6x the tokens with a 384-token context and 128-token turns).
        per_token: each response token's log-prob instead of their sum.

    Returns:
        ``(chosen, rejected)``, two ``(N,)`` float tensors (nats, summed over response tokens);
        with ``per_token``, two ``(N, max_completion_length)`` float32 tensors, token ``j`` of the
        capped response at column ``j``, 0 past its end (a fixed width, so that per-role parts
        concatenate).

    Raises:
        ValueError: a pair without token ids (an older pair format: never sampled for training).
    """
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
        logps = shared_context_logps(model, contexts, responses, pad, device, per_token=per_token)
        if per_token:
            logps = F.pad(logps, (0, max_completion_length - logps.shape[-1]))
        return logps[:, 0], logps[:, 1]
    # one ``context + response`` row per side (under activation checkpointing, which drops caches)
    batch = pack_responses([c for c in contexts for _ in (0, 1)], [r for group in responses for r in group], pad, device)
    tokens = head_logps(model, response_hidden(model, batch), batch.labels, batch.mask)  # never (2N, L, V) logits
    if per_token:  # each row holds one response after its context: gather its scored columns, in order
        rows = torch.zeros((tokens.shape[0], max_completion_length), dtype=tokens.dtype, device=tokens.device)
        for i in range(tokens.shape[0]):
            scored = tokens[i][batch.mask[i]]
            rows[i, :scored.shape[0]] = scored
        return rows[0::2], rows[1::2]
    flat = tokens.sum(-1)
    return flat[0::2], flat[1::2]
