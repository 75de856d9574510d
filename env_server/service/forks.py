"""Forking an episode at turn ``t`` (RFC 0007): a new session whose episode is the original's
first ``t`` turns, played again, so that its observation is the original's observation ``t``
(``state(t)``, RFC 0004) under the fork's own episode id; the original is not touched.

A fork is made of the service's own operations, so it is a session like any other: it counts
against the session limits (``open``), its episode is journalled and recovered after a restart
like any played episode (the journal records its reset and the replayed actions), every replayed
answer is graded by the server (the grader's cache answers most of them), and its record, once
the fork finishes, is graded and pushed as any other.
"""

from __future__ import annotations

from typing import NamedTuple

from env_server.protocol.models import DebateAction, ResetRequest
from env_server.service.episodes import EpisodeEntry
from env_server.service.facade import DebateService
from env_server.service.sessions import Connection, SessionKind

__all__ = ["Forked", "fork_episode"]


class Forked(NamedTuple):
    """A fork: its session (id, resume token, resume window in s, as ``open`` answers), the id of
    the episode it plays, and its current observation's payload (``StepPayload`` JSON bytes)."""

    session_id: str
    resume_token: str
    resume_window_s: float
    episode_id: str
    observation: bytes


def fork_episode(service: DebateService, source: EpisodeEntry, t: int, kind: SessionKind,
                 owner: Connection | None = None, episode_id: str | None = None) -> Forked:
    """Fork ``source`` at observation ``t`` into a new session of ``kind`` owned by ``owner``.

    Args:
        service: the debate service.
        source: the episode to fork (live or finished, any session's).
        t: the observation to start from: ``0 <= t <= step_count`` while the original runs,
            ``0 <= t < step_count`` once it is done (the observations at which a role acted or
            must act, as ``state(t)``).
        kind: ``"mux"`` or ``"http"`` (the session's kind, as ``open``).
        owner: the connection that owns a ``mux`` fork.
        episode_id: the fork's episode id (default: a new one).

    Returns:
        The :class:`Forked` session; its observation equals the original's observation ``t``
        but for ``episode_id``.

    Raises:
        OutOfRangeError: ``t`` is not an observation of the original.
        CapacityError: a session limit is reached.
        ShuttingDownError, EpisodeIdInUseError: as ``reset``.
    """
    original = source.episode
    original.observation_at(t)  # the range check of state(t)
    turns = list(original.turns[:t])  # taken now: the original may go on while this one is made
    opened = service.open(kind, owner)
    try:
        request = ResetRequest(problem_id=original.problem.problem_id, max_rounds=original.max_rounds,
                               mode=original.mode, episode_id=episode_id)
        observation = service.reset(opened.session_id, request, owner)
        for turn in turns:
            observation = service.step(opened.session_id, DebateAction(role=turn.role, content=turn.content),
                                       owner).observation
    except BaseException:
        service.close(opened.session_id, owner)
        raise
    entry = service.sessions.get(opened.session_id, owner).entry
    assert entry is not None, "the fork's reset gave its session an episode"
    return Forked(opened.session_id, opened.resume_token, opened.resume_window_s, entry.episode_id, observation)
