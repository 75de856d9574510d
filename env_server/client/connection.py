"""``MuxClient``: the asyncio client of ``/ws/mux``, one connection carrying many sessions.

One connection carries many sessions::

    async with MuxClient("ws://localhost:8000") as client:
        session = await client.open_session()
        result = await session.reset(seed=3)
        result = await session.step("solver", "... \\\\boxed{42}")
        ...
        record = await session.rewards()          # the delayed-reward record (EpisodeRewards)

When the connection goes away (a server restart, a cut network), the client reconnects on its
own with exponential backoff and jitter, re-attaches every session with its resume token and
re-sends the requests that were waiting for a reply; callers only see a slower reply. Re-sending
is safe: every step carries its turn index ``t`` (RFC 0004, "Re-sent steps": a step already taken
answers with its stored reply and acts no second time), a reset carries an ``episode_id`` the
client chose (a reset that already happened is recognised and its observation replayed), and
``state``/``rewards``/``ping`` only read. Rewards graded meanwhile are pushed on re-attachment;
each episode's record is kept once. A session whose re-attach is refused is lost: its calls raise
:class:`SessionLostError` with the refusal's code (``UNKNOWN_SESSION``: restarted without
``--state-dir``, or past its resume window; ``RESUME_DENIED``; ``CAPACITY_REACHED``: the server
came back with a lower per-connection limit); the other sessions go on. The whole reconnect,
re-attach included, is bounded by ``reconnect_budget_s``; a connection lost again while it runs
starts another.
``reconnect=False`` restores the plain behaviour (``ConnectionError``; ``await
client.reconnect()`` re-attaches by hand).

By default the client batches (RFC 0005): every request made during one event-loop iteration
(e.g. the steps of a whole GRPO group issued with ``asyncio.gather``) goes out in one WebSocket
message, and the server answers with arrays of frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import os
import random
from typing import Any, Literal, TypeVar

import orjson
import websockets

from env_server.client.session import (
    DEFAULT_RECONNECT_BUDGET_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    MuxError,
    MuxSession,
    SessionLostError,
)
from env_server.protocol.models import MAX_BATCH_FRAMES

__all__ = ["ConnectionState", "MuxClient"]


class ConnectionState(enum.Enum):
    """The states of a :class:`MuxClient`'s connection (as Starlette names a WebSocket's)."""

    DISCONNECTED = "disconnected"
    """No connection yet, or closed by :meth:`MuxClient.close`."""
    CONNECTED = "connected"
    """The socket is open and its read loop runs."""
    RECONNECTING = "reconnecting"
    """The connection was lost; a background task reconnects, re-attaches and re-sends."""
    CLOSING = "closing"
    """:meth:`MuxClient.close` (or ``drop``) is failing pending requests and closing the socket."""

T = TypeVar("T")
log = logging.getLogger(__name__)

class MuxClient:
    """One ``/ws/mux`` connection carrying many sessions.

    Args:
        base_url: ``http(s)://`` or ``ws(s)://`` address of the server (``/ws/mux`` appended).
        token: bearer token, if the server requires one.
        request_timeout_s: how long a request waits for its reply before ``TimeoutError``.
        max_frame_bytes: largest message accepted from the server.
        batch: batch frames both ways (RFC 0005, ``?batch=1``); ``False`` sends and receives
            one frame per message.
        max_batch_bytes: a batch is sent as soon as it holds this many bytes; keep it at or
            below the server's ``--max-frame-bytes`` (default 1 MiB), which limits a message.
        reconnect: reconnect on its own when the connection goes away (module docstring);
            ``False``: pending requests fail with ``ConnectionError``.
        reconnect_budget_s: how long to keep trying before pending requests fail with
            ``ConnectionError``; tries start 50 ms apart and double up to 2 s, each with up to
            100% random jitter.
        compression: ``None`` (default): no per-message compression; ``"deflate"``: ask for
            permessage-deflate (RFC 7692), for a slow link. Compressing every message cost the
            server about 1.6x its CPU per step (35.0 against 21.3 us, 1,000 sessions;
            ``benchmarks/README.md``), more than a LAN's bandwidth saves.
    """

    def __init__(self, base_url: str, token: str | None = None, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20, batch: bool = True, max_batch_bytes: int = 512 << 10,
                 reconnect: bool = True, reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S,
                 compression: Literal["deflate"] | None = None) -> None:
        url = base_url.rstrip("/")
        url = url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        self.url = url if url.endswith("/ws/mux") else url + "/ws/mux"
        if batch:
            self.url += "?batch=1"
        self.token = token
        self.request_timeout_s = request_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.batch = batch
        self.max_batch_bytes = max_batch_bytes
        self.compression = compression
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._sends: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._sessions: dict[str, MuxSession] = {}
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self.reconnect_enabled = reconnect
        self.reconnect_budget_s = reconnect_budget_s
        #: reconnections done on the client's own (for logs and tests)
        self.reconnects = 0
        #: request id -> its encoded frame, while waiting for a reply (re-sent after a reconnect)
        self._frames: dict[int, bytes] = {}
        self._recovery: asyncio.Task[None] | None = None
        self._closing = False
        self._connecting = asyncio.Lock()

    @property
    def sessions(self) -> list[MuxSession]:
        return list(self._sessions.values())

    @property
    def connected(self) -> bool:
        """Whether the connection is up (``False`` while reconnecting)."""
        return self.state is ConnectionState.CONNECTED

    @property
    def reconnecting(self) -> bool:
        """Whether the client is reconnecting after a lost connection."""
        return self.state is ConnectionState.RECONNECTING

    @property
    def state(self) -> ConnectionState:
        """Where the connection stands, read off the socket, the reconnect task and the
        closing flag (the one place that combines them)."""
        if self._closing:
            return ConnectionState.CLOSING
        if self._recovery is not None:
            return ConnectionState.RECONNECTING
        if self._ws is None:
            return ConnectionState.DISCONNECTED
        return ConnectionState.CONNECTED

    async def connect(self) -> MuxClient:
        """Open the connection (idempotent; while reconnecting, wait for it)."""
        if self._recovery is not None and self._recovery is not asyncio.current_task():
            await asyncio.shield(self._recovery)
        if self._ws is None:
            async with self._connecting:  # concurrent first requests open one connection
                if self._ws is None:
                    await self._open_socket()
        return self

    async def _open_socket(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        self._ws = await websockets.connect(self.url, additional_headers=headers, max_size=self.max_frame_bytes,
                                            compression=self.compression, ping_interval=20, ping_timeout=60,
                                            open_timeout=10)
        self._reader = asyncio.create_task(self._read_loop())

    async def __aenter__(self) -> MuxClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (sessions stay on the server for the resume window)."""
        await self._shut(abrupt=False)

    async def drop(self, reconnect: bool = False) -> None:
        """Lose the connection abruptly, as a crashed process or a cut network does: the TCP
        transport is aborted with no WebSocket close frame (the server sees an unclean
        disconnect, code 1006). Sessions stay on the server for the resume window; pending
        requests fail with ``ConnectionError`` and the client does not reconnect on its own
        (``reconnect=True`` here: it does, as after any lost connection). For tests of
        resumption."""
        if reconnect:
            if self._ws is not None:
                self._ws.transport.abort()
            return
        await self._shut(abrupt=True)

    async def _shut(self, abrupt: bool) -> None:
        """Stop any reconnect, fail the pending requests with ``ConnectionError``, and close
        the connection (``abrupt``: abort the transport, no close frame)."""
        self._closing = True
        try:
            if self._recovery is not None and self._recovery is not asyncio.current_task():
                self._recovery.cancel()
                await asyncio.gather(self._recovery, return_exceptions=True)
                self._recovery = None
            self._fail_pending(ConnectionError("connection to the env server " + ("dropped" if abrupt else "closed")))
            self._outbox, self._outbox_bytes = [], 0
            if self._ws is not None:
                if abrupt:
                    self._ws.transport.abort()
                else:
                    await self._ws.close()
            if self._reader is not None:
                await asyncio.gather(self._reader, return_exceptions=True)
            self._ws = None
            self._reader = None
        finally:
            self._closing = False

    async def reconnect(self) -> None:
        """Open a new connection and re-attach every known session with its resume token
        (sessions the server no longer knows are marked lost: :class:`SessionLostError`)."""
        await self.close()
        await self.connect()
        await self._reattach()

    async def _reattach(self) -> None:
        async def attach(session: MuxSession) -> None:
            try:
                await self.request({"type": "attach", "session_id": session.session_id,
                                    "data": {"resume_token": session.resume_token}}, resend=False, wait=False)
            except MuxError as exc:
                # Any refusal loses the session on this connection: UNKNOWN_SESSION (restarted
                # without state, or past the window), RESUME_DENIED, or CAPACITY_REACHED (the
                # server came back with a lower per-connection limit). Raising instead would
                # end the reconnect and leave every waiting request hanging.
                session.lost = SessionLostError({**exc.data, "message": f"session lost: {exc.data.get('message')}"})

        await asyncio.gather(*(attach(s) for s in list(self._sessions.values()) if s.lost is None))

    def _connection_lost(self) -> None:
        """The read loop ended without ``close``: reconnect in the background."""
        if self._recovery is None:
            self._recovery = asyncio.ensure_future(self._recover())

    async def _recover(self) -> None:
        """Reconnect with backoff, re-attach, re-send every request still waiting; after
        ``reconnect_budget_s`` without success, fail them with ``ConnectionError``.

        The backoff (50 ms doubling to 2 s, full jitter) is a loop of our own rather than
        tenacity's ``AsyncRetrying``: one budget bounds the connect and the re-attach together
        (the attach's own timeout is what is left of it), a failure past the budget must fail
        every pending request rather than raise, and the loop is as short as the retry object
        that would replace it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_budget_s
        delay = 0.05
        self._ws, self._reader = None, None
        self._outbox, self._outbox_bytes = [], 0
        recovered = False
        try:
            while True:
                try:
                    await self._open_socket()
                    # a server that takes the connection but never answers the attaches must
                    # not hold the requests past the budget
                    await asyncio.wait_for(self._reattach(), max(0.0, deadline - loop.time()))
                    break
                except (OSError, asyncio.TimeoutError, websockets.WebSocketException, ConnectionError) as exc:
                    if self._ws is not None:
                        self._ws.transport.abort()
                        self._ws = None
                    if loop.time() + delay > deadline:
                        log.warning("could not reconnect to %s within %.0fs: %s", self.url, self.reconnect_budget_s, exc)
                        self._fail_pending(ConnectionError(f"connection to the env server lost: {exc}"))
                        return
                    await asyncio.sleep(delay * (1 + random.random()))
                    delay = min(2 * delay, 2.0)
            self.reconnects += 1
            log.info("reconnected to %s; re-sending %d requests", self.url, len(self._frames))
            for request_id, encoded in list(self._frames.items()):
                session = self._sessions.get(orjson.loads(encoded).get("session_id") or "")
                future = self._pending.get(request_id)
                if future is None or future.done():
                    continue
                if session is not None and session.lost is not None:
                    future.set_exception(session.lost)
                elif self.batch:
                    self._enqueue(encoded)
                else:
                    assert self._ws is not None
                    with contextlib.suppress(websockets.ConnectionClosed):  # handled below
                        await self._ws.send(encoded.decode())
            recovered = True
        finally:
            self._recovery = None
        if recovered and self._read_loop_ended() and not self._closing:
            # the new connection died while this reconnect was still re-attaching or
            # re-sending: its read loop saw a reconnect in progress and left it to us
            self._connection_lost()

    def _read_loop_ended(self) -> bool:
        """Whether the current connection's read loop has ended (the connection is gone)."""
        return self._reader is not None and self._reader.done()

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)

    async def open_session(self) -> MuxSession:
        """Open a new session. Raises :class:`MuxError` (``CAPACITY_REACHED``) at a limit.

        The ``open`` carries a fresh ``open_id`` (128 random bits), so when it is re-sent after
        a reconnect the server answers with the session the first one opened, if it did
        (RFC 0001, "Re-sent opens"), instead of leaving that one orphaned."""
        frame, _ = await self.request({"type": "open", "data": {"open_id": os.urandom(16).hex()}})
        session = MuxSession(self, frame["data"]["session_id"], frame["data"]["resume_token"])
        self._sessions[session.session_id] = session
        return session

    async def attach(self, session_id: str, resume_token: str) -> MuxSession:
        """Re-attach a session opened elsewhere (e.g. by a process that died)."""
        await self.request({"type": "attach", "session_id": session_id, "data": {"resume_token": resume_token}})
        session = self._sessions.get(session_id) or MuxSession(self, session_id, resume_token)
        self._sessions[session_id] = session
        return session

    async def ping(self) -> float:
        """Round trip to the server, seconds."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self.request({"type": "ping", "data": {}})
        return loop.time() - start

    async def send_raw(self, text: str | bytes) -> None:
        """Send an arbitrary frame (for protocol tests); replies arrive via ``_pending``."""
        await self.connect()
        await self._ws.send(text)

    def adopt_session(self, session: MuxSession) -> None:
        """Track a session this connection was given (a ``fork``'s): re-attached after a reconnect."""
        self._sessions[session.session_id] = session

    def forget_session(self, session_id: str) -> None:
        """Stop tracking a closed session (it is not re-attached after a reconnect)."""
        self._sessions.pop(session_id, None)

    async def request(self, frame: dict[str, Any], resend: bool = True,
                      wait: bool = True) -> tuple[dict[str, Any], bytes]:
        """Send ``frame`` with a fresh request id and return the reply (frame, raw bytes).
        ``resend``: re-send it after a reconnect; ``wait``: wait for a reconnect in progress
        first (``False`` only for the re-attachment the reconnect itself sends)."""
        if wait:
            await self.connect()
        request_id = next(self._ids)
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        encoded = orjson.dumps({**frame, "request_id": request_id})
        if resend and self.reconnect_enabled:
            self._frames[request_id] = encoded
        try:
            if self.batch:
                self._enqueue(encoded)
            else:
                await self._ws.send(encoded.decode())
            reply, raw = await asyncio.wait_for(future, self.request_timeout_s)
        finally:
            self._pending.pop(request_id, None)
            self._frames.pop(request_id, None)
        if reply["type"] == "error":
            raise MuxError(reply["data"])
        return reply, raw

    def _enqueue(self, encoded: bytes) -> None:
        """Add a frame to the outgoing batch; it is sent at the end of this event-loop
        iteration, or at once when the batch is full (``max_batch_bytes`` or
        ``MAX_BATCH_FRAMES`` frames, the server's limit)."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(encoded)
        self._outbox_bytes += len(encoded)
        if self._outbox_bytes >= self.max_batch_bytes or len(self._outbox) >= MAX_BATCH_FRAMES:
            self._flush()

    def _flush(self) -> None:
        if not self._outbox or self._ws is None:  # no connection: a reconnect re-sends them
            return
        message = (b"[" + b",".join(self._outbox) + b"]").decode()
        self._outbox, self._outbox_bytes = [], 0
        # Tasks start in creation order, so batches go out in order; a failed send surfaces
        # as the ConnectionError the read loop gives every pending request.
        task = asyncio.ensure_future(self._ws.send(message))
        self._sends.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sends.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the read loop reports the lost connection

    async def _read_loop(self) -> None:
        ws = self._ws
        try:
            async for message in ws:
                decoded = orjson.loads(message)
                if isinstance(decoded, list):
                    # a batch (RFC 0005): each frame's bytes are re-encoded with orjson, which
                    # reproduces the server's (also orjson) encoding byte for byte
                    for frame in decoded:
                        self._on_frame(frame, orjson.dumps(frame))
                else:
                    self._on_frame(decoded, message.encode() if isinstance(message, str) else message)
        except websockets.ConnectionClosed:
            pass
        finally:
            lost = ConnectionError("connection to the env server closed")
            if self._recovery is not None:  # a reconnect attempt failed: its attach requests fail
                for request_id, future in self._pending.items():
                    if request_id not in self._frames and not future.done():
                        future.set_exception(lost)
            elif self._ws is ws and self.reconnect_enabled and not self._closing:
                self._connection_lost()  # pending requests wait, and are re-sent
            elif self._ws is ws or self._closing:
                self._fail_pending(lost)

    def _on_frame(self, frame: dict[str, Any], raw: bytes) -> None:
        request_id = frame.get("request_id")
        future = self._pending.get(request_id) if request_id is not None else None
        if future is not None and not future.done():
            future.set_result((frame, raw))
        else:
            self._dispatch_push(frame)

    def _dispatch_push(self, frame: dict[str, Any]) -> None:
        session = self._sessions.get(frame.get("session_id") or "")
        if session is None:
            return
        if frame["type"] == "rewards":
            session._on_rewards(frame["data"])
        elif frame["type"] == "session_closed":
            session.closed_reason = frame["data"].get("reason")
