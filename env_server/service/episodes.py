"""The episode store: every known episode by id, from reset through grading to expiry.

Graded episodes stay for ``retention_s`` (and at most ``max_retained`` of them), so a client
that disconnected can still pull its rewards and replay ``state(t)``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from typing import Any

import orjson

from env_server.debate.episode import DebateEpisode
from env_server.protocol.errors import EpisodeIdInUseError, UnknownEpisodeError
from env_server.protocol.grades import Grade
from env_server.protocol.models import EpisodeRewards
from env_server.service.ids import RandomIds

__all__ = ["EpisodeEntry", "EpisodeStore"]


class EpisodeEntry:
    """An episode and its grading state.

    Attributes:
        episode: the debate.
        session_id: the session that plays it.
        grades: turn index -> the grade of that turn's answer, or the future of a grade
            still running in a worker (emptied once the record is built).
        record_json: the rewards record serialised once graded (what pushes, pulls and the
            trajectory log send), else ``None``.
        episode_reward: the record's ``episode_reward`` once graded, else ``None``.
        graded: resolved (with ``None``) when grading finishes (made on first use: most
            episodes have no waiter, and a future per episode was a measurable share of a
            loaded server's time; ``benchmarks/README.md``).
        graded_at: monotonic time of grading (0 while pending), for retention.
    """

    __slots__ = ("_graded", "_record", "episode", "episode_reward", "graded_at", "grades", "record_json", "session_id")

    def __init__(self, episode: DebateEpisode, session_id: str | None) -> None:
        self.episode = episode
        self.session_id = session_id
        self.grades: dict[int, Grade | asyncio.Future[Grade]] = {}
        self.record_json: bytes | None = None
        self.episode_reward: float | None = None
        self._record: EpisodeRewards | None = None
        self._graded: asyncio.Future[None] | None = None
        self.graded_at = 0.0

    @property
    def graded(self) -> asyncio.Future[None]:
        """Resolved (with ``None``) when grading finishes; already resolved once graded.

        Raises:
            RuntimeError: no running event loop (the first use makes the future).
        """
        if self._graded is None:
            self._graded = asyncio.get_running_loop().create_future()
            if self.record_json is not None:
                self._graded.set_result(None)
        return self._graded

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def is_graded(self) -> bool:
        return self.record_json is not None

    @property
    def record(self) -> EpisodeRewards | None:
        """The rewards record as a validated model (parsed from ``record_json`` on first use),
        or ``None`` while pending. Retained episodes keep only the JSON (memory)."""
        if self._record is None and self.record_json is not None:
            self._record = EpisodeRewards.model_validate_json(self.record_json)
        return self._record

    def set_record(self, data: dict[str, Any]) -> None:
        """Store the graded record (``rewards.episode_rewards_data``) serialised, and wake the waiters."""
        self.set_record_json(orjson.dumps(data), data["episode_reward"])

    def set_record_json(self, record_json: bytes, episode_reward: float) -> None:
        """Store an already serialised graded record (e.g. recovered from the state journal)
        with its ``episode_reward``, and wake the waiters."""
        self.record_json = record_json
        self.episode_reward = episode_reward
        self.grades.clear()
        if self._graded is not None:
            self._graded.set_result(None)


class EpisodeStore:
    """Episodes by id, with retention of graded ones.

    Args:
        retention_s: seconds a graded episode stays.
        max_retained: most graded episodes kept; the oldest go first.
    """

    def __init__(self, retention_s: float, max_retained: int) -> None:
        self.retention_s = retention_s
        self.max_retained = max_retained
        self._entries: dict[str, EpisodeEntry] = {}
        self._graded: deque[tuple[float, str]] = deque()
        self._ids = RandomIds()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._entries

    def new_id(self) -> str:
        """A new random episode id (128 bits, 32 hex characters; ``RandomIds``)."""
        return self._ids.next()

    def add(self, entry: EpisodeEntry) -> None:
        """Register a new episode.

        Raises:
            EpisodeIdInUseError: an episode with this id is live or retained.
        """
        if entry.episode_id in self._entries:
            raise EpisodeIdInUseError(f"episode_id {entry.episode_id!r} is already in use", episode_id=entry.episode_id)
        self._entries[entry.episode_id] = entry

    def get(self, episode_id: str) -> EpisodeEntry:
        """The entry of ``episode_id``.

        Raises:
            UnknownEpisodeError: never existed, abandoned, or past retention.
        """
        entry = self._entries.get(episode_id)
        if entry is None:
            raise UnknownEpisodeError(
                f"unknown episode {episode_id!r} (never started, abandoned unfinished, or past retention)",
                episode_id=episode_id,
            )
        return entry

    def __iter__(self) -> Iterator[EpisodeEntry]:
        """Every known episode (live and retained), in the order they were added."""
        return iter(list(self._entries.values()))

    def graded_newest_first(self) -> Iterator[EpisodeEntry]:
        """The retained graded episodes, most recently graded first (a lazy view: stop early
        to read only the newest; do not add or drop episodes while iterating)."""
        for _, episode_id in reversed(self._graded):
            entry = self._entries.get(episode_id)
            if entry is not None and entry.is_graded:
                yield entry

    def mark_graded(self, entry: EpisodeEntry, now: float) -> None:
        """Start the retention clock of a graded episode."""
        entry.graded_at = now
        self._graded.append((now, entry.episode_id))
        while len(self._graded) > self.max_retained:
            self._drop_graded(self._graded.popleft()[1])

    def discard(self, episode_id: str) -> None:
        """Forget an unfinished episode (its session went away before the debate ended)."""
        entry = self._entries.get(episode_id)
        if entry is not None and not entry.episode.done:
            del self._entries[episode_id]

    def purge(self, now: float) -> int:
        """Drop graded episodes past retention; returns how many were dropped."""
        dropped = 0
        while self._graded and now - self._graded[0][0] > self.retention_s:
            self._drop_graded(self._graded.popleft()[1])
            dropped += 1
        return dropped

    def _drop_graded(self, episode_id: str) -> None:
        entry = self._entries.get(episode_id)
        if entry is not None and entry.is_graded:
            del self._entries[episode_id]
