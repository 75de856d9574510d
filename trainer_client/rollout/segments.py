"""Completion segments: which tokens of a completion belong to which debate turn.

A TRL rollout with tools is one completion made of *segments*: each generation round of the
model (``tool_mask == 1`` runs) separated by tool-result tokens (``tool_mask == 0``, masked
from the loss by TRL). Segment ``j`` is the ``j``-th assistant message of the rollout's
message list. A segment belongs to the turn its tool call produced: the environment logs, for
every accepted turn, the exact text it returned, and that text is the content of the tool
message following the segment. A segment whose call was rejected (a wrong tool, bad
arguments) belongs to the role whose turn it was; a final message submitted as a fallback
belongs to the turn it produced; anything after the debate ended belongs to no role and is
left out of the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.rollout.trace import TurnLog

__all__ = ["Segment", "SegmentOwner", "completion_segments", "mask_runs", "owned_segments", "segment_turns"]


@dataclass(frozen=True)
class SegmentOwner:
    """Who a segment belongs to.

    Attributes:
        t: the turn it produced, or (``produced`` False) the turn that was due.
        role: that turn's role.
        produced: True when this segment's tool call (or fallback text) is turn ``t``.
    """

    t: int
    role: Role
    produced: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))
        if self.t < 0:
            raise ValueError(f"invalid owner {self}: need t >= 0")


def mask_runs(model_tokens: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs of 1 in a 0/1 sequence, as ``[start, end)`` pairs.

    Args:
        model_tokens: per completion token, 1 if the model generated it (``tool_mask ·
            completion_mask``), else 0.
    """
    runs, start = [], None
    for i, v in enumerate(model_tokens):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(model_tokens)))
    return runs


def segment_turns(messages: Sequence[dict[str, Any]], turns: Sequence[TurnLog]) -> list[SegmentOwner | None]:
    """The owner of every assistant message, or ``None`` (after the debate ended).

    Args:
        messages: the rollout's completion messages (assistant and tool messages, in order).
        turns: the environment's log of accepted turns for the rollout, ordered by ``t``.

    Returns:
        One entry per assistant message.
    """
    tool_turns = [turn for turn in turns if turn.source == "tool"]
    assigned: list[SegmentOwner | None] = []
    has_call: list[bool] = []
    k = 0
    for message in messages:
        if message.get("role") == "assistant":
            assigned.append(None)
            has_call.append(bool(message.get("tool_calls")))
        elif (message.get("role") == "tool" and assigned and k < len(tool_turns)
              and message.get("content") == tool_turns[k].returned):
            if assigned[-1] is None:
                assigned[-1] = SegmentOwner(tool_turns[k].t, tool_turns[k].role, True)
            k += 1
    fallback = next((turn for turn in turns if turn.source == "fallback"), None)
    if fallback is not None and assigned and not has_call[-1] and assigned[-1] is None:
        assigned[-1] = SegmentOwner(fallback.t, fallback.role, True)
    # A segment without a turn of its own belongs to the role that was acting: the role of the
    # next turn after the last one already played, if the debate was not over.
    played = -1
    for j, entry in enumerate(assigned):
        if entry is not None:
            played = entry.t
            continue
        nxt = next((turn for turn in turns if turn.t > played), None)
        assigned[j] = None if nxt is None else SegmentOwner(nxt.t, nxt.role, False)
    return assigned


@dataclass(frozen=True)
class Segment:
    """One generation round of the model in a completion: tokens ``[start, end)``, and the
    turn it belongs to. The one token-range type of the trainer: the reward pipeline spreads a
    turn's advantage over its segment's tokens, the loss channels cut their sites from it.

    Attributes:
        start, end: token offsets in the completion, ``0 <= start <= end``.
        owner: the turn it belongs to, or ``None`` (after the debate ended: outside the loss).

    Raises:
        ValueError: a negative ``start``, ``end < start``, a negative turn or an unknown role.
    """

    start: int
    end: int
    owner: SegmentOwner | None

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid segment {self}: need 0 <= start <= end")

    @classmethod
    def of(cls, turn: int, role: Role | str, start: int, end: int) -> Segment:
        """The segment that produced turn ``turn`` of ``role`` (tests and hand-built segments)."""
        return cls(start, end, SegmentOwner(turn, Role(role), True))

    @property
    def turn(self) -> int:
        """The owner's turn index ``t``; only for segments with an owner."""
        assert self.owner is not None, "a segment without an owner has no turn"
        return self.owner.t

    @property
    def role(self) -> Role:
        """The owner's role; only for segments with an owner."""
        assert self.owner is not None, "a segment without an owner has no role"
        return self.owner.role


def completion_segments(messages: Sequence[dict[str, Any]], turns: Sequence[TurnLog],
                        model_tokens: Sequence[int]) -> list[Segment] | None:
    """The segments of one rollout with their owners.

    Args:
        messages: the rollout's completion messages.
        turns: the environment's turn log.
        model_tokens: ``tool_mask · completion_mask`` of the rollout, ``(C,)`` 0/1.

    Returns:
        One :class:`Segment` per assistant message, or ``None`` when the token runs cannot be
        matched to the messages (the caller then leaves the rollout out of the loss).
    """
    runs = mask_runs(model_tokens)
    owners = segment_turns(messages, turns)
    if len(runs) != len(owners):
        return None
    return [Segment(start, end, owner) for (start, end), owner in zip(runs, owners, strict=True)]


def owned_segments(segments: Sequence[Segment]) -> list[Segment]:
    """The loss-bearing segments: every segment with an owner (others stay outside the loss)."""
    return [s for s in segments if s.owner is not None]
