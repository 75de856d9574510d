"""Grading finalisation: each answer graded as it arrives, the record built, kept, journaled,
logged and pushed once every grade of a finished episode is in.

Part of :class:`~env_server.service.facade.DebateService` (a base class holding only these
methods, over the service's own state), kept apart so the facade reads as the list of its
operations."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import IO

import orjson

from env_server.debate.episode import TurnRecord
from env_server.debate.rewards import episode_rewards_data
from env_server.grading.pool import Grader
from env_server.protocol.grades import Grade
from env_server.protocol.payloads import rewards_body
from env_server.service.episodes import EpisodeEntry, EpisodeStore
from env_server.service.journal import StateJournal
from env_server.service.sessions import SessionRegistry

__all__ = ["GradingFinalisation"]

log = logging.getLogger(__name__)


class GradingFinalisation:
    """Grades, records and pushes (see the module docstring); the attributes are the service's."""

    grader: Grader
    journal: StateJournal | None
    episodes: EpisodeStore
    sessions: SessionRegistry
    counters: dict[str, int]
    _trajectory: IO[bytes] | None
    _unpushed: dict[str, list[EpisodeEntry]]
    _finalizers: set[asyncio.Task[None]]

    def grade_turn(self, entry: EpisodeEntry, turn: TurnRecord) -> Grade | asyncio.Future[Grade]:
        """The grade when it is known at once (rules, exact path, cache), else the future of
        the worker's grade."""
        gold = entry.episode.problem.answer
        quick = self.grader.quick_grade(gold, turn.answer)
        if quick is not None:
            return quick
        future = asyncio.ensure_future(self.grader.grade(gold, turn.answer, entry.session_id))
        if self.journal is not None:
            future.add_done_callback(lambda done: self._journal_grade(entry.episode_id, turn.t, done))
        return future

    def grading_backlog(self, session_id: str) -> int:
        """Grades of the session queued for or running in a grading worker."""
        return self.grader.backlog(session_id)

    async def grading_room(self, session_id: str) -> None:
        """Return once the session's grading backlog is below ``GradingConfig.session_backlog``."""
        await self.grader.room(session_id)

    def _journal_grade(self, episode_id: str, t: int, done: asyncio.Future[Grade]) -> None:
        """Journal a worker's grade as soon as it is in (a re-grade after a timeout could differ)."""
        if self.journal is not None and not done.cancelled() and done.exception() is None:
            try:
                self.journal.append(StateJournal.grade_frame(episode_id, t, done.result()))
            except OSError:
                log.exception("state journal: could not write the grade of %s turn %d", episode_id, t)

    def finalize_later(self, entry: EpisodeEntry) -> None:
        """Finalise ``entry`` in a task once its pending grades are in (the service awaits the
        tasks still running at shutdown)."""
        task = asyncio.create_task(self._finalize(entry))
        self._finalizers.add(task)
        task.add_done_callback(self._finalizers.discard)

    def hold_for_push(self, session_id: str, entry: EpisodeEntry) -> None:
        """Push ``entry``'s record to the mux session ``session_id`` when it re-attaches."""
        self._unpushed.setdefault(session_id, []).append(entry)

    async def _finalize(self, entry: EpisodeEntry) -> None:
        for t, grade in list(entry.grades.items()):
            if isinstance(grade, asyncio.Future):
                entry.grades[t] = await grade
        self._record(entry)

    def _record(self, entry: EpisodeEntry) -> None:
        """Build, keep, log and push the record of a finished episode whose grades are all done."""
        grades = {t: grade if isinstance(grade, Grade) else grade.result() for t, grade in entry.grades.items()}
        graded_at = time.time()
        entry.set_record(episode_rewards_data(entry.episode, grades, graded_at=graded_at, session_id=entry.session_id))
        self.episodes.mark_graded(entry, time.monotonic())
        if self.journal is not None:
            assert entry.record_json is not None
            try:
                self.journal.append(StateJournal.record_frame(entry.episode_id, graded_at, entry.record_json))
            except OSError:  # the record is still pushed and pullable; a restart would re-grade it
                log.exception("state journal: could not write the record of %s", entry.episode_id)
        self.counters["episodes_graded"] += 1
        self._log_trajectory(entry)
        self._push_rewards(entry)

    def _push_rewards(self, entry: EpisodeEntry) -> None:
        if entry.session_id is None:
            return
        session = self.sessions.find(entry.session_id)
        if session is None:  # closed: the record stays pullable by id
            return
        if session.owner is None:  # detached (mux: pushed when it re-attaches; HTTP: pull only)
            if session.kind == "mux":
                self.hold_for_push(session.session_id, entry)
            return
        assert entry.record_json is not None
        session.owner.rewards_ready(session.session_id, rewards_body(entry.episode_id, entry.record_json))

    def _log_trajectory(self, entry: EpisodeEntry) -> None:
        if self._trajectory is None:
            return
        head = orjson.dumps({
            "episode_id": entry.episode_id,
            "problem_id": entry.episode.problem.problem_id,
            "turns": [
                {"t": t.t, "role": t.role.value, "round": t.round, "content": t.content} for t in entry.episode.turns
            ],
        })
        assert entry.record_json is not None
        self._trajectory.write(b"".join((head[:-1], b',"rewards":', entry.record_json, b"}\n")))
