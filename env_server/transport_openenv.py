"""OpenEnv's ``/ws``: one session per connection, frames exactly as openenv-core 0.3.0.

Client ``{"type": "reset"|"step"|"state"|"close", "data": ...}``; server ``observation``,
``state`` or ``error`` (codes ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``,
``EXECUTION_ERROR``, ``CAPACITY_REACHED``, ``SESSION_ERROR``). Differences, all additive:
observations carry ``metadata`` (as openenv 0.10 does); the terminal observation carries the
episode reward after grading; a rejected action's ``VALIDATION_ERROR`` carries its
``error_kind``; other refusals are ``EXECUTION_ERROR`` with this server's specific code in
``reason``; an oversize frame gets ``FRAME_TOO_LARGE``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from env_server.errors import CapacityError, DebateError, InvalidActionError
from env_server.frames import encode_openenv_frame, replay_body
from env_server.models import OPENENV_MESSAGES, DebateAction, ErrorCode, ResetRequest
from env_server.service import DebateService
from env_server.transport_mux import frame_too_large, validation_errors

__all__ = ["serve_openenv_ws"]

log = logging.getLogger(__name__)


def _error(code: ErrorCode, message: str, **extra: Any) -> bytes:
    return encode_openenv_frame("error", {"message": message, "code": code.value, **extra})


def _openenv_error(exc: DebateError) -> bytes:
    """Map this server's errors onto OpenEnv's codes."""
    if isinstance(exc, InvalidActionError):
        return _error(ErrorCode.VALIDATION_ERROR, exc.message,
                      errors=[{"type": exc.kind.value, "loc": ["data", "role" if exc.kind.value == "role_mismatch" else "content"],
                               "msg": exc.message}], **exc.extra)
    return _error(ErrorCode.EXECUTION_ERROR, exc.message, reason=exc.code.value, **exc.extra)


class _Owner:
    """The connection as the session registry sees it (pushes have nowhere to go on /ws)."""

    def __init__(self) -> None:
        self.connection_id = uuid.uuid4().hex
        self.session_ids: set[str] = set()

    def push(self, frame: bytes) -> bool:
        return False


async def serve_openenv_ws(websocket: WebSocket, service: DebateService) -> None:
    """Serve one accepted OpenEnv ``/ws`` connection until ``close`` or disconnect."""
    owner = _Owner()
    try:
        session = service.sessions.open("ws", owner)
    except CapacityError as exc:
        await websocket.send_text(_error(ErrorCode.CAPACITY_REACHED, exc.message, active_sessions=exc.extra["active_sessions"],
                                         max_sessions=exc.extra["max_sessions"]).decode())
        await websocket.close(1000)
        return
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            reply = await _handle(raw, session, service)
            if reply is None:
                break
            await websocket.send_text(reply.decode())
    except WebSocketDisconnect:
        pass
    finally:
        for removed in service.sessions.detach(owner):
            service.close_session(removed)
    try:
        await websocket.close(1000)
    except RuntimeError:
        pass  # already closed


async def _handle(raw: str | bytes, session, service: DebateService) -> bytes | None:
    """One frame -> its reply; ``None`` for ``close``."""
    if frame_too_large(raw, service.config.max_frame_bytes):
        return _error(ErrorCode.FRAME_TOO_LARGE, f"frame exceeds the limit of {service.config.max_frame_bytes} bytes",
                      limit=service.config.max_frame_bytes)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _error(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
    msg_type = obj.get("type", "") if isinstance(obj, dict) else ""
    model = OPENENV_MESSAGES.get(msg_type)
    if model is None:
        return _error(ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {msg_type}")
    try:
        msg = model.model_validate(obj)
        if msg_type == "reset":
            entry = service.reset(session, ResetRequest.model_validate(msg.data))
            return encode_openenv_frame("observation", raw_data=entry.episode.last_observation)
        if msg_type == "step":
            service.step(session, DebateAction.model_validate(msg.data))
            entry = service.current(session)
            if entry.episode.done:
                return encode_openenv_frame("observation", raw_data=await service.terminal_observation(entry))
            return encode_openenv_frame("observation", raw_data=entry.episode.last_observation)
        if msg_type == "state":
            session.touch()
            if msg.data is not None and msg.data.t is not None:
                entry = service.entry_for(session, msg.data.episode_id)
                body = replay_body(msg.data.t, entry.episode_id, entry.episode.replay(msg.data.t))
                return encode_openenv_frame("state", raw_data=body)
            return encode_openenv_frame("state", service.state_data(session.entry))
        return None  # close
    except ValidationError as exc:
        return _error(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=validation_errors(exc))
    except DebateError as exc:
        return _openenv_error(exc)
    except Exception as exc:  # a bug must not take the connection down
        log.exception("/ws handler failed on a %s frame", msg_type)
        return _error(ErrorCode.EXECUTION_ERROR, f"internal error: {type(exc).__name__}")
