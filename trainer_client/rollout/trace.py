"""The trainer's view of one episode: its accepted turns (:class:`TurnLog`) and the handle
:class:`EpisodeTrace` through which the trainer reads and completes the episode of a
``DebateEnvironment``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation, EpisodeRewards, TurnReward

__all__ = ["EpisodeTrace", "TraceHandles", "TurnLog"]


@dataclass(frozen=True)
class TurnLog:
    """One accepted turn, as the environment submitted it on behalf of the model.

    Attributes:
        t: the turn index the server assigned.
        role: the role that acted.
        source: ``"tool"`` (a tool call), ``"fallback"`` (the last assistant message of a
            rollout that stopped calling tools) or ``"forfeit"`` (a placeholder for a turn the
            rollout left unplayed).
        returned: for tool calls, the exact text the tool returned (what TRL put in the tool
            message), used to align completion segments with turns.
        observation: the instructions the acting role was shown (the anchor state of GiGPO).
    """

    t: int
    role: Role
    source: str
    returned: str | None = None
    observation: str | None = None


@dataclass(frozen=True)
class TraceHandles:
    """What an environment lends its :class:`EpisodeTrace`: readers of its episode's state and
    the three things the trainer may do to it. (An environment's public methods are the model's
    tools under TRL's ``environment_factory``, so these are handed over rather than public.)"""

    turns: Callable[[], Sequence[TurnLog]]
    observation: Callable[[], DebateObservation | None]
    done: Callable[[], bool]
    record: Callable[[], EpisodeRewards | None]
    finish: Callable[[str | None], None]
    wait_record: Callable[[], EpisodeRewards]
    state_at: Callable[[int], DebateObservation]
    close: Callable[[], None] = lambda: None
    grade_branches: Callable[[Sequence[str]], list[TurnReward | None]] | None = None


class EpisodeTrace:
    """A trainer's handle on the current episode of one ``DebateEnvironment`` (through the
    :class:`TraceHandles` it lends).

    Read: ``turns`` (the accepted turns with who wrote them, see :class:`TurnLog`),
    ``observation`` (the last observation), ``done``, ``record`` (the graded record once
    pulled). Act: ``finish(text)`` completes an unfinished debate, ``wait_record()`` waits for
    grading, ``state_at(t)`` fetches observation ``t`` exactly as the acting role saw it.
    """

    def __init__(self, handles: TraceHandles) -> None:
        self._handles = handles

    @property
    def turns(self) -> tuple[TurnLog, ...]:
        """The episode's accepted turns, in order of ``t``."""
        return tuple(self._handles.turns())

    @property
    def observation(self) -> DebateObservation | None:
        """The latest observation (``None`` before ``reset``)."""
        return self._handles.observation()

    @property
    def done(self) -> bool:
        """Whether the debate is over (no role is due)."""
        return self._handles.done()

    @property
    def record(self) -> EpisodeRewards | None:
        """The graded rewards record, once :meth:`wait_record` (or ``get_reward``) pulled it."""
        return self._handles.record()

    def finish(self, last_message: str | None) -> None:
        """Complete an unfinished debate: ``last_message`` (a rollout's final assistant text
        without a tool call) becomes the current role's action; remaining turns are forfeited
        (the server marks them). Nothing happens when the debate is already over.

        Raises:
            RuntimeError: ``reset`` was never called.
            MuxError: the server refused a placeholder action.
        """
        self._handles.finish(last_message)

    def wait_record(self) -> EpisodeRewards:
        """Finish the debate if needed, then wait for the graded record (bounded).

        Raises:
            TimeoutError: no record within the environment's rewards timeout.
        """
        return self._handles.wait_record()

    def state_at(self, t: int) -> DebateObservation:
        """Observation ``t`` of this episode exactly as it was sent (``state(t)``, RFC 0004).

        Raises:
            RuntimeError: no episode yet.
            MuxError: ``t`` out of range, or the episode expired on the server.
        """
        return self._handles.state_at(t)

    def grade_branches(self, actions: Sequence[str]) -> list[TurnReward | None]:
        """Play each of ``actions`` as the current turn on a fork of the session (RFC 0007) and
        return the server's grade of that turn (``None`` for a branch that could not be graded);
        the episode itself is not touched. See ``DebateEnvironment``'s ``_grade_branches``.

        Raises:
            NotImplementedError: the environment cannot fork.
        """
        if self._handles.grade_branches is None:
            raise NotImplementedError("this environment cannot fork its session")
        return self._handles.grade_branches(actions)

    def close(self) -> None:
        """Close the environment's session on the server now (a harness session's end), rather
        than at the run's end or the server's idle reaping; a later ``reset`` opens another."""
        self._handles.close()
