"""Typed clients for ``/ws/mux``: an asyncio multiplexed client and a synchronous wrapper.

One connection carries many sessions::

    async with MuxClient("ws://localhost:8000") as client:
        session = await client.open_session()
        result = await session.reset(seed=3)
        result = await session.step("solver", "... \\\\boxed{42}")
        ...
        record = await session.rewards()          # the delayed-reward record (EpisodeRewards)

After a dropped connection, ``await client.reconnect()`` re-attaches every session with its
resume token; rewards graded meanwhile are delivered on re-attachment.

By default the client batches (RFC 0005): every request made during one event-loop iteration
(e.g. the steps of a whole GRPO group issued with ``asyncio.gather``) goes out in one WebSocket
message, and the server answers with arrays of frames.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import websockets

from env_server.models import MAX_BATCH_FRAMES, DebateObservation, EpisodeMode, EpisodeRewards, Role

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_REWARDS_TIMEOUT_S",
    "GRADED_EPISODE_WAIT_S",
    "MuxClient", "MuxError", "MuxSession", "StepResult", "SyncMuxClient", "SyncMuxSession"]

T = TypeVar("T")

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
        self._records: dict[str, EpisodeRewards] = {}

    async def _call(self, type_: str, data: dict[str, Any] | None = None) -> tuple[dict[str, Any], bytes]:
        return await self.client._request({"type": type_, "session_id": self.session_id, "data": data or {}})

    async def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
                    max_rounds: int | None = None, mode: EpisodeMode | str | None = None) -> StepResult:
        """Start an episode (see ``ResetRequest``); ``None`` arguments are left to the server.

        Args:
            seed, episode_id, problem_id, max_rounds: as ``ResetRequest``.
            mode: ``"debate"`` or ``"single"`` (RFC 0006); default: the server's ``--mode``.

        Raises:
            MuxError: the server refused (``VALIDATION_ERROR`` for an unknown mode or an
                out-of-range value, ``UNKNOWN_PROBLEM``, ``EPISODE_ID_IN_USE``, ...).
        """
        if isinstance(mode, EpisodeMode):
            mode = mode.value
        data = {k: v for k, v in {"seed": seed, "episode_id": episode_id, "problem_id": problem_id,
                                  "max_rounds": max_rounds, "mode": mode}.items() if v is not None}
        frame, raw = await self._call("reset", data)
        result = StepResult.from_payload(frame["data"], _payload_bytes(raw))
        self.episode_id = result.observation.episode_id
        return result

    async def step(self, role: Role | str, content: str, t: int | None = None) -> StepResult:
        """Act as ``role``. Raises :class:`MuxError` (``INVALID_ACTION`` with ``error_kind``)
        when the action is rejected; the episode is then unchanged.

        ``t`` (RFC 0004 "Re-sent steps"): the turn this action takes. A step re-sent with the
        ``t`` of a turn already taken (same role and content) answers with the stored reply and
        acts no second time; another ``t`` raises ``OUT_OF_RANGE``."""
        data: dict[str, Any] = {"role": Role(role).value, "content": content}
        if t is not None:
            data["t"] = t
        frame, raw = await self._call("step", data)
        return StepResult.from_payload(frame["data"], _payload_bytes(raw))

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
        """Close the session on the server."""
        await self._call("close")
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
    """

    def __init__(self, base_url: str, token: str | None = None, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20, batch: bool = True, max_batch_bytes: int = 512 << 10) -> None:
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

    @property
    def sessions(self) -> list[MuxSession]:
        return list(self._sessions.values())

    async def connect(self) -> MuxClient:
        """Open the connection (idempotent)."""
        if self._ws is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            self._ws = await websockets.connect(self.url, additional_headers=headers, max_size=self.max_frame_bytes,
                                                ping_interval=20, ping_timeout=60)
            self._reader = asyncio.create_task(self._read_loop())
        return self

    async def __aenter__(self) -> MuxClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (sessions stay on the server for the resume window)."""
        self._outbox, self._outbox_bytes = [], 0  # unsent requests fail with ConnectionError
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._ws = None
        self._reader = None

    async def drop(self) -> None:
        """Lose the connection abruptly, as a crashed process or a cut network does: the TCP
        transport is aborted with no WebSocket close frame (the server sees an unclean
        disconnect, code 1006). Sessions stay on the server for the resume window; pending
        requests fail with ``ConnectionError``. For tests of resumption."""
        self._outbox, self._outbox_bytes = [], 0
        if self._ws is not None:
            self._ws.transport.abort()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self._ws = None
        self._reader = None

    async def reconnect(self) -> None:
        """Open a new connection and re-attach every known session with its resume token."""
        await self.close()
        await self.connect()
        for session in list(self._sessions.values()):
            await self._request({"type": "attach", "session_id": session.session_id,
                                 "data": {"resume_token": session.resume_token}})

    async def open_session(self) -> MuxSession:
        """Open a new session. Raises :class:`MuxError` (``CAPACITY_REACHED``) at a limit."""
        frame, _ = await self._request({"type": "open", "data": {}})
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

    async def _request(self, frame: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        await self.connect()
        request_id = next(self._ids)
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            encoded = orjson.dumps({**frame, "request_id": request_id})
            if self.batch:
                self._enqueue(encoded)
            else:
                await self._ws.send(encoded.decode())
            reply, raw = await asyncio.wait_for(future, self.request_timeout_s)
        finally:
            self._pending.pop(request_id, None)
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
        if not self._outbox:
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
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("connection to the env server closed"))

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


class _LoopThread:
    """An event loop running in a daemon thread."""

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

    def __init__(self, session: MuxSession, runner: _LoopThread) -> None:
        self._session = session
        self._runner = runner

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
                 batch: bool = True) -> None:
        self._runner = _LoopThread()
        self._client = MuxClient(base_url, token, request_timeout_s, batch=batch)
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
