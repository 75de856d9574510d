"""The state journal behind ``mathdebate serve --state-dir DIR``: what the server needs to
rebuild its sessions and episodes after a crash or a restart.

What is journaled (the debate is deterministic given the problem and the actions, so replaying
the actions rebuilds an episode, its stored observations and provisional markers included):

- ``mux`` sessions when opened (the resume token as its SHA-256, never in clear) and closed;
- every episode start (session, problem id, rounds, mode, circular stop, action limit), every
  accepted action, every grade a grading worker produced (a re-grade after a timeout could
  differ), each graded record (its JSON, byte for byte), and every abandoned episode.

Format: an append-only log of frames ``<length u32 LE><crc32 u32 LE><payload>`` in
``DIR/journal-NNNNNN.log``; a payload is an orjson list ``[kind, ...]``, and a graded record's
JSON follows its header after one ``\\n``. We write our own log instead of using SQLite: a
step must be on disk (in the page cache) before its reply, and one ``write(2)`` per step costs
a few microseconds, while a SQLite commit per step costs tens (the step itself costs about a
hundred); a checksummed frame also lets recovery say exactly where a torn or corrupted tail
starts. The header frame of each file carries the format version and the fingerprint of the
problem source; a mismatch refuses to start (``JournalMismatchError``).

Compaction: at start-up (after recovery) and whenever the current file passes
``compact_bytes``, the live state (open sessions, unfinished or ungraded episodes, retained
records) is written to a new file, fsynced and renamed into place, and older files are
deleted; a crash during compaction leaves the older file intact.

Durability: a frame is written with ``write(2)`` before the step's reply is queued, so a
process crash (``kill -9``, OOM kill) loses nothing that was acknowledged. The file is
fsynced every ``fsync_interval_s`` seconds (``0``: after every frame), so a power loss or
kernel crash can lose the last interval's frames; the checksums find the torn tail.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from env_server.protocol.grades import Grade
from env_server.protocol.markers import ErrorKind

__all__ = ["EpisodeLog", "JournalMismatchError", "RecoveredState", "SessionLog", "StateJournal"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_FRAME = struct.Struct("<II")
_PREFIX = "journal-"
_SUFFIX = ".log"


class JournalMismatchError(RuntimeError):
    """The state directory was written for another problem source or journal format."""


@dataclass
class SessionLog:
    """A journaled ``mux`` session: its kind, the SHA-256 of its resume token, and when it
    was opened (Unix seconds)."""

    session_id: str
    token_hash: bytes
    opened_at: float


@dataclass
class EpisodeLog:
    """A journaled episode: what its reset said, the actions taken so far, the worker grades
    by turn, and its graded record once graded (``record_json``, ``graded_at`` in Unix s)."""

    episode_id: str
    session_id: str | None
    problem_id: str
    max_rounds: int
    mode: str
    circular_stop: bool
    max_action_chars: int
    actions: list[tuple[str, str]] = field(default_factory=list)
    grades: dict[int, Grade] = field(default_factory=dict)
    record_json: bytes | None = None
    graded_at: float = 0.0


@dataclass
class RecoveredState:
    """What a journal held: live sessions, known episodes (in start order), the Unix time of
    the last frame read (``last_write``; 0 for an empty journal) and how many bytes of a
    damaged tail were dropped."""

    sessions: dict[str, SessionLog] = field(default_factory=dict)
    episodes: dict[str, EpisodeLog] = field(default_factory=dict)
    last_write: float = 0.0
    dropped_bytes: int = 0


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _grade_data(grade: Grade) -> list[Any]:
    return [grade.correct, grade.error_kind.value if grade.error_kind is not None else None, grade.source]


class StateJournal:
    """The append-only state journal in one directory (module docstring: format, durability).

    Args:
        state_dir: the directory (created if missing).
        fingerprint: the problem source's fingerprint (``ProblemSource.fingerprint``); a
            journal written for another refuses to load.
        fsync_interval_s: seconds between fsyncs (``0``: after every frame).
        compact_bytes: compact when the current file grows past this many bytes (and past
            twice its starting snapshot: :attr:`needs_compaction`).
    """

    def __init__(self, state_dir: str | Path, fingerprint: str, fsync_interval_s: float = 1.0,
                 compact_bytes: int = 256 << 20) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.fsync_interval_s = fsync_interval_s
        self.compact_bytes = compact_bytes
        self.bytes_written = 0
        #: size of the snapshot the current file started with (bytes)
        self.snapshot_bytes = 0
        self._fd: int | None = None
        self._path: Path | None = None
        self._dirty = False

    # ------------------------------------------------------------------ recovery

    def _files(self) -> list[Path]:
        return sorted(p for p in self.dir.glob(f"{_PREFIX}*{_SUFFIX}") if p.stem[len(_PREFIX):].isdigit())

    def recover(self) -> RecoveredState:
        """Read the newest journal file whose header is intact.

        A damaged or truncated tail (bad length, checksum or payload) is reported in the log
        with its offset and size, and everything before it is recovered.

        Raises:
            JournalMismatchError: the journal was written for another problem source
                (fingerprint) or in another format version.
        """
        state = RecoveredState()
        for path in reversed(self._files()):
            data = path.read_bytes()
            frames, good_end = self._frames(data)
            if not frames or frames[0][0] != "journal":
                log.error("state journal %s has no intact header: skipped", path)
                continue
            header = frames[0][1]
            if header[1] != FORMAT_VERSION:
                raise JournalMismatchError(f"{path} is journal format {header[1]}, this server writes {FORMAT_VERSION}")
            if header[2] != self.fingerprint:
                raise JournalMismatchError(
                    f"{path} was written for another problem source (fingerprint {header[2]}, serving "
                    f"{self.fingerprint}): start with the same --problems, or another --state-dir")
            if good_end < len(data):
                state.dropped_bytes = len(data) - good_end
                log.warning("state journal %s: damaged or truncated tail at byte %d (%d bytes dropped); "
                            "everything before it is recovered", path, good_end, state.dropped_bytes)
            for kind, fields, blob in frames[1:]:
                self._apply(state, kind, fields, blob)
            break
        return state

    @staticmethod
    def _frames(data: bytes) -> tuple[list[tuple[str, list[Any], bytes]], int]:
        """The intact frames of ``data`` and the offset where the intact prefix ends."""
        frames: list[tuple[str, list[Any], bytes]] = []
        offset = 0
        while offset + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, offset)
            start = offset + _FRAME.size
            payload = data[start:start + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                break
            head, _, blob = payload.partition(b"\n")
            try:
                fields = orjson.loads(head)
            except orjson.JSONDecodeError:
                break
            if not isinstance(fields, list) or not fields or not isinstance(fields[0], str):
                break
            frames.append((fields[0], fields, blob))
            offset = start + length
        return frames, offset

    @staticmethod
    def _apply(state: RecoveredState, kind: str, f: list[Any], blob: bytes) -> None:
        episodes = state.episodes
        if kind == "S":
            state.sessions[f[1]] = SessionLog(f[1], bytes.fromhex(f[2]), f[3])
            state.last_write = max(state.last_write, f[3])
        elif kind == "X":
            state.sessions.pop(f[1], None)
        elif kind == "R":
            episodes[f[2]] = EpisodeLog(f[2], f[1], f[3], f[4], f[5], f[6], f[7])
            state.last_write = max(state.last_write, f[8])
        elif kind == "A":
            episode = episodes.get(f[1])
            if episode is not None and f[2] == len(episode.actions):
                episode.actions.append((f[3], f[4]))
        elif kind == "G":
            episode = episodes.get(f[1])
            if episode is not None:
                episode.grades[f[2]] = Grade(f[3], ErrorKind(f[4]) if f[4] is not None else None, f[5])
        elif kind == "D":
            episode = episodes.get(f[1])
            if episode is not None:
                episode.record_json, episode.graded_at = blob, f[2]
                episode.grades = {}
                state.last_write = max(state.last_write, f[2])
        elif kind == "Q":
            episodes.pop(f[1], None)
        elif kind == "T":
            state.last_write = max(state.last_write, f[1])
        else:
            log.warning("state journal: unknown frame kind %r ignored", kind)

    # ------------------------------------------------------------------ writing

    def start(self, snapshot: Iterable[bytes]) -> None:
        """Begin a new journal file holding ``snapshot`` (frames from the ``*_frame``
        methods: the live state), fsync it, make it current and delete older files."""
        files = self._files()
        number = int(files[-1].stem[len(_PREFIX):]) + 1 if files else 1
        path = self.dir / f"{_PREFIX}{number:06d}{_SUFFIX}"
        tmp = path.with_suffix(".tmp")
        header = _frame(orjson.dumps(["journal", FORMAT_VERSION, self.fingerprint, time.time()]))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            written = os.write(fd, header)
            chunk: list[bytes] = []
            size = 0
            for frame in snapshot:
                chunk.append(frame)
                size += len(frame)
                if size >= 1 << 20:
                    written += self._write_all(fd, b"".join(chunk))
                    chunk, size = [], 0
            written += self._write_all(fd, b"".join(chunk))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        self._fsync_dir()
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._path, self.bytes_written, self._dirty = fd, path, written, False
        self.snapshot_bytes = written
        for old in files:
            old.unlink(missing_ok=True)
        self._fsync_dir()

    @staticmethod
    def _write_all(fd: int, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return len(data)

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, frame: bytes) -> None:
        """Write one frame now (before the caller acknowledges what it records).

        Raises:
            RuntimeError: the journal was not started.
            OSError: the write failed (disk full...): the caller must not acknowledge.
        """
        if self._fd is None:
            raise RuntimeError("the state journal is not started")
        self._write_all(self._fd, frame)
        self.bytes_written += len(frame)
        if self.fsync_interval_s == 0:
            os.fsync(self._fd)
        else:
            self._dirty = True

    @property
    def needs_compaction(self) -> bool:
        """Whether the current file is past ``compact_bytes`` and at least twice the size of
        the snapshot it started with. The second rule stops a live state larger than
        ``compact_bytes`` (many retained records) from being rewritten on every check: each
        compaction must at least halve the file (Redis's AOF rewrite uses the same growth rule)."""
        return self.bytes_written > max(self.compact_bytes, 2 * self.snapshot_bytes)

    def fsync(self) -> None:
        """Flush the current file to stable storage if anything was written since the last
        fsync (run it in a thread: it blocks for the disk)."""
        if self._fd is not None and self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    def close(self) -> None:
        """Fsync and close the current file (the journal stays for the next start)."""
        if self._fd is not None:
            self._dirty = True
            self.fsync()
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ frames

    @staticmethod
    def session_frame(session_id: str, token_hash: bytes, opened_at: float) -> bytes:
        """A ``mux`` session opened (its resume token's SHA-256, never the token)."""
        return _frame(orjson.dumps(["S", session_id, token_hash.hex(), opened_at]))

    @staticmethod
    def closed_frame(session_id: str) -> bytes:
        """A session closed or expired."""
        return _frame(orjson.dumps(["X", session_id]))

    @staticmethod
    def episode_frame(session_id: str | None, episode_id: str, problem_id: str, max_rounds: int, mode: str,
                      circular_stop: bool, max_action_chars: int, started_at: float) -> bytes:
        """An episode started (what rebuilding it needs)."""
        return _frame(orjson.dumps(["R", session_id, episode_id, problem_id, max_rounds, mode, circular_stop,
                                    max_action_chars, started_at]))

    @staticmethod
    def action_frame(episode_id: str, t: int, role: str, content: str) -> bytes:
        """Turn ``t`` of an episode accepted with this role and content."""
        return _frame(orjson.dumps(["A", episode_id, t, role, content]))

    @staticmethod
    def grade_frame(episode_id: str, t: int, grade: Grade) -> bytes:
        """A grading worker's grade of turn ``t``."""
        return _frame(orjson.dumps(["G", episode_id, t, *_grade_data(grade)]))

    @staticmethod
    def record_frame(episode_id: str, graded_at: float, record_json: bytes) -> bytes:
        """An episode's graded record, byte for byte (``graded_at`` in Unix seconds)."""
        return _frame(orjson.dumps(["D", episode_id, graded_at]) + b"\n" + record_json)

    @staticmethod
    def abandoned_frame(episode_id: str) -> bytes:
        """An unfinished episode abandoned (its session reset or closed)."""
        return _frame(orjson.dumps(["Q", episode_id]))

    @staticmethod
    def time_frame(now: float) -> bytes:
        """A clock mark (Unix seconds), so recovery knows when the server last wrote."""
        return _frame(orjson.dumps(["T", now]))
