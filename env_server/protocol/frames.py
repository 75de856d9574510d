"""Wire envelopes and the helpers every transport shares.

Frames are assembled from pre-serialised parts so that a payload (an observation serialised
once, when it was created; a stored record) goes out byte for byte. Also here, because both
WebSocket transports and the HTTP routes need them: the received-message reader, the frame
size check, pydantic errors without their input, and the error list of a rejected action.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import Message

from env_server.protocol.errors import InvalidActionError
from env_server.protocol.markers import ErrorKind
from env_server.protocol.models import SERVER_FRAME_TYPES, ErrorCode, ServerFrameType

__all__ = [
    "encode_frame",
    "encode_openenv_frame",
    "error_frame",
    "frame_too_large",
    "invalid_action_errors",
    "message_payload",
    "validation_errors",
]


def encode_frame(
    type_: ServerFrameType, request_id: Any, session_id: str | None, data: Any = None, raw_data: bytes | None = None
) -> bytes:
    """A ``/ws/mux`` frame ``{"type", "request_id", "session_id", "data"}``.

    Args:
        type_: frame type.
        request_id: echoed request id (``None`` for pushes).
        session_id: the session concerned, or ``None``.
        data: a JSON-serialisable value, used when ``raw_data`` is ``None``.
        raw_data: already-serialised JSON for ``data``, embedded verbatim.
    """
    body = raw_data if raw_data is not None else orjson.dumps({} if data is None else data)
    return b"".join((_PREFIXES[type_], orjson.dumps(request_id), b',"session_id":', orjson.dumps(session_id),
                     b',"data":', body, b"}"))


#: ``{"type":"<type>","request_id":`` for each server frame type (every frame starts so)
_PREFIXES = {name: b'{"type":' + orjson.dumps(name) + b',"request_id":' for name in SERVER_FRAME_TYPES}


def error_frame(code: ErrorCode, message: str, request_id: Any = None, session_id: str | None = None, **extra: Any) -> bytes:
    """A ``/ws/mux`` error frame ``{"type": "error", "request_id", "session_id", "data": {code, message, ...}}``."""
    return encode_frame("error", request_id, session_id, {"code": code.value, "message": message, **extra})


def encode_openenv_frame(type_: str, data: Any = None, raw_data: bytes | None = None) -> bytes:
    """An OpenEnv ``/ws`` frame ``{"type", "data"}`` (no ids: one session per connection)."""
    body = raw_data if raw_data is not None else orjson.dumps({} if data is None else data)
    return b"".join((b'{"type":', orjson.dumps(type_), b',"data":', body, b"}"))


def message_payload(message: Message) -> str | bytes:
    """The text (or, for a binary message, the bytes) of an ASGI ``websocket.receive`` event."""
    text: str | None = message.get("text")
    if text is not None:
        return text
    data: bytes | None = message.get("bytes")
    return data or b""


def frame_too_large(raw: str | bytes, limit: int) -> bool:
    """Whether a received frame exceeds ``limit`` bytes (UTF-8 size for text frames)."""
    if isinstance(raw, bytes):
        return len(raw) > limit
    if len(raw) > limit:
        return True
    return len(raw) * 4 > limit and len(raw.encode()) > limit


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic errors without the offending input (which may be huge or hostile)."""
    return [dict(error) for error in exc.errors(include_url=False, include_input=False, include_context=False)]


def invalid_action_errors(exc: InvalidActionError, loc_prefix: tuple[str, ...]) -> list[dict[str, Any]]:
    """A rejected action as a pydantic-style error list (``/ws`` ``VALIDATION_ERROR`` frames and
    HTTP 422 bodies): one error whose ``type`` is the error kind and whose ``loc`` is the
    offending field under ``loc_prefix``."""
    field = "role" if exc.kind is ErrorKind.ROLE_MISMATCH else "content"
    return [{"type": exc.kind.value, "loc": [*loc_prefix, field], "msg": exc.message}]
