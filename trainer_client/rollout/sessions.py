"""The env sessions a training process opened, written down so that they are closed: by the
process itself when training ends, or, when it died, by the run that resumes it.

A session outlives its connection on the server for the server's resume window (60 s by
default), waiting for its client to re-attach, and the episode it was playing stays open that
long. A trainer killed in the middle of a step leaves one such session per environment. The
ledger (one JSON line per session opened and per session closed: replica URL, session id,
resume token) lets the resumed run re-attach each session left open with its resume token and
close it at once (the server then drops the episode it was playing), instead of leaving them
to the window.

The file holds resume tokens (a session's credential on the server): it is created with mode
0600 and lives in the run's output directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from env_server.client import MuxClient, MuxError, SyncMuxSession
from env_server.jsonio import read_jsonl

__all__ = ["SessionLedger"]

log = logging.getLogger(__name__)


class SessionLedger:
    """The sessions of one training process, in an append-only JSON-lines file.

    Args:
        path: the ledger file (created, mode 0600); a file left by an earlier process is kept
            (its sessions still open are what :meth:`close_left_open` closes).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        #: this process's open sessions, by id (closed through their own connection)
        self._live: dict[str, SyncMuxSession] = {}
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))

    def _append(self, line: dict[str, Any]) -> None:
        # one write(2) per line, before the session is used: a process killed at any point
        # leaves every session it used in the file (a torn last line is skipped when read)
        with self._lock, self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")

    def opened(self, url: str, session: SyncMuxSession) -> None:
        """Record a session this process opened on the replica at ``url``."""
        self._append({"event": "open", "url": url, "session_id": session.session_id,
                      "resume_token": session.session.resume_token})
        with self._lock:
            self._live[session.session_id] = session

    def closed(self, session_id: str) -> None:
        """Record that a session is closed (or gone from its server)."""
        self._append({"event": "close", "session_id": session_id})
        with self._lock:
            self._live.pop(session_id, None)

    def open_sessions(self) -> list[dict[str, str]]:
        """The sessions recorded as opened and not as closed: ``{"url", "session_id",
        "resume_token"}`` each, in the order they were opened."""
        sessions: dict[str, dict[str, str]] = {}
        for _, line in read_jsonl(self.path, on_bad_line=lambda error: None):  # a line torn by a kill: skipped
            if line.get("event") == "open":
                sessions[line["session_id"]] = {k: line[k] for k in ("url", "session_id", "resume_token")}
            elif line.get("event") == "close":
                sessions.pop(line["session_id"], None)
        return list(sessions.values())

    def close_own(self) -> int:
        """Close every session this process opened and still holds, through its own connection
        (at the end of training). Returns how many were closed; a failure is logged, and the
        session stays in the ledger for a later :meth:`close_left_open`."""
        with self._lock:
            live = list(self._live.values())
        closed = 0
        for session in live:
            try:
                session.close()
            except (MuxError, ConnectionError, TimeoutError, OSError) as exc:
                log.warning("env session %s not closed: %s", session.session_id, exc)
                continue
            self.closed(session.session_id)
            closed += 1
        return closed

    def close_left_open(self, token: str | None = None, timeout_s: float = 30.0) -> tuple[int, int]:
        """Close the sessions an earlier process left open (it died): each is re-attached with
        its resume token on a connection of its own and closed, so its episode in flight ends
        now rather than when the server's resume window runs out. Call before this process
        opens sessions of its own.

        Never raises for a server that cannot be reached or is slow: the sessions it kept end
        with its resume window (logged); the ledger marks them all closed.

        Returns:
            ``(closed, gone)``: sessions closed here, and sessions the server no longer had
            (re-attach or close refused: past the resume window, or a server restarted without
            state); ``(0, 0)`` when the whole clean-up timed out.
        """
        left = self.open_sessions()
        if not left:
            return 0, 0
        try:
            closed, gone = asyncio.run(asyncio.wait_for(_close_sessions(left, token), timeout_s))
        except TimeoutError:  # best effort: what was not closed ends with the server's resume window
            log.warning("closing %d env session(s) left open took over %.0f s; the rest end with the server's "
                        "resume window", len(left), timeout_s)
            closed, gone = 0, 0
        for session in left:
            self.closed(session["session_id"])
        return closed, gone


async def _close_sessions(sessions: list[dict[str, str]], token: str | None) -> tuple[int, int]:
    """Re-attach and close ``sessions`` (one connection per replica URL)."""
    closed = gone = 0
    by_url: dict[str, list[dict[str, str]]] = {}
    for session in sessions:
        by_url.setdefault(session["url"], []).append(session)
    for url, group in by_url.items():
        try:
            async with MuxClient(url, token, reconnect=False) as client:
                for session in group:
                    try:
                        attached = await client.attach(session["session_id"], session["resume_token"])
                    except MuxError as exc:  # UNKNOWN_SESSION, RESUME_DENIED: nothing left to close
                        log.info("env session %s on %s is gone already (%s)", session["session_id"], url, exc.code)
                        gone += 1
                        continue
                    try:
                        await attached.close()
                    except MuxError as exc:  # closed by the server meanwhile: nothing left to close
                        log.info("env session %s on %s could not be closed (%s)", session["session_id"], url, exc.code)
                        gone += 1
                        continue
                    closed += 1
        except (OSError, ConnectionError, TimeoutError) as exc:
            log.warning("could not reach %s to close %d session(s) left open: %s (they end with its resume "
                        "window)", url, len(group), exc)
    return closed, gone
