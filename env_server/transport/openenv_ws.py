"""OpenEnv's ``/ws``: one session per connection, frames exactly as openenv-core 0.3.0.

Client ``{"type": "reset"|"step"|"state"|"close", "data": ...}``; server ``observation``,
``state`` or ``error`` (codes ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``,
``EXECUTION_ERROR``, ``CAPACITY_REACHED``, ``SESSION_ERROR``). Differences, all additive:
observations carry ``metadata`` (as openenv 0.10 does); the terminal observation carries the
episode reward after grading; a rejected action's ``VALIDATION_ERROR`` carries its
``error_kind``; other refusals are ``EXECUTION_ERROR`` with this server's specific code in
``reason``; an oversize frame gets ``FRAME_TOO_LARGE``; a ``fork`` frame (RFC 0007) forks the
current episode (or ``episode_id``, an earlier one of the connection) at ``t`` into a new session of
the connection, which the connection plays from then on (its reply is the fork's observation; the
original session stays open, unchanged, until the connection closes).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from env_server.protocol.errors import CapacityError, DebateError, InvalidActionError
from env_server.protocol.frames import (
    encode_openenv_frame,
    frame_too_large,
    invalid_action_errors,
    message_payload,
    validation_errors,
)
from env_server.protocol.models import (
    OPENENV_MESSAGES,
    DebateAction,
    ErrorCode,
    ResetRequest,
    WSForkMessage,
    WSResetMessage,
    WSStateMessage,
    WSStepMessage,
)
from env_server.service.facade import DebateService
from env_server.service.forks import fork_episode

__all__ = ["serve_openenv_ws"]

log = logging.getLogger(__name__)


def _error(code: ErrorCode, message: str, **extra: Any) -> bytes:
    return encode_openenv_frame("error", {"message": message, "code": code.value, **extra})


def _openenv_error(exc: DebateError) -> bytes:
    """Map this server's errors onto OpenEnv's codes."""
    if isinstance(exc, InvalidActionError):
        return _error(ErrorCode.VALIDATION_ERROR, exc.message, errors=invalid_action_errors(exc, ("data",)), **exc.extra)
    return _error(ErrorCode.EXECUTION_ERROR, exc.message, reason=exc.code.value, **exc.extra)


class _OpenEnvConnection:
    """The connection as the service sees it (``sessions.Connection``): OpenEnv's ``/ws`` has
    no push frames, so graded records and session closings are not sent (the terminal
    observation carries the episode reward instead)."""

    def __init__(self) -> None:
        self.connection_id = uuid.uuid4().hex
        self.session_ids: set[str] = set()

    def rewards_ready(self, session_id: str, body: bytes) -> None:
        """Nothing to do: no push frames on ``/ws``."""

    def session_closed(self, session_id: str, reason: str) -> None:
        """Nothing to do: no push frames on ``/ws``."""


async def serve_openenv_ws(websocket: WebSocket, service: DebateService) -> None:
    """Serve one accepted OpenEnv ``/ws`` connection until ``close`` or disconnect."""
    connection = _OpenEnvConnection()
    try:
        session_id = service.open("ws", connection).session_id
    except CapacityError as exc:
        await websocket.send_text(_error(ErrorCode.CAPACITY_REACHED, exc.message, active_sessions=exc.extra["active_sessions"],
                                         max_sessions=exc.extra["max_sessions"]).decode())
        await websocket.close(1000)
        return
    sessions = [session_id]  # the session the connection plays is the last one: a fork moves it on
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            reply = await _handle(message_payload(message), sessions, connection, service)
            if reply is None:
                break
            await websocket.send_text(reply.decode())
    except WebSocketDisconnect:
        pass
    finally:
        service.detach(connection)
    with contextlib.suppress(RuntimeError):  # already closed
        await websocket.close(1000)


async def _handle(raw: str | bytes, sessions: list[str], connection: _OpenEnvConnection,
                  service: DebateService) -> bytes | None:
    """One frame -> its reply; ``None`` for ``close``. ``sessions[-1]`` is the session played;
    a fork appends its own."""
    session_id = sessions[-1]
    limit = service.config.max_frame_bytes
    if frame_too_large(raw, limit):
        return _error(ErrorCode.FRAME_TOO_LARGE, f"frame exceeds the limit of {limit} bytes", limit=limit)
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
        if isinstance(msg, WSResetMessage):
            request = ResetRequest.model_validate(msg.data)
            return encode_openenv_frame("observation", raw_data=service.reset(session_id, request, connection))
        if isinstance(msg, WSStepMessage):
            reply = await service.step_until_graded(session_id, DebateAction.model_validate(msg.data), connection)
            return encode_openenv_frame("observation", raw_data=reply.observation)
        if isinstance(msg, WSStateMessage):
            if msg.data is not None and msg.data.t is not None:
                body = service.state_at(session_id, msg.data.t, msg.data.episode_id, connection)
                return encode_openenv_frame("state", raw_data=body)
            return encode_openenv_frame("state", service.state(session_id, connection))
        if isinstance(msg, WSForkMessage):
            source = service.entry_for(service.sessions.get(session_id, connection), msg.data.episode_id)
            forked = fork_episode(service, source, msg.data.t, "ws", connection, msg.data.fork_episode_id)
            sessions.append(forked.session_id)
            return encode_openenv_frame("observation", raw_data=forked.observation)
        return None  # close
    except ValidationError as exc:
        return _error(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=validation_errors(exc))
    except DebateError as exc:
        return _openenv_error(exc)
    except Exception as exc:  # a bug must not take the connection down
        log.exception("/ws handler failed on a %s frame", msg_type)
        return _error(ErrorCode.EXECUTION_ERROR, f"internal error: {type(exc).__name__}")
