"""Typed clients for ``/ws/mux``: an asyncio multiplexed client and a synchronous wrapper.

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
import itertools
import logging
import os
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import websockets

from env_server.models import MAX_BATCH_FRAMES, DebateObservation, EpisodeMode, EpisodeRewards, Role

__all__ = [
    "DEFAULT_RECONNECT_BUDGET_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_REWARDS_TIMEOUT_S",
    "GRADED_EPISODE_WAIT_S",
    "LoopThread",
    "MuxClient", "MuxError", "MuxSession", "SessionLostError", "StepResult", "SyncMuxClient", "SyncMuxSession"]

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_RECONNECT_BUDGET_S = 120.0
"""How long a client keeps trying to reconnect after losing its connection, seconds."""

DEFAULT_REQUEST_TIMEOUT_S = 120.0
"""How long a request waits for its reply before ``TimeoutError``, seconds."""
DEFAULT_REWARDS_TIMEOUT_S = 60.0
"""How long ``rewards(wait=True)`` waits for grading before answering ``None``, seconds."""
GRADED_EPISODE_WAIT_S = 120.0
"""How long a player that needs every record (the scripted player, the trainer's environment)
waits for an episode's grading before giving up on it, seconds."""


class MuxError(Exception):
    """An error frame from the server.

    Attributes:
        code: the error code (e.g. ``INVALID_ACTION``).
        data: the whole ``data`` of the error frame (``error_kind`` etc.).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(f"{data.get('code')}: {data.get('message')}")
        self.code: str = data.get("code", "")
        self.data = data


class SessionLostError(MuxError):
    """The session is gone from the server (it restarted without ``--state-dir``, or the
    session outlived its resume window): open a new one. ``code`` is the refusal of the
    re-attachment (``UNKNOWN_SESSION`` or ``RESUME_DENIED``)."""


@dataclass
class StepResult:
    """An observation as returned by ``reset``/``step``.

    Attributes:
        observation: the parsed observation.
        reward: the reward on the wire (``None`` on ``/ws/mux``: rewards are delayed).
        done: whether the debate is over.
        metadata: the markers (``error_kind``, ``hint_template_key``, ...).
        raw: the payload exactly as received (bytes), e.g. to compare with ``state(t)``.
    """

    observation: DebateObservation
    reward: float | None
    done: bool
    metadata: dict[str, Any]
    raw: bytes = field(repr=False, default=b"")

    @classmethod
    def from_payload(cls, payload: dict[str, Any], raw: bytes = b"") -> StepResult:
        obs = DebateObservation.model_validate(
            {**payload["observation"], "reward": payload.get("reward"), "done": payload.get("done", False),
             "metadata": payload.get("metadata", {})}
        )
        return cls(obs, payload.get("reward"), payload.get("done", False), payload.get("metadata", {}), raw)


def _payload_bytes(frame_text: str | bytes) -> bytes:
    """The raw bytes of a frame's ``data`` value (frames end with ``"data":<payload>}``)."""
    raw = frame_text.encode() if isinstance(frame_text, str) else frame_text
    start = raw.index(b'"data":') + len(b'"data":')
    return raw[start:-1]


class MuxSession:
    """A session on a :class:`MuxClient`. Create with ``client.open_session()``."""

    def __init__(self, client: MuxClient, session_id: str, resume_token: str) -> None:
        self.client = client
        self.session_id = session_id
        self.resume_token = resume_token
        self.episode_id: str | None = None
        self.closed_reason: str | None = None
        #: the turn the next step takes (the last observation's ``t``); sent with every step
        self.next_t = 0
        #: set when the session is gone from the server (:class:`SessionLostError`)
        self.lost: SessionLostError | None = None
        self._records: dict[str, EpisodeRewards] = {}

    async def _call(self, type_: str, data: dict[str, Any] | None = None) -> tuple[dict[str, Any], bytes]:
        if self.lost is not None:
            raise self.lost
        try:
            return await self.client._request({"type": type_, "session_id": self.session_id, "data": data or {}})
        except MuxError as exc:
            lost = self._lost_error()  # (a method: set by the reconnect while this request waited)
            if lost is not None and exc.code == "UNKNOWN_SESSION":
                raise lost from None
            raise

    def _lost_error(self) -> SessionLostError | None:
        return self.lost

    async def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
                    max_rounds: int | None = None, mode: EpisodeMode | str | None = None) -> StepResult:
        """Start an episode (see ``ResetRequest``); ``None`` arguments are left to the server.

        Args:
            seed, episode_id, problem_id, max_rounds: as ``ResetRequest``.
            mode: ``"debate"`` or ``"single"`` (RFC 0006); default: the server's ``--mode``.

        With the client's ``reconnect`` on and no ``episode_id`` given, the client picks one
        (128 random bits), so a reset re-sent after a lost connection is recognised.

        Raises:
            MuxError: the server refused (``VALIDATION_ERROR`` for an unknown mode or an
                out-of-range value, ``UNKNOWN_PROBLEM``, ``EPISODE_ID_IN_USE``, ...).
            SessionLostError: the session is gone from the server.
        """
        if isinstance(mode, EpisodeMode):
            mode = mode.value
        chosen = episode_id is None and self.client.reconnect_enabled
        if chosen:
            episode_id = os.urandom(16).hex()
        data = {k: v for k, v in {"seed": seed, "episode_id": episode_id, "problem_id": problem_id,
                                  "max_rounds": max_rounds, "mode": mode}.items() if v is not None}
        try:
            frame, raw = await self._call("reset", data)
            result = StepResult.from_payload(frame["data"], _payload_bytes(raw))
        except MuxError as exc:
            if not (chosen and exc.code == "EPISODE_ID_IN_USE"):
                raise
            # our own id: the reset was re-sent after a lost reply and had already happened
            replay = await self.state(t=0, episode_id=episode_id)
            result = StepResult.from_payload(orjson.loads(replay["observation_raw"]), replay["observation_raw"])
        self.episode_id = result.observation.episode_id
        self.next_t = result.observation.t
        return result

    async def step(self, role: Role | str, content: str, t: int | None = None) -> StepResult:
        """Act as ``role``. Raises :class:`MuxError` (``INVALID_ACTION`` with ``error_kind``)
        when the action is rejected; the episode is then unchanged.

        ``t`` (RFC 0004 "Re-sent steps"): the turn this action takes; default: the turn after
        the last observation this session received (``next_t``). A step re-sent with the ``t``
        of a turn already taken (same role and content) answers with the stored reply and
        acts no second time; another ``t`` raises ``OUT_OF_RANGE``. Raises
        :class:`SessionLostError` when the session is gone from the server."""
        data: dict[str, Any] = {"role": Role(role).value, "content": content,
                                "t": self.next_t if t is None else t}
        frame, raw = await self._call("step", data)
        result = StepResult.from_payload(frame["data"], _payload_bytes(raw))
        self.next_t = max(self.next_t, result.observation.t)
        return result

    async def state(self, t: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        """The current state, or with ``t`` ``{"t", "episode_id", "observation"}`` where
        ``observation`` is observation ``t`` exactly as sent (``observation_raw`` holds its
        bytes)."""
        data = {k: v for k, v in {"t": t, "episode_id": episode_id}.items() if v is not None}
        frame, raw = await self._call("state", data)
        out: dict[str, Any] = frame["data"]
        if t is not None:
            payload = _payload_bytes(raw)
            start = payload.index(b'"observation":') + len(b'"observation":')
            out["observation_raw"] = payload[start:-1]
        return out

    async def rewards(self, episode_id: str | None = None, wait: bool = True,
                      timeout_s: float = DEFAULT_REWARDS_TIMEOUT_S) -> EpisodeRewards | None:
        """The delayed-reward record of ``episode_id`` (default: the latest episode); with
        ``wait`` it blocks until grading finishes or ``timeout_s`` passes (then ``None``)."""
        episode_id = episode_id or self.episode_id
        if episode_id in self._records:
            return self._records[episode_id]
        data: dict[str, Any] = {"wait": wait, "timeout_s": timeout_s}
        if episode_id is not None:
            data["episode_id"] = episode_id
        frame, _ = await self._call("rewards", data)
        self._on_rewards(frame["data"])
        return self._records.get(frame["data"]["episode_id"])

    async def close(self) -> None:
        """Close the session on the server (a session already gone counts as closed)."""
        try:
            await self._call("close")
        except MuxError as exc:
            if exc.code != "UNKNOWN_SESSION" and not isinstance(exc, SessionLostError):
                raise
        self.client._sessions.pop(self.session_id, None)

    def _on_rewards(self, data: dict[str, Any]) -> None:
        if data.get("status") == "graded" and data.get("record"):
            record = EpisodeRewards.model_validate(data["record"])
            self._records[record.episode_id] = record


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
    """

    def __init__(self, base_url: str, token: str | None = None, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20, batch: bool = True, max_batch_bytes: int = 512 << 10,
                 reconnect: bool = True, reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S) -> None:
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
        return self._ws is not None and self._recovery is None

    @property
    def reconnecting(self) -> bool:
        """Whether the client is reconnecting after a lost connection."""
        return self._recovery is not None

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
                                            ping_interval=20, ping_timeout=60, open_timeout=10)
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
                await self._request({"type": "attach", "session_id": session.session_id,
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
        ``reconnect_budget_s`` without success, fail them with ``ConnectionError``."""
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
        frame, _ = await self._request({"type": "open", "data": {"open_id": os.urandom(16).hex()}})
        session = MuxSession(self, frame["data"]["session_id"], frame["data"]["resume_token"])
        self._sessions[session.session_id] = session
        return session

    async def attach(self, session_id: str, resume_token: str) -> MuxSession:
        """Re-attach a session opened elsewhere (e.g. by a process that died)."""
        await self._request({"type": "attach", "session_id": session_id, "data": {"resume_token": resume_token}})
        session = self._sessions.get(session_id) or MuxSession(self, session_id, resume_token)
        self._sessions[session_id] = session
        return session

    async def ping(self) -> float:
        """Round trip to the server, seconds."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self._request({"type": "ping", "data": {}})
        return loop.time() - start

    async def send_raw(self, text: str | bytes) -> None:
        """Send an arbitrary frame (for protocol tests); replies arrive via ``_pending``."""
        await self.connect()
        await self._ws.send(text)

    async def _request(self, frame: dict[str, Any], resend: bool = True,
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


# --------------------------------------------------------------------------- sync wrapper


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` runs a coroutine on it and
    blocks for the result (the synchronous facades' engine)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mathdebate-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class SyncMuxSession:
    """Blocking facade of :class:`MuxSession` (same methods, no ``await``)."""

    def __init__(self, session: MuxSession, runner: LoopThread) -> None:
        self._session = session
        self._runner = runner

    @property
    def session(self) -> MuxSession:
        """The asynchronous session behind this facade."""
        return self._session

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def episode_id(self) -> str | None:
        return self._session.episode_id

    def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
              max_rounds: int | None = None, mode: EpisodeMode | str | None = None) -> StepResult:
        """:meth:`MuxSession.reset`, blocking (same arguments, same :class:`MuxError`)."""
        return self._runner.run(self._session.reset(seed, episode_id, problem_id, max_rounds, mode))

    def step(self, role: Role | str, content: str, t: int | None = None) -> StepResult:
        """:meth:`MuxSession.step`, blocking (same arguments, same :class:`MuxError`)."""
        return self._runner.run(self._session.step(role, content, t))

    def state(self, t: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._session.state(t, episode_id))

    def rewards(self, episode_id: str | None = None, wait: bool = True,
                timeout_s: float = DEFAULT_REWARDS_TIMEOUT_S) -> EpisodeRewards | None:
        return self._runner.run(self._session.rewards(episode_id, wait, timeout_s))

    def close(self) -> None:
        self._runner.run(self._session.close())


class SyncMuxClient:
    """Blocking facade of :class:`MuxClient`, for scripts and for trainers with synchronous
    environment code (TRL calls environment methods synchronously). Thread-safe: calls from
    several threads share the one connection."""

    def __init__(self, base_url: str, token: str | None = None, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 batch: bool = True, reconnect: bool = True,
                 reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S) -> None:
        self._runner = LoopThread()
        self._client = MuxClient(base_url, token, request_timeout_s, batch=batch, reconnect=reconnect,
                                 reconnect_budget_s=reconnect_budget_s)
        self._runner.run(self._client.connect())

    def open_session(self) -> SyncMuxSession:
        return SyncMuxSession(self._runner.run(self._client.open_session()), self._runner)

    def reconnect(self) -> None:
        self._runner.run(self._client.reconnect())

    def ping(self) -> float:
        return self._runner.run(self._client.ping())

    def close(self) -> None:
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncMuxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
