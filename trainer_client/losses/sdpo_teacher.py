"""Hint distillation's teacher, beyond the live policy (issue 56 item 2; used by
:mod:`trainer_client.losses.hint_distillation`): the ``ema`` teacher's update after each optimizer
step, a successful sibling rollout's action for the hint (SDPO's reprompt, arXiv 2601.20802), the
``teacher_disagrees`` gate, and the teacher's measured advantage at the right token
(``sdpo/teacher_advantage``). Kept apart from the channel so that it stays the loss and its sites."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch
from transformers import TrainerCallback

from env_server.protocol.markers import Role
from trainer_client.losses.base import ScoredBatch
from trainer_client.losses.replay_pairs import as_policy_writes, tool_call_message, tool_call_response_ids
from trainer_client.model.forward import head_logps, pack_responses, response_logits
from trainer_client.rollout.branches import reply_action
from trainer_client.rollout.tools import FORFEIT_ACTION

__all__ = ["EMATeacherCallback", "right_token_advantage", "successful_sibling", "teacher_disagrees"]

log = logging.getLogger(__name__)


def successful_sibling(trainer: Any, batch: ScoredBatch, row: int, role: Role, t: int) -> str | None:
    """The action of another rollout of ``row``'s group (TRL's ``num_generations``
    consecutive rollouts of one prompt, on this process) whose turn ``t`` was ``role``'s with
    reward 1, as the environment submitted it (:func:`~trainer_client.rollout.branches.
    reply_action` of the turn's tokens parsed as TRL's tool loop parses them); the first such
    rollout in row order, ``None`` without one. Groups split across processes see only this
    process's part."""
    size = trainer.num_generations if batch.mode == "train" else trainer.num_generations_eval
    first = trainer.accelerator.process_index * len(batch.records)
    group = (first + row) // size
    output = batch.output
    for other, record in enumerate(batch.records):
        if other == row or (first + other) // size != group:
            continue
        turns = [turn for turn in record.turns if turn.t == t and turn.role == role and turn.reward >= 1]
        segment = next((seg for seg in batch.segments[other] or [] if seg.owner is not None and seg.owner.produced
                        and seg.owner.t == t), None)
        if not turns or segment is None:
            continue
        prompt = output["prompt_ids"][other][output["prompt_mask"][other].bool()].tolist()
        ids = output["completion_ids"][other]
        message = trainer.parse_turn(ids[segment.start:segment.end].tolist(),
                                     prompt + ids[:segment.start].tolist())
        action = reply_action(message, role)
        if action != FORFEIT_ACTION:
            return action
    return None


def right_token_advantage(channel: Any, batch: ScoredBatch, sites: list[list[tuple[int, int, str]]]) -> dict[str, float]:
    """Whether the teacher knows more than its student where it is distilled: at each of the
    batch's solver sites (at most ``max_sites_per_batch``) whose problem has a reference
    solution, the right turn (that solution as the solver's tool call, as the policy writes
    it) is scored after the student's context and after the teacher's hinted one; at the
    **right token**, the first token of the right turn that is not the student's greedy
    choice, ``sdpo/teacher_advantage`` is the mean over sites of ``log p_T − log p_S`` (nats;
    the hint probe's per-site figure, ``docs/ablation/channels/audit/hint-probe.md``), with
    ``sdpo/teacher_advantage_sites`` the sites measured (a site whose student follows the
    right turn throughout has no right token). A monitor, not a target: the solution never
    reaches the loss, so the run stays non-gold. Two forwards without gradient over the
    sites; nothing without reference solutions (``problems`` unset) or without solver sites.

    Returns:
        The two figures, or ``{}`` when no site was measured.
    """
    if channel.reference_solution is None or "completion_ids" not in batch.output:  # no tokens: nothing to score
        return {}
    trainer = channel.trainer
    processor = trainer.processing_class
    output = batch.output
    contexts, hinted, rights = [], [], []
    chosen = [(row, start, end, key) for row, row_sites in enumerate(sites) for start, end, key in row_sites
              if key.partition("/")[0] == Role.SOLVER.value][: channel.config.max_sites_per_batch]
    for row, start, end, key in chosen:
        solution = channel.reference_solution(batch.records[row].problem_id)
        message = None if solution is None else tool_call_message(Role.SOLVER, solution)
        if message is None:
            continue
        rendered = tool_call_response_ids(processor, message, chat_template=trainer.chat_template,
                                          eos_token_id=processor.eos_token_id,
                                          template_kwargs=trainer.chat_template_kwargs)
        own = output["completion_ids"][row][start:end].tolist()
        context = output["prompt_ids"][row][output["prompt_mask"][row].bool()].tolist() + \
            output["completion_ids"][row][:start].tolist()
        contexts.append(context)
        hinted.append(channel.with_hint(context, key))
        rights.append(as_policy_writes(processor, rendered, own))
    if not contexts:
        return {}
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    router = getattr(trainer, "role_router", None)
    device = output["completion_ids"].device
    with torch.no_grad(), router.using(unwrapped, Role.SOLVER) if router is not None else nullcontext():
        student_batch = pack_responses(contexts, rights, processor.pad_token_id, device)
        student_logits = response_logits(unwrapped, student_batch).float()
        with channel.teacher(unwrapped) as teacher_model:
            teacher_logits = response_logits(teacher_model, pack_responses(hinted, rights, processor.pad_token_id,
                                                                            device)).float()
    labels, mask = student_batch.labels, student_batch.mask
    student = torch.log_softmax(student_logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    teacher = torch.log_softmax(teacher_logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    off = mask & (student_logits.argmax(-1) != labels)
    gaps = [float(teacher[k, int(row.nonzero()[0])] - student[k, int(row.nonzero()[0])])
            for k, row in enumerate(off) if row.any()]
    if not gaps:
        return {}
    return {"sdpo/teacher_advantage": sum(gaps) / len(gaps), "sdpo/teacher_advantage_sites": float(len(gaps))}


def teacher_disagrees(unwrapped: Any, student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                      teacher_copy: torch.nn.Module | None, teacher: Any) -> torch.Tensor:
    """``sdpo.gate: teacher_disagrees``: ``(n,)`` bool, whether at each site the teacher gives
    the student's own sampled tokens of the erring turn a lower mean log-prob than the student
    does, ``mean_j (log p_T(y_j) − log p_S(y_j)) < 0`` (no gradient; a gold-free test that the
    hint moves the teacher away from the error).

    Args:
        unwrapped: the policy; its head scores ``student_hidden``.
        student_hidden, teacher_hidden: ``(n, L, H)`` final hidden states over the sites.
        teacher_copy: the teacher's own model when its head is not the policy's (a ``base`` or
            ``ema`` copy), whose head scores ``teacher_hidden``; ``None``: the policy's head.
        teacher: the hinted sites' :class:`~trainer_client.model.forward.ResponseBatch`
            (``labels``, ``mask``: ``(n, L)``).

    Both sides go through :func:`~trainer_client.model.forward.head_logps`, at most its block of
    logits at a time, never the ``(n, L, V)`` logits."""
    labels, mask = teacher.labels, teacher.mask
    with torch.no_grad():
        student = head_logps(unwrapped, student_hidden.detach(), labels, mask)
        teacher_logps = head_logps(unwrapped if teacher_copy is None else teacher_copy, teacher_hidden, labels, mask)
        tokens = mask.sum(-1).clamp(min=1)
        return ((teacher_logps - student) * mask).sum(-1) / tokens < 0


class EMATeacherCallback(TrainerCallback):
    """After every optimizer step, ``θ_T ← (1 − r)·θ_T + r·θ`` for the ``ema`` teacher's copy
    (TRL 1.16 ``SyncRefModelCallback.sync_target_model(model, target, alpha)``, the update of
    its SDPO ``SyncTeacherModelCallback`` at ``teacher_sync_steps`` 1; that callback reads its
    settings from SDPO's own ``TrainingArguments``, which a GRPO run does not have). The copy is
    not checkpointed: a resumed run restarts the average from the resumed policy (logged)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.global_step > 0 and model is not None and self.channel.teacher_model is not None:  # a resume
            log.warning("sdpo.teacher_model_kind 'ema': the average restarts from the resumed policy (step %d)",
                        state.global_step)
            self._sync(model, 1.0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None and self.channel.teacher_model is not None:
            self._sync(model, self.channel.config.teacher_update_rate)

    def _sync(self, model: torch.nn.Module, rate: float) -> None:
        from trl.trainer.callbacks import SyncRefModelCallback

        unwrapped = self.channel.trainer.accelerator.unwrap_model(model)
        SyncRefModelCallback.sync_target_model(unwrapped, self.channel.teacher_model, rate)
