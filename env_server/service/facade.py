"""The debate service: the one facade every transport calls.

It ties the pieces together: problems -> ``DebateEpisode`` -> grading pool -> rewards record
-> the owning connection told (``Connection.rewards_ready``), pull by id, trajectory log.
Transports (HTTP, ``/ws``, ``/ws/mux``) translate frames into the operations below (open,
attach, detach, reset, step, state, state_at, rewards, close) and their results, which are
payload bytes (stored observation and record JSON, sent verbatim), into frames; they never
touch sessions or episodes themselves. This module builds no wire envelope.

Grading never blocks a step: each solver/judge answer is graded as soon as it arrives (most
grades are ready before the debate ends). When the debate ends the record is built and pushed
right after the last step's reply if every grade is known (exact path or cache), else a
finaliser task waits for the grades first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import time
from collections.abc import Awaitable
from typing import IO, Any

import env_server
from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import ProblemSource, UnknownProblemError, load_problem_source
from env_server.grading.pool import Grader
from env_server.protocol.errors import (
    NoEpisodeError,
    OutOfRangeError,
    ShuttingDownError,
    UnknownEpisodeError,
    UnknownProblemIdError,
)
from env_server.protocol.models import DebateAction, ResetRequest, RewardsStatus
from env_server.protocol.payloads import state_body
from env_server.service import viewer_queries
from env_server.service.config import ServerConfig
from env_server.service.episodes import EpisodeEntry, EpisodeStore
from env_server.service.finalisation import GradingFinalisation
from env_server.service.journal import StateJournal
from env_server.service.recovery import compact, fsync_forever, restore_state, snapshot_frames
from env_server.service.replies import (
    Attached,
    Opened,
    RewardsReply,
    StepReply,
    rewards_payload,
    rewards_reply,
    state_data,
    wait_graded,
    with_reward,
)
from env_server.service.sessions import Connection, Session, SessionKind, SessionRegistry

__all__ = ["Attached", "DebateService", "Opened", "RewardsReply", "StepReply"]

log = logging.getLogger(__name__)


class DebateService(GradingFinalisation):
    """Owns the sessions, the episodes, the grader and the problem source.

    Args:
        config: server settings.
        problems: a problem source; default: built from ``config.problems``.
        grader: a grader; default: one built from ``config.grading``.
    """

    def __init__(self, config: ServerConfig, problems: ProblemSource | None = None, grader: Grader | None = None) -> None:
        self.config = config
        self.problems = problems if problems is not None else load_problem_source(config.problems)
        self.grader = grader if grader is not None else Grader(config.grading)
        self.sessions = SessionRegistry(
            config.max_sessions, config.max_sessions_per_connection, config.resume_window_s, config.idle_timeout_s
        )
        self.episodes = EpisodeStore(config.retention_s, config.max_retained_episodes)
        self.accepting = True
        self.counters: dict[str, int] = {"episodes_started": 0, "episodes_graded": 0, "steps": 0}
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self._finalizers: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._trajectory: IO[bytes] | None = None
        #: session id -> graded episodes whose push found the session detached (or that were
        #: graded shortly before a restart): pushed again when the session re-attaches
        self._unpushed: dict[str, list[EpisodeEntry]] = {}
        self.journal = (StateJournal(config.state_dir, self.problem_fingerprint, config.state_fsync_interval_s,
                                     config.state_compact_bytes) if config.state_dir else None)
        self._fsyncer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the grading pool, the reaper and the trajectory log; with ``state_dir``,
        rebuild the journaled state first (sessions wait ``resume_window_s`` from now for
        their clients).

        Raises:
            JournalMismatchError: the state directory belongs to another problem source.
        """
        await self.grader.start()
        if self.journal is not None:
            recovered = self.journal.recover()
            restore_state(self, recovered)
            self.journal.start(snapshot_frames(self.sessions, self.episodes))
            self._fsyncer = asyncio.create_task(fsync_forever(self.journal, self.config.state_fsync_interval_s),
                                                name="mathdebate-journal-fsync")
        if self.config.trajectory_log:
            self._trajectory = open(self.config.trajectory_log, "ab", buffering=0)  # noqa: SIM115  the log stays open for the server's lifetime; shutdown() closes it
        self._reaper = asyncio.create_task(self._reap_forever(), name="mathdebate-reaper")

    async def shutdown(self) -> None:
        """Stop accepting episodes, let in-flight grading finish within the grace period, then
        stop the pool. Episodes graded in time are in the trajectory log exactly once."""
        self.accepting = False
        await asyncio.sleep(0)  # records scheduled by the last steps (call_soon) are built first
        if self._reaper is not None:
            self._reaper.cancel()
        pending = list(self._finalizers)
        if pending:
            log.info("waiting up to %.0fs for %d episodes being graded", self.config.shutdown_grace_s, len(pending))
            _, not_done = await asyncio.wait(pending, timeout=self.config.shutdown_grace_s)
            for task in not_done:
                task.cancel()
            if not_done:
                log.warning("%d episodes were not graded before shutdown", len(not_done))
        self.grader.close()
        if self._fsyncer is not None:
            self._fsyncer.cancel()
        if self.journal is not None:
            self.journal.close()
        if self._trajectory is not None:
            self._trajectory.close()
            self._trajectory = None

    # ------------------------------------------------------------------ sessions

    @property
    def problem_source_name(self) -> str:
        """The problem source's name (e.g. ``math500``)."""
        return self.problems.name

    def open(self, kind: SessionKind, owner: Connection | None = None, open_id: str | None = None) -> Opened:
        """Open a session owned by ``owner`` (``None`` for HTTP sessions). ``open_id``: the
        client's nonce of a ``mux`` open; a re-sent open with it gets the earlier session
        (``SessionRegistry.open``).

        Raises:
            CapacityError: the server-wide or the per-connection session limit is reached.
        """
        session, token, earlier = self.sessions.open(kind, owner, open_id)
        if earlier:
            return Opened(session.session_id, token, self.config.resume_window_s)
        if self.journal is not None and kind == "mux":
            self.journal.append(StateJournal.session_frame(session.session_id, session.token_hash, time.time()))
        return Opened(session.session_id, token, self.config.resume_window_s)

    def attach(self, session_id: str, resume_token: str, owner: Connection) -> Attached:
        """Re-attach a ``mux`` session to ``owner`` with its resume token.

        Raises:
            UnknownSessionError, ResumeDeniedError, CapacityError: see ``SessionRegistry.attach``.
        """
        session = self.sessions.attach(session_id, resume_token, owner)
        entry = session.entry
        rewards = rewards_payload(entry) if entry is not None and entry.is_graded else None
        unpushed = [e for e in self._unpushed.pop(session_id, []) if e is not entry and e.is_graded]
        if unpushed:  # after the "attached" reply (call_soon runs once this frame is answered)
            loop = asyncio.get_running_loop()
            for other in unpushed:
                loop.call_soon(owner.rewards_ready, session_id, rewards_payload(other))
        return Attached(session.session_id, state_data(entry), rewards)

    def detach(self, owner: Connection) -> None:
        """``owner`` is gone: its ``mux`` sessions wait for re-attachment, the others close."""
        for session in self.sessions.detach(owner):
            self._close(session)

    def close(self, session_id: str, owner: Connection | None = None) -> None:
        """Close a session; an unfinished episode is abandoned, a finished one is graded and
        retained as usual.

        Raises:
            UnknownSessionError: no such session on ``owner``.
        """
        self._close(self.sessions.get(session_id, owner))

    # ------------------------------------------------------------------ episodes

    def reset(self, session_id: str, request: ResetRequest, owner: Connection | None = None) -> bytes:
        """Start a new episode in the session (the previous one, if unfinished, is abandoned).

        The episode is played in ``request.mode``, else the server's ``mode`` (RFC 0006), with
        the server's circular-critique stop setting.

        Returns:
            The reset observation's JSON (``StepPayload``), stored for ``state(0)``.

        Raises:
            UnknownSessionError: no such session on ``owner``.
            ShuttingDownError: the server is stopping.
            UnknownProblemIdError: ``problem_id`` is not in the problem source.
            EpisodeIdInUseError: ``episode_id`` is taken.
        """
        session = self.sessions.get(session_id, owner)
        if not self.accepting:
            raise ShuttingDownError("the server is shutting down and accepts no new episodes")
        if request.problem_id is not None:
            try:
                problem = self.problems.get(request.problem_id)
            except UnknownProblemError as exc:
                raise UnknownProblemIdError(str(exc.args[0]) if exc.args else f"unknown problem {request.problem_id!r}",
                                            problem_id=request.problem_id) from None
        else:
            seed = request.seed if request.seed is not None else self._rng.randrange(2**31)
            problem = self.problems.by_seed(seed)
        episode = DebateEpisode(
            episode_id=request.episode_id or self.episodes.new_id(),
            problem=problem,
            max_rounds=request.max_rounds or self.config.max_rounds,
            max_action_chars=self.config.max_action_chars,
            mode=request.mode or self.config.mode,
            circular_stop=self.config.circular_critique_stop,
        )
        entry = EpisodeEntry(episode, session.session_id)
        self.episodes.add(entry)
        if self.journal is not None:
            self.journal.append(StateJournal.episode_frame(
                session.session_id, episode.episode_id, problem.problem_id, episode.max_rounds, episode.mode.value,
                episode.circular_stop, episode.max_action_chars, time.time()))
        self._abandon(session)
        session.entry = entry
        session.touch()
        self.counters["episodes_started"] += 1
        return episode.last_observation

    def step(self, session_id: str, action: DebateAction, owner: Connection | None = None) -> StepReply:
        """Apply ``action`` to the session's current episode; grading starts at once and the
        record goes to the owner (``Connection.rewards_ready``) when every grade is in.

        Raises:
            UnknownSessionError: no such session on ``owner``.
            NoEpisodeError: no reset yet.
            EpisodeDoneError, InvalidActionError: from the episode.
        """
        return self._step(self.sessions.get(session_id, owner), action)[1]

    def _step(self, session: Session, action: DebateAction) -> tuple[EpisodeEntry, StepReply]:
        entry = self._current(session)
        episode = entry.episode
        if action.t is not None and action.t != episode.step_count:
            session.touch()
            return entry, self._resent_step(episode, action)
        turn = episode.step(action)
        if self.journal is not None:  # on disk (page cache) before the reply is queued
            self.journal.append(StateJournal.action_frame(entry.episode_id, turn.t, turn.role.value, turn.content))
        session.touch()
        self.counters["steps"] += 1
        if turn.needs_grade:
            entry.grades[turn.t] = self.grade_turn(entry, turn)
        done = episode.done
        if done:
            if not any(isinstance(grade, asyncio.Future) for grade in entry.grades.values()):
                # every grade is known already (exact path or cache): finalise right after
                # this step's reply is queued, without a task (the common case under load)
                asyncio.get_running_loop().call_soon(self._record, entry)
            else:
                self.finalize_later(entry)
        return entry, StepReply(episode.last_observation, done)

    @staticmethod
    def _resent_step(episode: DebateEpisode, action: DebateAction) -> StepReply:
        """A step whose ``t`` names a turn already taken (RFC 0004 "Re-sent steps"): the stored
        reply when the turn was taken with this role and content, nothing done again.

        Raises:
            OutOfRangeError: ``t`` is ahead of the episode, or the turn was taken with another action.
        """
        assert action.t is not None
        taken = episode.turns[action.t] if action.t < episode.step_count else None
        if taken is None or taken.role is not action.role or taken.content != action.content:
            why = "has not been taken" if taken is None else "was taken with another action"
            raise OutOfRangeError(f"turn t={action.t} {why}: the next turn is t={episode.step_count}",
                                  t=action.t, next_t=episode.step_count)
        return StepReply(episode.observation_after(action.t), episode.done and action.t == episode.step_count - 1)

    async def step_until_graded(self, session_id: str, action: DebateAction, owner: Connection | None = None,
                                close_when_done: bool = False) -> StepReply:
        """:meth:`step` as the OpenEnv routes need it: a numeric step reward under
        ``config.step_reward == "sparse"`` (0.0 before the terminal step), and a terminal
        observation that carries the episode reward (stock OpenEnv clients read it there), so
        the last step waits for grading, up to ``terminal_reward_timeout_s``; after that the
        reward is 0.0 (``"sparse"``) or ``null`` (``"none"``) with ``metadata.grading:
        "pending"``, and the record can still be pulled. Other sessions keep running meanwhile.

        Args:
            close_when_done: close the session as soon as the debate is over, before waiting
                (HTTP episodes: frees the slot; the episode stays retained).

        Raises:
            UnknownSessionError, NoEpisodeError, EpisodeDoneError, InvalidActionError: as :meth:`step`.
        """
        session = self.sessions.get(session_id, owner)
        entry, reply = self._step(session, action)
        sparse = self.config.step_reward == "sparse"
        if not reply.done:
            return StepReply(with_reward(reply.observation, 0.0), False) if sparse else reply
        if close_when_done:
            self._close(session)
        record = await wait_graded(entry, self.config.terminal_reward_timeout_s)
        if record is None:
            return StepReply(with_reward(reply.observation, 0.0), True) if sparse else reply
        return StepReply(with_reward(reply.observation, record.episode_reward, graded=True), True)

    def state(self, session_id: str, owner: Connection | None = None) -> dict[str, Any]:
        """``state``: OpenEnv's ``episode_id``/``step_count`` plus the debate's fields and
        whether the episode is graded (``{"episode_id": None, "step_count": 0}`` before the
        first reset, as OpenEnv answers). Counts as activity.

        Raises:
            UnknownSessionError: no such session on ``owner``.
        """
        session = self.sessions.get(session_id, owner)
        session.touch()
        return state_data(session.entry)

    def state_at(self, session_id: str, t: int, episode_id: str | None = None, owner: Connection | None = None) -> bytes:
        """``state(t)``: ``{"t", "episode_id", "observation"}`` with observation ``t`` of the
        current episode, or of ``episode_id`` (an earlier, retained episode of the session),
        exactly as it was sent (RFC 0004).

        Raises:
            UnknownSessionError: no such session on ``owner``.
            NoEpisodeError: no episode id given and no reset yet.
            UnknownEpisodeError: unknown, expired, or played by another session.
            OutOfRangeError: ``t`` is not an observation of the episode.
        """
        session = self.sessions.get(session_id, owner)
        session.touch()
        entry = self.entry_for(session, episode_id)
        return state_body(t, entry.episode_id, entry.episode.observation_at(t))

    def rewards(self, session_id: str, episode_id: str | None = None, owner: Connection | None = None) -> RewardsReply:
        """The delayed-reward status of ``episode_id`` (default: the session's current or
        last episode), graded or pending.

        Raises:
            UnknownSessionError, NoEpisodeError, UnknownEpisodeError: as :meth:`state_at`.
        """
        session = self.sessions.get(session_id, owner)
        session.touch()
        return rewards_reply(self.entry_for(session, episode_id))

    def wait_rewards(self, session_id: str, episode_id: str, timeout_s: float,
                     owner: Connection | None = None) -> Awaitable[RewardsReply]:
        """:meth:`rewards`, answered once the episode is graded or after ``timeout_s`` (then
        pending). The episode is looked up now, so errors raise here, not when awaited.

        Raises:
            UnknownSessionError, NoEpisodeError, UnknownEpisodeError: as :meth:`rewards`.
        """
        entry = self.entry_for(self.sessions.get(session_id, owner), episode_id)

        async def when_graded() -> RewardsReply:
            await wait_graded(entry, timeout_s)
            return rewards_reply(entry)

        return when_graded()

    # ------------------------------------------------------------------ HTTP episodes (by episode id)

    def http_session_of(self, episode_id: str) -> str:
        """The HTTP session playing ``episode_id`` (``POST /step`` addresses episodes by id).

        Raises:
            UnknownEpisodeError: unknown, finished, or not an open HTTP episode.
        """
        entry = self.episodes.get(episode_id)
        session = self.sessions.find(entry.session_id) if entry.session_id else None
        if session is None or session.kind != "http" or session.entry is not entry:
            raise UnknownEpisodeError(f"episode {episode_id!r} is not an open HTTP episode", episode_id=episode_id)
        return session.session_id

    def episode_state(self, episode_id: str) -> dict[str, Any]:
        """:meth:`state` of any known episode, by id.

        Raises:
            UnknownEpisodeError: never started, abandoned, or past retention.
        """
        return state_data(self.episodes.get(episode_id))

    def episode_state_at(self, episode_id: str, t: int) -> bytes:
        """:meth:`state_at` of any known episode, by id.

        Raises:
            UnknownEpisodeError: never started, abandoned, or past retention.
            OutOfRangeError: ``t`` is not an observation of the episode.
        """
        entry = self.episodes.get(episode_id)
        return state_body(t, entry.episode_id, entry.episode.observation_at(t))

    def rewards_status(self, episode_id: str) -> RewardsStatus:
        """The delayed-reward status of any known episode, by id, as a model.

        Raises:
            UnknownEpisodeError: never started, abandoned, or past retention.
        """
        entry = self.episodes.get(episode_id)
        if not entry.is_graded:
            return RewardsStatus(status="pending", episode_id=entry.episode_id)
        return RewardsStatus(status="graded", episode_id=entry.episode_id, record=entry.record)

    def recent_episodes(self, *, problem_id: str | None = None, error_kind: str | None = None,
                        min_reward: float | None = None, max_reward: float | None = None,
                        limit: int = 50) -> list[dict[str, Any]]:
        """The viewer's list of retained graded episodes (:func:`~env_server.service.viewer_queries.recent_episodes`)."""
        return viewer_queries.recent_episodes(self.episodes, problem_id=problem_id, error_kind=error_kind,
                                              min_reward=min_reward, max_reward=max_reward, limit=limit)

    def episode_view(self, episode_id: str) -> dict[str, Any]:
        """One known episode in full (:func:`~env_server.service.viewer_queries.episode_view`).

        Raises:
            UnknownEpisodeError: never started, abandoned, or past retention.
        """
        return viewer_queries.episode_view(self.episodes, episode_id)

    @functools.cached_property
    def problem_fingerprint(self) -> str:
        """The problem source's fingerprint (``ProblemSource.fingerprint``), computed once."""
        return self.problems.fingerprint()

    def stats(self) -> dict[str, Any]:
        """Counters for operators and benchmarks (sessions, episodes, steps, grading) and what is served, for runs'
        provenance (``version``; ``compiled``: the hot path built with mypyc, setup.py; the problem source)."""
        return {
            "version": env_server.__version__, "compiled": not __file__.endswith((".py", ".pyc")),
            "problem_source": self.problems.name, "problem_fingerprint": self.problem_fingerprint,
            "sessions": len(self.sessions), "episodes": len(self.episodes), **self.counters,
            "grading": dict(self.grader.stats), "grade_cache_entries": len(self.grader.cache),
        }

    # ------------------------------------------------------------------ internals

    def _current(self, session: Session) -> EpisodeEntry:
        if session.entry is None:
            raise NoEpisodeError("no episode: send reset first")
        return session.entry

    def entry_for(self, session: Session, episode_id: str | None) -> EpisodeEntry:
        """The session's current episode, or ``episode_id`` if this session played it (UnknownEpisodeError)."""
        if episode_id is None:
            return self._current(session)
        entry = self.episodes.get(episode_id)
        if entry.session_id != session.session_id:
            raise UnknownEpisodeError(f"episode {episode_id!r} was not played by this session", episode_id=episode_id)
        return entry

    def _close(self, session: Session) -> None:
        with contextlib.suppress(KeyError):
            self.sessions.remove(session.session_id)
        self._session_gone(session)
        self._abandon(session)

    def _session_gone(self, session: Session) -> None:
        self._unpushed.pop(session.session_id, None)
        if self.journal is not None and session.kind == "mux":
            self.journal.append(StateJournal.closed_frame(session.session_id))

    def _abandon(self, session: Session) -> None:
        if session.entry is not None and not session.entry.episode.done:
            self.episodes.discard(session.entry.episode_id)
            if self.journal is not None:
                self.journal.append(StateJournal.abandoned_frame(session.entry.episode_id))
        session.entry = None

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            try:
                self.reap()
            except Exception:  # the reaper must survive anything
                log.exception("reaper failed")

    def reap(self) -> None:
        """Expire sessions (resume window, idle) and graded records past retention."""
        for session, reason in self.sessions.expired():
            self._session_gone(session)
            self._abandon(session)
            if session.owner is not None:
                session.owner.session_closed(session.session_id, reason)
        self.episodes.purge(time.monotonic())
        if self.journal is not None and self.journal.needs_compaction:
            compact(self.journal, self.sessions, self.episodes)
