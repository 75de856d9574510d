"""``/ws/mux``: many sessions multiplexed over one WebSocket (RFC 0001).

Every client frame carries a ``request_id`` (echoed in the reply) and, after ``open``, a
``session_id``. Replies can come out of order (a ``rewards`` request with ``wait`` answers when
grading finishes; everything else answers at once). Graded rewards are pushed as ``rewards``
frames with ``request_id: null``. A malformed frame gets an error frame; the connection and
every other session keep working.

Batching (RFC 0005): a client message may be a JSON array of frames, processed in order. A
connection opened with ``?batch=1`` receives every server message as a JSON array of one or
more frames: the write loop sends every frame that is ready in one message, so the
per-message cost (WebSocket framing, ASGI events, event-loop wake-ups) is paid once per
batch instead of once per frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from env_server.protocol.errors import DebateError
from env_server.protocol.frames import encode_frame, error_frame, frame_too_large, message_payload, validation_errors
from env_server.protocol.models import (
    CLIENT_FRAME_TYPES,
    MAX_BATCH_FRAMES,
    AttachFrame,
    ClientFrame,
    CloseFrame,
    ErrorCode,
    ForkFrame,
    OpenFrame,
    PingFrame,
    ResetFrame,
    RewardsFrame,
    StateFrame,
    StepFrame,
)
from env_server.service.facade import DebateService
from env_server.service.forks import fork_episode

__all__ = ["MAX_PENDING_FRAMES", "MuxConnection"]

log = logging.getLogger(__name__)

_FRAMES: TypeAdapter[Any] = TypeAdapter(ClientFrame)
#: Frames waiting to be written per connection; replies wait for room (backpressure on a
#: client that does not read), pushes are dropped when full (records stay pullable).
MAX_PENDING_FRAMES = 4096
#: Most frames (``models.MAX_BATCH_FRAMES``, for a client batch every frame of a longer one is
#: refused) and bytes the write loop puts in one outgoing batch message.
MAX_OUT_BATCH_FRAMES = MAX_BATCH_FRAMES
#: longest stretch one connection's batch runs on the event loop before it yields to others, s
TIME_SLICE_S = 0.002
MAX_OUT_BATCH_BYTES = 4 << 20
#: Frames kept for one held session (see ``MuxConnection``); more get a ``CAPACITY_REACHED``
#: error frame, so a client that does not wait for replies cannot grow the server's memory.
MAX_HELD_FRAMES = 64


class MuxConnection:
    """One ``/ws/mux`` connection.

    Backpressure on grading: after a step that leaves its session with at least
    ``GradingConfig.session_backlog`` grades queued for or running in a grading worker, the
    session's next frames are held, in order, until its backlog is below that again (a session
    flooding the graders with costly answers waits for its own work; the connection's other
    sessions are not held; ``benchmarks/README.md``, "Hostile load").

    Args:
        websocket: an accepted WebSocket.
        service: the debate service.
        batch: send server messages as JSON arrays of frames (RFC 0005, ``?batch=1``).
    """

    def __init__(self, websocket: WebSocket, service: DebateService, batch: bool = False) -> None:
        self.websocket = websocket
        self.service = service
        self.batch = batch
        self.connection_id = uuid.uuid4().hex
        self.session_ids: set[str] = set()
        # Outbound frames. A list the write loop swaps out whole, rather than an asyncio.Queue
        # (its per-item put/get showed in profiles; benchmarks/README.md): ``_wake`` tells the write
        # loop there is something to send, ``_room`` that the list is below MAX_PENDING_FRAMES.
        self._out: list[bytes] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._waits: set[asyncio.Task[None]] = set()
        self._after_reply: bytes | None = None  # a push that must follow the current reply
        self._held: dict[str, list[tuple[Any, Any]]] = {}  # session id -> its frames held behind its grading backlog
        self._handlers: dict[str, Callable[[Any], bytes | None]] = {
            "open": self._open, "attach": self._attach, "reset": self._reset, "step": self._step,
            "state": self._state, "fork": self._fork, "rewards": self._rewards, "close": self._close, "ping": self._ping,
        }

    # ------------------------------------------------------------------ plumbing

    def rewards_ready(self, session_id: str, body: bytes) -> None:
        """``Connection``: push a ``rewards`` frame (``request_id: null``)."""
        self._push(encode_frame("rewards", None, session_id, raw_data=body))

    def session_closed(self, session_id: str, reason: str) -> None:
        """``Connection``: push a ``session_closed`` frame with the reason."""
        self._push(encode_frame("session_closed", None, session_id, {"reason": reason}))

    def _push(self, frame: bytes) -> None:
        """Queue a server-initiated frame; dropped when the outbound queue is full (the
        client is not reading; a record stays pullable by id)."""
        if len(self._out) < MAX_PENDING_FRAMES:
            self._out.append(frame)
            self._wake.set()

    async def run(self) -> None:
        """Serve the connection until it closes; then detach its sessions."""
        writer = asyncio.create_task(self._write_loop())
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self._handle(message_payload(message))
        except WebSocketDisconnect:
            pass
        finally:
            for task in self._waits:
                task.cancel()
            self.service.detach(self)
            writer.cancel()

    async def _write_loop(self) -> None:
        send = self.websocket.send
        try:
            while True:
                while not self._out:
                    self._wake.clear()
                    await self._wake.wait()
                frames, self._out = self._out, []
                self._room.set()
                if not self.batch:
                    for frame in frames:
                        await send({"type": "websocket.send", "text": frame.decode()})
                    continue
                # everything queued goes out together, in messages of bounded size
                for message in _batch_messages(frames):
                    await send({"type": "websocket.send", "text": message.decode()})
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the receive loop sees the disconnect and cleans up

    async def _reply(self, frame: bytes) -> None:
        while len(self._out) >= MAX_PENDING_FRAMES:  # the client is not reading: wait for room
            self._room.clear()
            await self._room.wait()
        self._out.append(frame)
        self._wake.set()

    async def _handle(self, raw: str | bytes) -> None:
        """One WebSocket message: a frame, or an array of frames (RFC 0005)."""
        limit = self.service.config.max_frame_bytes
        if frame_too_large(raw, limit):
            size = len(raw) if isinstance(raw, bytes) else len(raw.encode())
            message = f"frame of {size} bytes exceeds the limit of {limit} bytes"
            # The message is already in memory (under the transport limit): answer its frames
            # by request id, so no request waits for a reply that never comes.
            for request_id, session_id in _answerable(_message_ids(raw)):
                await self._reply(error_frame(ErrorCode.FRAME_TOO_LARGE, message, request_id, session_id, limit=limit))
            return
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            await self._reply(error_frame(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}"))
            return
        if isinstance(obj, list):
            if not obj:
                await self._reply(error_frame(ErrorCode.VALIDATION_ERROR, "an empty batch: send at least one frame"))
            elif len(obj) > MAX_BATCH_FRAMES:
                message = f"a batch of {len(obj)} frames exceeds the limit of {MAX_BATCH_FRAMES} frames"
                for request_id, session_id in _answerable([_ids_of(item) for item in obj]):
                    await self._reply(error_frame(ErrorCode.VALIDATION_ERROR, message, request_id, session_id,
                                                  max_batch_frames=MAX_BATCH_FRAMES))
            else:
                # fair share: a long batch yields to the other connections every TIME_SLICE_S
                # of work, so one connection's flood cannot hold the event loop
                deadline = time.perf_counter() + TIME_SLICE_S
                for item in obj:
                    if (pending := self._frame(item)) is not None:
                        await pending
                    if time.perf_counter() > deadline:
                        await asyncio.sleep(0)
                        deadline = time.perf_counter() + TIME_SLICE_S
            return
        await self._handle_frame(obj)

    async def _handle_frame(self, obj: Any) -> None:
        """One decoded frame: validate, dispatch, reply (errors become error frames)."""
        pending = self._frame(obj)
        if pending is not None:
            await pending

    def _frame(self, obj: Any) -> Coroutine[Any, Any, None] | None:
        """:meth:`_handle_frame` without a coroutine of its own: the frame is handled and its reply
        queued at once, and what is left to await (a reply waiting for room in the outbound
        queue) is returned. A batch runs many frames per message; a coroutine per frame and per
        reply was a measurable share of a loaded server's time (``benchmarks/README.md``)."""
        if not isinstance(obj, dict):
            return self._send(error_frame(ErrorCode.VALIDATION_ERROR,
                                          "a frame must be a JSON object (or a message an array of frames)"))
        request_id = obj.get("request_id") if isinstance(obj.get("request_id"), (str, int)) else None
        session_id = obj.get("session_id") if isinstance(obj.get("session_id"), str) else None
        frame_type = obj.get("type")
        if frame_type not in CLIENT_FRAME_TYPES:
            return self._send(error_frame(
                ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {frame_type!r} (expected one of {', '.join(CLIENT_FRAME_TYPES)})",
                request_id, session_id,
            ))
        try:
            frame = _FRAMES.validate_python(obj)
        except ValidationError as exc:
            return self._send(error_frame(ErrorCode.VALIDATION_ERROR, "Invalid message", request_id, session_id,
                                          errors=validation_errors(exc)))
        if session_id is not None and (held := self._held.get(session_id)) is not None:
            if len(held) >= MAX_HELD_FRAMES:
                return self._send(error_frame(
                    ErrorCode.CAPACITY_REACHED, f"the session's grading backlog is full and {MAX_HELD_FRAMES} of its "
                    "frames already wait behind it: wait for their replies", request_id, session_id))
            held.append((frame, request_id))
            return None
        pending = self._run(frame, request_id, session_id)
        if frame_type == "step" and session_id is not None:
            self._hold_if_backlogged(session_id)
        return pending

    def _hold_if_backlogged(self, session_id: str) -> None:
        """Hold the session's next frames while its grading backlog is full (class docstring)."""
        if session_id in self._held or self.service.grading_backlog(session_id) < self.service.config.grading.session_backlog:
            return
        self._held[session_id] = []
        task = asyncio.create_task(self._release(session_id))
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def _release(self, session_id: str) -> None:
        """Process a held session's frames, in order, as its grading backlog allows."""
        try:
            while True:
                await self.service.grading_room(session_id)
                held = self._held[session_id]
                if not held:
                    return
                frame, request_id = held.pop(0)
                await self._dispatch(frame, request_id, session_id)
        finally:
            self._held.pop(session_id, None)

    async def _dispatch(self, frame: Any, request_id: Any, session_id: str | None) -> None:
        """A validated frame: run its handler and reply (errors become error frames)."""
        pending = self._run(frame, request_id, session_id)
        if pending is not None:
            await pending

    def _run(self, frame: Any, request_id: Any, session_id: str | None) -> Coroutine[Any, Any, None] | None:
        """:meth:`_dispatch` without a coroutine of its own (see :meth:`_frame`)."""
        frame_type = frame.type
        try:
            reply = self._handlers[frame_type](frame)
        except DebateError as exc:
            reply = encode_frame("error", request_id, session_id, exc.to_data())  # request ids as received
        except Exception as exc:  # a bug must not take the connection down
            log.exception("mux handler failed on a %s frame", frame_type)
            reply = error_frame(ErrorCode.EXECUTION_ERROR, f"internal error: {type(exc).__name__}", request_id, session_id)
        if self._after_reply is not None:
            follow, self._after_reply = self._after_reply, None
            return self._send_all([reply, follow] if reply is not None else [follow])
        return None if reply is None else self._send(reply)

    def _send(self, frame: bytes) -> Coroutine[Any, Any, None] | None:
        """Queue a reply when the outbound queue has room (``None``), else return the
        coroutine that waits for room and queues it."""
        if len(self._out) < MAX_PENDING_FRAMES:
            self._out.append(frame)
            self._wake.set()
            return None
        return self._reply(frame)

    async def _send_all(self, frames: list[bytes]) -> None:
        for frame in frames:
            await self._reply(frame)

    # ------------------------------------------------------------------ handlers
    # Each returns the reply frame, or None when it answers later (rewards with wait).

    def _open(self, frame: OpenFrame) -> bytes:
        opened = self.service.open("mux", self, frame.data.open_id)
        return encode_frame("opened", frame.request_id, opened.session_id, {
            "session_id": opened.session_id,
            "resume_token": opened.resume_token,
            "resume_window_s": opened.resume_window_s,
        })

    def _attach(self, frame: AttachFrame) -> bytes:
        attached = self.service.attach(frame.session_id, frame.data.resume_token, self)
        if attached.rewards is not None:
            # The push may have gone to the dropped connection: send the record again (clients
            # de-duplicate by episode_id). It follows the "attached" reply.
            self._after_reply = encode_frame("rewards", None, attached.session_id, raw_data=attached.rewards)
        return encode_frame("attached", frame.request_id, attached.session_id,
                            {"session_id": attached.session_id, "state": attached.state})

    def _reset(self, frame: ResetFrame) -> bytes:
        observation = self.service.reset(frame.session_id, frame.data, self)
        return encode_frame("observation", frame.request_id, frame.session_id, raw_data=observation)

    def _step(self, frame: StepFrame) -> bytes:
        reply = self.service.step(frame.session_id, frame.data, self)
        return encode_frame("observation", frame.request_id, frame.session_id, raw_data=reply.observation)

    def _state(self, frame: StateFrame) -> bytes:
        if frame.data.t is None:
            return encode_frame("state", frame.request_id, frame.session_id, self.service.state(frame.session_id, self))
        body = self.service.state_at(frame.session_id, frame.data.t, frame.data.episode_id, self)
        return encode_frame("replay", frame.request_id, frame.session_id, raw_data=body)

    def _fork(self, frame: ForkFrame) -> bytes:
        source = self.service.entry_for(self.service.sessions.get(frame.session_id, self), frame.data.episode_id)
        forked = fork_episode(self.service, source, frame.data.t, "mux", self, frame.data.fork_episode_id)
        return encode_frame("forked", frame.request_id, frame.session_id, {
            "session_id": forked.session_id, "resume_token": forked.resume_token,
            "resume_window_s": forked.resume_window_s, "episode_id": forked.episode_id,
            "observation": orjson.Fragment(forked.observation)})

    def _rewards(self, frame: RewardsFrame) -> bytes | None:
        reply = self.service.rewards(frame.session_id, frame.data.episode_id, self)
        if reply.graded or not frame.data.wait:
            return encode_frame("rewards", frame.request_id, frame.session_id, raw_data=reply.body)
        waiting = self.service.wait_rewards(frame.session_id, reply.episode_id, frame.data.timeout_s, self)

        async def answer_when_graded() -> None:
            graded = await waiting
            await self._reply(encode_frame("rewards", frame.request_id, frame.session_id, raw_data=graded.body))

        task = asyncio.create_task(answer_when_graded())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)
        return None

    def _close(self, frame: CloseFrame) -> bytes:
        self.service.close(frame.session_id, self)
        return encode_frame("closed", frame.request_id, frame.session_id, {"session_id": frame.session_id})

    def _ping(self, frame: PingFrame) -> bytes:
        return encode_frame("pong", frame.request_id, None, {"time": time.time()})


def _batch_messages(frames: list[bytes]) -> list[bytes]:
    """``frames`` as JSON arrays (RFC 0005) of at most ``MAX_OUT_BATCH_FRAMES`` frames and about
    ``MAX_OUT_BATCH_BYTES`` (a message ends after the frame that reaches the size)."""
    if len(frames) <= MAX_OUT_BATCH_FRAMES and sum(map(len, frames)) < MAX_OUT_BATCH_BYTES:
        # the common case, one message: the brackets go on the end frames, so the frames are
        # copied once (C-level), with no Python loop over them (``frames`` is the caller's to lose)
        frames[0] = b"[" + frames[0]
        frames[-1] = frames[-1] + b"]"
        return [b",".join(frames)]
    messages = []
    start = 0
    while start < len(frames):
        end, size = start, 0
        while end < len(frames) and end - start < MAX_OUT_BATCH_FRAMES and size < MAX_OUT_BATCH_BYTES:
            size += len(frames[end])
            end += 1
        messages.append(b"[" + b",".join(frames[start:end]) + b"]")
        start = end
    return messages


def _ids_of(obj: Any) -> tuple[Any, str | None]:
    """``(request_id, session_id)`` of a decoded frame, ``None`` where absent or malformed."""
    if not isinstance(obj, dict):
        return None, None
    request_id = obj.get("request_id")
    session_id = obj.get("session_id")
    return (request_id if isinstance(request_id, (str, int)) else None,
            session_id if isinstance(session_id, str) else None)


def _answerable(ids: list[tuple[Any, str | None]]) -> list[tuple[Any, str | None]]:
    """Whom to answer when a whole message is refused: the frames that carry a request id (at
    most ``MAX_BATCH_FRAMES``, so a flood of tiny elements cannot make millions of error frames),
    or one frame with a null id when none does."""
    return [pair for pair in ids if pair[0] is not None][:MAX_BATCH_FRAMES] or [(None, None)]


def _message_ids(raw: str | bytes) -> list[tuple[Any, str | None]]:
    """The ids of the frame, or of every frame of a batch, in a message (empty when it is not JSON)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return [_ids_of(item) for item in obj] if isinstance(obj, list) else [_ids_of(obj)]
