"""Journal recovery and upkeep (``serve --state-dir``): the live state as journal frames (the
snapshot written at start and at each compaction), the state rebuilt from a recovered journal,
compaction and the periodic fsync. ``restore_state`` rebuilds into the service through its
public members (:class:`RecoveryTarget`: grading a turn, finalising later, holding a record for
a push), never its private state."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Protocol

import orjson

from env_server.debate.episode import DebateEpisode, TurnRecord
from env_server.debate.problems import ProblemSource
from env_server.protocol.grades import Grade
from env_server.protocol.markers import EpisodeMode, Role
from env_server.protocol.models import DebateAction
from env_server.service.config import ServerConfig
from env_server.service.episodes import EpisodeEntry, EpisodeStore
from env_server.service.journal import RecoveredState, StateJournal
from env_server.service.sessions import SessionRegistry

__all__ = ["RecoveryTarget", "compact", "fsync_forever", "restore_state", "snapshot_frames"]

log = logging.getLogger(__name__)


def snapshot_frames(sessions: SessionRegistry, episodes: EpisodeStore) -> Iterator[bytes]:
    """The live state as journal frames: ``mux`` sessions, then every known episode (its
    start, its actions, its worker grades, its record once graded)."""
    now_wall, now_mono = time.time(), time.monotonic()
    for session in sessions:
        if session.kind == "mux":
            yield StateJournal.session_frame(session.session_id, session.token_hash, now_wall)
    for entry in episodes:
        episode = entry.episode
        yield StateJournal.episode_frame(entry.session_id, entry.episode_id, episode.problem.problem_id,
                                         episode.max_rounds, episode.mode.value, episode.circular_stop,
                                         episode.max_action_chars, now_wall)
        for turn in episode.turns:
            yield StateJournal.action_frame(entry.episode_id, turn.t, turn.role.value, turn.content)
        if entry.record_json is not None:
            yield StateJournal.record_frame(entry.episode_id, now_wall - (now_mono - entry.graded_at),
                                            entry.record_json)
            continue
        for t, pending in entry.grades.items():
            grade: Grade | None = pending if isinstance(pending, Grade) else None
            if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled() \
                    and pending.exception() is None:
                grade = pending.result()
            if grade is not None and grade.source == "worker":  # unresolved ones are journaled when they resolve
                yield StateJournal.grade_frame(entry.episode_id, t, grade)


class RecoveryTarget(Protocol):
    """What :func:`restore_state` rebuilds into (the service, through its public members)."""

    sessions: SessionRegistry
    episodes: EpisodeStore
    problems: ProblemSource
    config: ServerConfig
    counters: dict[str, int]

    def grade_turn(self, entry: EpisodeEntry, turn: TurnRecord) -> Grade | asyncio.Future[Grade]: ...

    def finalize_later(self, entry: EpisodeEntry) -> None: ...

    def hold_for_push(self, session_id: str, entry: EpisodeEntry) -> None: ...


def restore_state(service: RecoveryTarget, state: RecoveredState) -> None:
    """Rebuild sessions and episodes from the journal: each episode replays its actions
    (the debate is deterministic given problem and actions); an episode that was over
    but not graded is graded now, with the journaled worker grades; records graded
    within ``resume_window_s`` before the last write are pushed again on re-attach (a
    push may have been lost with the old process; clients de-duplicate by episode id)."""
    now_wall, now_mono = time.time(), time.monotonic()
    for logged in state.sessions.values():
        service.sessions.restore(logged.session_id, logged.token_hash)
    graded: list[tuple[float, EpisodeEntry]] = []
    for logged_episode in state.episodes.values():
        session = service.sessions.find(logged_episode.session_id) if logged_episode.session_id else None
        is_graded = logged_episode.record_json is not None
        if is_graded and now_wall - logged_episode.graded_at > service.config.retention_s:
            continue
        try:
            problem = service.problems.get(logged_episode.problem_id)
            episode = DebateEpisode(logged_episode.episode_id, problem, logged_episode.max_rounds,
                                    logged_episode.max_action_chars, EpisodeMode(logged_episode.mode),
                                    logged_episode.circular_stop)
            for role, content in logged_episode.actions:
                episode.step(DebateAction(role=Role(role), content=content))
        except Exception:  # one bad episode must not stop the server from recovering the rest
            log.exception("state journal: episode %s could not be rebuilt; dropped", logged_episode.episode_id)
            continue
        if not episode.done and session is None:
            continue  # its session is gone: abandoned, as it would have been
        entry = EpisodeEntry(episode, logged_episode.session_id)
        service.episodes.add(entry)
        if session is not None:
            session.entry = entry  # episodes come in start order: the session's latest wins
        if is_graded:
            assert logged_episode.record_json is not None
            entry.set_record_json(logged_episode.record_json,
                                  orjson.loads(logged_episode.record_json)["episode_reward"])
            graded.append((logged_episode.graded_at, entry))
            if session is not None and state.last_write - logged_episode.graded_at <= service.config.resume_window_s:
                service.hold_for_push(session.session_id, entry)
            continue
        for turn in episode.turns:  # the journaled worker grades, else graded again
            if turn.needs_grade:
                entry.grades[turn.t] = logged_episode.grades.get(turn.t) or service.grade_turn(entry, turn)
        if episode.done:
            service.finalize_later(entry)
    for graded_at, entry in sorted(graded, key=lambda item: item[0]):
        service.episodes.mark_graded(entry, now_mono - (now_wall - graded_at))
    service.counters["sessions_recovered"] = len(state.sessions)
    service.counters["episodes_recovered"] = len(service.episodes)
    if state.sessions or state.episodes:
        log.info("state journal: recovered %d sessions and %d episodes (%d graded)", len(state.sessions),
                 len(service.episodes), len(graded))


async def fsync_forever(journal: StateJournal, interval_s: float) -> None:
    """Fsync ``journal`` every ``interval_s`` seconds (in a thread: the loop goes on); ``0``:
    every write is fsynced already, nothing to do."""
    if interval_s == 0:
        return
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(journal.fsync)
        except OSError:
            log.exception("state journal: fsync failed")


def compact(journal: StateJournal, sessions: SessionRegistry, episodes: EpisodeStore) -> None:
    """Rewrite the journal as a snapshot of the live state, on the event loop (the state must
    not change meanwhile); its duration is logged, as every step waits for it."""
    before, start = journal.bytes_written, time.perf_counter()
    journal.start(snapshot_frames(sessions, episodes))
    log.info("state journal compacted: %.1f MB -> %.1f MB in %.0f ms (the event loop waited for it)",
             before / 1e6, journal.bytes_written / 1e6, 1000 * (time.perf_counter() - start))
