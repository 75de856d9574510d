"""GiGPO's step inputs for debates: per-turn steps and their rewards, before the batch is gathered.

A debate rollout is a trajectory whose steps are its turns ``t`` (the policy plays every role).
This module turns graded records, the environment's turn log, the rollout's completion messages
and user reward results into the step rewards and anchor observations that GiGPO
(:func:`~trainer_client.credit.gigpo.gigpo_turn_values`, step 7 of the reward pipeline) reads:

- :func:`rollout_steps`: one :class:`~trainer_client.credit.reward_functions.StepData` per turn. A turn
  the policy wrote carries ``step_info["assistant_turn_index"]``: the 0-based index, among the
  assistant messages of the rollout's completion (the messages a reward function receives after
  the prompt), of the message that produced it, found with
  :func:`~trainer_client.rollout.segments.segment_turns` (the matching the loss uses). Not the debate turn
  ``t``: the two diverge after a rejected tool call, which takes an index and produces no turn.
  Rejected calls and messages written after the debate ended get no step (a step output naming
  one is reported with the reason); a fallback's index is its message's; forfeits get none; if
  the messages cannot be matched with the turn log, no step of the rollout gets an index and
  the reason is reported. The full rule is in :mod:`trainer_client.credit.step_alignment`.
- :func:`step_rewards`: ``r_t`` from the user's step outputs (aligned, default for the rest) when
  the result has step outputs, else the server's per-turn rewards; it fills every step's
  ``base_reward`` (that ``r_t``) and ``return_to_go`` (Eq. 5, the return GiGPO's step level uses).
- :func:`gigpo_steps`: both for this process's rollouts (the trainer gathers them).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.gigpo import GiGPOConfig, GiGPOInputs, discounted_returns
from trainer_client.credit.reward_functions import EvaluateResult, StepData
from trainer_client.credit.step_alignment import StepAlignmentWarning, align_step_rewards, fill_default
from trainer_client.rollout.segments import segment_turns
from trainer_client.rollout.trace import TurnLog

log = logging.getLogger(__name__)

__all__ = [
    "AFTER_THE_END",
    "REFUSED_TEXT",
    "REJECTED_CALL",
    "UNANSWERED_CALL",
    "RolloutSteps",
    "assistant_turn_indices",
    "gathered_gigpo_inputs",
    "gigpo_steps",
    "rollout_steps",
    "step_rewards",
]

#: Why an assistant message carries no step (the end of "step output N names an assistant message that ...").
REJECTED_CALL = "produced no debate turn (a rejected tool call)"
UNANSWERED_CALL = "produced no debate turn (its tool call has no answer in the messages)"
REFUSED_TEXT = "produced no debate turn (a final message without a tool call that was not accepted as the turn)"
AFTER_THE_END = "was written after the debate ended"


@dataclass
class RolloutSteps:
    """The steps of one rollout and the assistant messages that none of them carries.

    Attributes:
        steps: one step per turn, in turn order.
        unplaced: assistant message index -> why no step carries it (:data:`REJECTED_CALL`,
            :data:`UNANSWERED_CALL`, :data:`REFUSED_TEXT`, :data:`AFTER_THE_END`).
        unmatched: why no step carries an ``assistant_turn_index`` (the completion messages could
            not be matched with the turn log), or ``None``.
    """

    steps: list[StepData]
    unplaced: dict[int, str] = field(default_factory=dict)
    unmatched: str | None = None


def assistant_turn_indices(turn_log: Sequence[TurnLog], completion_messages: Sequence[Mapping[str, Any]] | None
                           ) -> tuple[dict[int, int], dict[int, str], str | None]:
    """Which assistant message produced each turn the policy wrote.

    Args:
        turn_log: the environment's log of the rollout's turns.
        completion_messages: the rollout's completion messages (TRL's tool-call conversation,
            without the prompt), or ``None`` when they are not available.

    Returns:
        ``(indices, unplaced, unmatched)``: turn ``t`` -> index of its assistant message among
        the completion's assistant messages; assistant message index -> why it produced no step;
        and, when the messages cannot be matched with the log, the reason (then both maps are
        empty). Matched means: every fallback turn is owned by the last message (as
        :func:`~trainer_client.rollout.segments.segment_turns` assigns it), and every tool turn is owned by
        a message, or its returned text is a tool message of the completion (a later accepted
        call of a message that made several), or it was made by the completion's last message,
        whose tool answers TRL dropped (they would have passed ``max_completion_length``).
    """
    if completion_messages is None:
        return {}, {}, "the rollout's completion messages are missing"
    messages = [dict(m) for m in completion_messages]
    turns = sorted(turn_log, key=lambda entry: entry.t)
    owners = segment_turns(messages, turns)
    assistants = [m for m in messages if m.get("role") == "assistant"]
    indices = {owner.t: j for j, owner in enumerate(owners) if owner is not None and owner.produced}
    answers = {c for m in messages if m.get("role") == "tool" and isinstance(c := m.get("content"), str)}
    missing = [turn for turn in turns if turn.t not in indices
               and (turn.source == "fallback" or (turn.source == "tool" and turn.returned not in answers))]
    last = len(owners) - 1
    last_owner = owners[last] if owners else None
    # the completion ends on an assistant message whose tool call(s) got no answer
    unanswered_last = (last_owner is not None and not last_owner.produced and messages[-1] is assistants[last]
                       and bool(assistants[last].get("tool_calls")))
    if (missing and unanswered_last and all(turn.source == "tool" for turn in missing)
            and missing[0].t > max(indices, default=-1)):
        indices[missing[0].t] = last  # the call ran; its answer was dropped; later calls of it get no index
        missing = []
    if missing:
        listed = ", ".join(f"t={turn.t} ({turn.role.value}, {turn.source})" for turn in missing)
        return {}, {}, f"the completion messages do not match the turn log: no assistant message produced {listed}"
    placed = set(indices.values())
    unplaced: dict[int, str] = {}
    for j, owner in enumerate(owners):
        if owner is None:
            unplaced[j] = AFTER_THE_END
        elif not owner.produced and j not in placed:
            unplaced[j] = (REFUSED_TEXT if not assistants[j].get("tool_calls")
                           else UNANSWERED_CALL if j == last and unanswered_last else REJECTED_CALL)
    return indices, unplaced, None


def rollout_steps(record: EpisodeRewards, turn_log: Sequence[TurnLog],
                  completion_messages: Sequence[Mapping[str, Any]] | None) -> RolloutSteps:
    """One step per turn of ``record`` (a pure function of its arguments).

    Args:
        record: the graded episode.
        turn_log: the environment's :class:`~trainer_client.rollout.environment.TurnLog` entries (matched by ``t``).
        completion_messages: the rollout's completion messages (``None``: not available; no step
            then gets an ``assistant_turn_index`` and :attr:`RolloutSteps.unmatched` says why).

    Returns:
        Steps in turn order. ``observation_data`` is what the acting role saw (``None`` if the log
        lacks the turn); ``action`` is ``{"role"}``; ``step_info`` holds ``"role"``, ``"source"``
        (the log's ``"tool"``, ``"fallback"`` or ``"forfeit"``; ``None`` if the log lacks the turn)
        and, on turns an assistant message produced, ``"assistant_turn_index"`` (see
        :func:`assistant_turn_indices`).
    """
    logs = {entry.t: entry for entry in turn_log}
    lacking = [turn.t for turn in record.turns if turn.t not in logs]
    if lacking:
        indices: dict[int, int] = {}
        unplaced: dict[int, str] = {}
        unmatched: str | None = f"the turn log lacks turns {lacking}"
    else:
        indices, unplaced, unmatched = assistant_turn_indices(turn_log, completion_messages)
    steps = []
    for i, turn in enumerate(record.turns):
        log = logs.get(turn.t)
        info: dict[str, Any] = {"role": turn.role.value, "source": log.source if log else None}
        if turn.t in indices:
            info["assistant_turn_index"] = indices[turn.t]
        steps.append(StepData(step_index=turn.t, observation_data=log.observation if log else None,
                              action={"role": turn.role.value}, is_done=i == len(record.turns) - 1, step_info=info))
    return RolloutSteps(steps, unplaced, unmatched)


def step_rewards(record: EpisodeRewards, rollout: RolloutSteps, result: EvaluateResult | None,
                 default: float, gamma: float) -> tuple[list[float], list[str]]:
    """``r_t`` per turn and the alignment warnings.

    With a valid user result that has ``step_outputs``: its aligned rewards, ``default`` where
    none was given (the warnings name step outputs that matched no step, with the reason: a
    rejected call, a message after the end, unmatched messages). Otherwise the server's per-turn
    rewards. Every step of ``rollout`` gets ``base_reward = r_t`` and ``return_to_go = R_t``
    (Eq. 5 with ``gamma``, as GiGPO's step level computes it).
    """
    steps = rollout.steps
    if result is None or not result.is_score_valid or result.step_outputs is None:
        out, problems = [float(turn.reward) for turn in record.turns], []
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StepAlignmentWarning)  # returned instead, and logged as a count
            aligned = align_step_rewards(steps, result, unplaced=rollout.unplaced, unmatched=rollout.unmatched)
        out = []
        for step in fill_default(aligned.steps, default):
            assert step.base_reward is not None, "fill_default gives every step a reward"
            out.append(float(step.base_reward))
        problems = aligned.warnings
    for step, reward, ret in zip(steps, out, discounted_returns(out, gamma), strict=True):
        step.base_reward = reward
        step.return_to_go = float(ret)
    return out, problems


def gigpo_steps(records: Sequence[EpisodeRewards], turn_logs: Sequence[Sequence[Any]],
                completions: Sequence[Sequence[dict[str, Any]] | None], user_results: Sequence[Any] | None,
                step_reward_default: float, gamma: float) -> tuple[list[tuple[list[float], list[str | None]]], int]:
    """GiGPO's step inputs for this process's rollouts (step 7, before gathering): per rollout
    ``r_t`` per turn (Eq. 5) and the acting role's observation per turn (Eq. 6's anchor states).

    Args:
        records: ``B`` graded records (after steps 1-2).
        turn_logs: ``B`` environment turn logs (``EpisodeTrace.turns``).
        completions: ``B`` completion message lists (they say which assistant message made each turn).
        user_results: ``B`` user reward results (their step outputs), or ``None``.
        step_reward_default: the reward of a step left without one.
        gamma: the step returns' discount.

    Returns:
        ``(steps, unaligned)``: per rollout ``(rewards, observations)``, and the number of user
        step outputs that could not be placed.
    """
    local, unaligned, unmatched = [], 0, []
    for k, (record, turns) in enumerate(zip(records, turn_logs, strict=True)):
        completion = completions[k] if k < len(completions) else None
        rollout = rollout_steps(record, turns, completion)
        result = user_results[k] if user_results is not None else None
        rewards, problems = step_rewards(record, rollout, result, step_reward_default, gamma=gamma)
        unaligned += len(problems)
        for problem in problems:
            log.debug("rollout %d: %s", k, problem)
        if rollout.unmatched is not None and problems:
            unmatched.append(rollout.unmatched)
        local.append((rewards, [s.observation_data for s in rollout.steps]))
    if unmatched:
        log.warning("%d/%d rollouts: step outputs ignored, no assistant message index could be placed (%s)",
                    len(unmatched), len(records), unmatched[0])
    return local, unaligned


def gathered_gigpo_inputs(records: Sequence[EpisodeRewards], turn_logs: Sequence[Sequence[Any]],
                          completions: Sequence[Sequence[dict[str, Any]] | None], user_results: Sequence[Any] | None,
                          config: GiGPOConfig, gather: Any) -> tuple[GiGPOInputs, int]:
    """GiGPO's inputs for the gathered batch (:func:`gigpo_steps` of this process's rollouts,
    gathered with ``gather``, accelerate's ``gather_object``) with ``config``'s settings, and
    the number of user step outputs that could not be aligned with a turn."""
    local, unaligned = gigpo_steps(records, turn_logs, completions, user_results, config.step_reward_default,
                                   config.gamma)
    gathered = gather(local)
    return GiGPOInputs([rewards for rewards, _ in gathered], [observations for _, observations in gathered],
                       omega=config.omega, gamma=config.gamma, mode=config.mode,
                       similarity_threshold=config.similarity_threshold), unaligned
