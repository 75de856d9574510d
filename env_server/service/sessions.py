"""Sessions: ids, resume tokens, ownership by connection, limits, resume windows, idle reaping.

A session is a slot that plays successive episodes (each ``reset`` starts one). Kinds:

- ``mux``: opened on ``/ws/mux``; survives a dropped connection for ``resume_window_s`` and
  can be re-attached from another connection with its resume token;
- ``ws``: the one session of an OpenEnv ``/ws`` connection; dies with the connection;
- ``http``: created by ``POST /reset``; reaped when idle.

A connection can only touch sessions it opened or re-attached.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Iterator
from typing import Literal, Protocol

from env_server.protocol.errors import CapacityError, ResumeDeniedError, UnknownSessionError
from env_server.service.episodes import EpisodeEntry

__all__ = ["Connection", "Session", "SessionKind", "SessionRegistry", "token_digest"]

SessionKind = Literal["mux", "ws", "http"]


def token_digest(token: str) -> bytes:
    """The SHA-256 of a resume token (32 bytes): what the server keeps and journals."""
    return hashlib.sha256(token.encode()).digest()


class Connection(Protocol):
    """A transport connection that owns sessions, as the registry and the service see it.

    The service tells a connection what happened to its sessions through these calls; the
    transport decides what goes on the wire (``/ws/mux`` pushes frames, OpenEnv's ``/ws`` has
    nowhere to push and ignores them). Neither call may block or raise.
    """

    connection_id: str
    session_ids: set[str]

    def rewards_ready(self, session_id: str, body: bytes) -> None:
        """A graded record of ``session_id`` is ready; ``body`` is the ``RewardsStatus`` JSON
        (``payloads.rewards_body``)."""

    def session_closed(self, session_id: str, reason: str) -> None:
        """The server closed ``session_id`` (``"resume_window_expired"``, ``"idle_timeout"``)."""


class Session:
    """One session. ``entry`` is the current (or last) episode, ``None`` before the first reset."""

    __slots__ = ("created_at", "detached_at", "entry", "kind", "last_active", "owner", "session_id", "token_hash")

    def __init__(self, kind: SessionKind, owner: Connection | None, session_id: str | None = None,
                 token_hash: bytes = b"") -> None:
        self.session_id = session_id or os.urandom(16).hex()  # 128 random bits, as uuid4 (cheaper)
        #: SHA-256 of the resume token (``mux`` only; the token itself is handed out once)
        self.token_hash = token_hash
        self.kind: SessionKind = kind
        self.owner = owner
        self.entry: EpisodeEntry | None = None
        self.created_at = self.last_active = time.monotonic()
        self.detached_at: float | None = None

    def touch(self) -> None:
        """Record activity now (the idle timeout counts from the last touch)."""
        self.last_active = time.monotonic()


class SessionRegistry:
    """All sessions of the server.

    Args:
        max_sessions: server-wide limit, all kinds together.
        max_per_connection: limit per owning connection.
        resume_window_s: how long a detached ``mux`` session waits for re-attachment.
        idle_timeout_s: inactivity after which any session is reaped.
    """

    def __init__(self, max_sessions: int, max_per_connection: int, resume_window_s: float, idle_timeout_s: float) -> None:
        self.max_sessions = max_sessions
        self.max_per_connection = max_per_connection
        self.resume_window_s = resume_window_s
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, Session] = {}
        #: ``open_id`` -> (session id, resume token, monotonic deadline): what a re-sent ``open``
        #: gets back (the token is held in memory for ``resume_window_s`` only, never journaled)
        self._opened: dict[str, tuple[str, str, float]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def open(self, kind: SessionKind, owner: Connection | None = None,
             open_id: str | None = None) -> tuple[Session, str, bool]:
        """Create a session owned by ``owner``. Returns it, its resume token (``mux``: 32
        URL-safe random characters, handed out only here; other kinds: ``""``) and whether it
        is an earlier ``open``'s session.

        ``open_id`` (``mux`` only): the client's nonce for this ``open``. An ``open`` re-sent
        with the same ``open_id`` while that session lives, within ``resume_window_s`` of the
        first, gets the same session and token, moved to ``owner`` as :meth:`attach` moves it:
        a client that lost the reply to its ``open`` in a dropped connection does not leave an
        orphan session behind.

        Raises:
            CapacityError: the server-wide or the per-connection limit is reached.
        """
        if open_id is not None and kind == "mux":
            earlier = self._opened.get(open_id)
            if earlier is not None and earlier[0] in self._sessions and time.monotonic() <= earlier[2]:
                session_id, token, _ = earlier
                session = self.attach(session_id, token, owner) if owner is not None else self._sessions[session_id]
                return session, token, True
        if len(self._sessions) >= self.max_sessions:
            raise CapacityError(
                f"Server at capacity: {len(self._sessions)}/{self.max_sessions} sessions active.",
                active_sessions=len(self._sessions), max_sessions=self.max_sessions, scope="server",
            )
        if owner is not None and len(owner.session_ids) >= self.max_per_connection:
            raise CapacityError(
                f"Connection at capacity: {len(owner.session_ids)}/{self.max_per_connection} sessions.",
                active_sessions=len(owner.session_ids), max_sessions=self.max_per_connection, scope="connection",
            )
        token = secrets.token_urlsafe(24) if kind == "mux" else ""
        session = Session(kind, owner, token_hash=token_digest(token) if token else b"")
        self._sessions[session.session_id] = session
        if owner is not None:
            owner.session_ids.add(session.session_id)
        if open_id is not None and kind == "mux":
            self._opened[open_id] = (session.session_id, token, time.monotonic() + self.resume_window_s)
        return session, token, False

    def restore(self, session_id: str, token_hash: bytes) -> Session:
        """Add a ``mux`` session recovered from the state journal, detached: it waits
        ``resume_window_s`` from now for its client to re-attach with its resume token."""
        session = Session("mux", None, session_id, token_hash)
        session.detached_at = time.monotonic()
        self._sessions[session_id] = session
        return session

    def get(self, session_id: str, owner: Connection | None = None) -> Session:
        """The session ``session_id`` as seen by ``owner``.

        Raises:
            UnknownSessionError: no such session, or it is not attached to ``owner``.
        """
        session = self._sessions.get(session_id)
        if session is None or (owner is not None and session.owner is not owner):
            raise UnknownSessionError(
                f"no session {session_id!r} on this connection (open one, or re-attach with its resume token)",
                session_id=session_id,
            )
        return session

    def find(self, session_id: str) -> Session | None:
        """The session ``session_id`` whoever owns it, or ``None``."""
        return self._sessions.get(session_id)

    def attach(self, session_id: str, resume_token: str, owner: Connection) -> Session:
        """Re-attach a ``mux`` session to ``owner`` (taking it from any previous connection).

        Raises:
            UnknownSessionError: no such session (never opened, closed, or past its window).
            ResumeDeniedError: wrong token or not a resumable session.
            CapacityError: ``owner`` already holds ``max_per_connection`` sessions.
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"no session {session_id!r} (closed or past its resume window)", session_id=session_id)
        if session.kind != "mux" or not hmac.compare_digest(session.token_hash, token_digest(resume_token)):
            raise ResumeDeniedError(f"resume token does not match session {session_id!r}", session_id=session_id)
        if session.owner is owner:
            return session
        if len(owner.session_ids) >= self.max_per_connection:
            raise CapacityError(
                f"Connection at capacity: {len(owner.session_ids)}/{self.max_per_connection} sessions.",
                active_sessions=len(owner.session_ids), max_sessions=self.max_per_connection, scope="connection",
            )
        if session.owner is not None:
            session.owner.session_ids.discard(session_id)
        session.owner = owner
        session.detached_at = None
        owner.session_ids.add(session_id)
        session.touch()
        return session

    def detach(self, owner: Connection) -> list[Session]:
        """The connection ``owner`` is gone: its ``mux`` sessions wait for re-attachment, the
        rest are removed. Returns the removed sessions (the caller abandons their episodes)."""
        removed = []
        now = time.monotonic()
        for session_id in list(owner.session_ids):
            session = self._sessions.get(session_id)
            if session is None or session.owner is not owner:
                continue
            session.owner = None
            if session.kind == "mux" and self.resume_window_s > 0:
                session.detached_at = now
            else:
                removed.append(self.remove(session_id))
        owner.session_ids.clear()
        return removed

    def remove(self, session_id: str) -> Session:
        """Remove a session (close, expiry). Raises KeyError if absent."""
        session = self._sessions.pop(session_id)
        if session.owner is not None:
            session.owner.session_ids.discard(session_id)
        return session

    def expired(self, now: float | None = None) -> list[tuple[Session, str]]:
        """Remove and return sessions past their resume window or idle timeout, each with the
        reason (``"resume_window_expired"`` or ``"idle_timeout"``)."""
        now = time.monotonic() if now is None else now
        for open_id in [key for key, (_, _, deadline) in self._opened.items() if deadline < now]:
            del self._opened[open_id]
        out = []
        for session in list(self._sessions.values()):
            if session.detached_at is not None and now - session.detached_at > self.resume_window_s:
                out.append((self.remove(session.session_id), "resume_window_expired"))
            elif now - session.last_active > self.idle_timeout_s:
                out.append((self.remove(session.session_id), "idle_timeout"))
        return out
