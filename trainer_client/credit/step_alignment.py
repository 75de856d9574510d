"""Aligning a user reward function's step outputs with the steps of a rollout.

The contract for reward authors:

- The trainer records one :class:`~trainer_client.credit.reward_functions.StepData` per debate turn
  (``step_index`` is the debate turn ``t``).
- ``StepOutput.step_index`` names an **assistant message**: its 0-based position among the
  messages with role ``"assistant"`` in the rollout's completion, i.e. in the messages your
  function receives after the prompt ("the Nth time the assistant produced a message"). The
  debate prompts hold no assistant message, so counting every assistant message of
  ``messages`` gives the same index (the example of :mod:`trainer_client.credit.reward_functions`).
  The step of the turn that message produced carries it as ``step_info["assistant_turn_index"]``
  (:func:`trainer_client.credit.step_credit.rollout_steps` computes it with
  :func:`trainer_client.rollout.segments.segment_turns`, the matching the loss uses). In detail:

  - a tool call the environment accepted: the message's index names the turn it produced. A
    message whose several tool calls were accepted names the first of its turns (the one its
    tokens are trained on); the later ones get no index;
  - a rejected tool call (a wrong tool for the turn, bad arguments: TRL appends the message and
    a tool message with the error, and no debate turn happens): the message still takes an
    index, but no step has it; a step output naming it is reported as naming "an assistant
    message that produced no debate turn (a rejected tool call)";
  - a fallback (the rollout's last assistant message, without a tool call, submitted as the
    current role's turn): that message's index names the turn;
  - a tool call whose result TRL dropped because it would overflow ``max_completion_length``
    (the call ran, the rollout's last message has no tool answer): its index names the turn it
    produced;
  - a forfeited turn (the policy wrote nothing for it): no index;
  - a message written after the debate ended: no step; a step output naming it is reported;
  - if the completion messages cannot be matched with the environment's turn log (missing,
    or a turn the policy wrote that no message produced), no step of the rollout gets an index,
    and every step output of the rollout is reported with the reason (never a guess).

- What changed: the index used to be the debate turn ``t``. A function that counted assistant
  messages was right already and is now also right after rejected tool calls (before, its
  reward after a rejected call landed on the next role's turn); a function that used the debate
  turn ``t`` must switch to counting assistant messages. The two coincide for a step when every
  assistant message before it produced exactly one turn: no rejected tool call and no message
  with several accepted calls before it (forfeits only end a debate, and carry no index either
  way).
- A step output whose index matches no step, or repeats an index already used (the first wins),
  is reported with a :class:`StepAlignmentWarning` and ignored.
- Steps without a step output keep ``base_reward = None``; the trainer applies its configured
  default (``gigpo.step_reward_default``) later, with :func:`fill_default`.
- The result's ``score`` stays the episode-level reward (GiGPO's episode advantage uses it).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainer_client.credit.reward_functions import EvaluateResult, StepData

__all__ = ["AlignmentResult", "StepAlignmentWarning", "align_step_rewards", "fill_default"]


class StepAlignmentWarning(UserWarning):
    """A step output that could not be placed on a step."""


@dataclass
class AlignmentResult:
    """Steps with user rewards filled in.

    Attributes:
        steps: the input steps (their ``base_reward`` set where a step output matched).
        score: the episode-level score of the result.
        matched: how many steps received a reward.
        warnings: the messages of every :class:`StepAlignmentWarning` raised.
    """

    steps: list[StepData]
    score: float
    matched: int
    warnings: list[str]


def _index(value: int | str) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = value.strip()
    return int(text) if text.isdigit() else None


def align_step_rewards(steps: Sequence[StepData], result: EvaluateResult, *,
                       unplaced: Mapping[int, str] | None = None, unmatched: str | None = None) -> AlignmentResult:
    """Set ``base_reward`` of each step whose ``assistant_turn_index`` a step output names.

    Args:
        steps: the rollout's steps, in order.
        result: the reward function's result for this rollout (``step_outputs`` may be None).
        unplaced: assistant message indices that no step carries, with why (e.g. ``"produced no
            debate turn (a rejected tool call)"``), so a step output naming one is reported as such.
        unmatched: why no step carries an index (the messages could not be matched with the
            turns); every step output is then reported with it.

    Returns:
        The alignment; steps are modified in place and returned.
    """
    by_index = {s.step_info["assistant_turn_index"]: s for s in steps if "assistant_turn_index" in s.step_info}
    unplaced = unplaced or {}
    messages: list[str] = []
    used: set[int] = set()
    for output in result.step_outputs or []:
        index = _index(output.step_index)
        if unmatched is not None:
            messages.append(f"step output {output.step_index!r} ignored: {unmatched}")
            continue
        if index is not None and index in unplaced:
            messages.append(f"step output {output.step_index!r} names an assistant message that {unplaced[index]}")
            continue
        if index is None or index not in by_index:
            messages.append(f"step output {output.step_index!r} matches no step where the policy acted "
                            f"(assistant messages that produced a turn: {sorted(by_index)})")
            continue
        if index in used:
            messages.append(f"duplicate step output for assistant message {index}: the first one is kept")
            continue
        used.add(index)
        by_index[index].base_reward = float(output.base_reward)
    for message in messages:
        warnings.warn(message, StepAlignmentWarning, stacklevel=2)
    return AlignmentResult(list(steps), result.score, len(used), messages)


def fill_default(steps: Sequence[StepData], default: float) -> list[StepData]:
    """Give every step still without a reward (``base_reward is None``) ``default``."""
    for step in steps:
        if step.base_reward is None:
            step.base_reward = float(default)
    return list(steps)
