"""Encoding server frames as bytes, embedding stored observation payloads verbatim.

Frames are assembled from pre-serialised parts so that an observation payload (serialised once,
when the observation was created) goes out byte for byte: that is what makes ``state(t)``
replays byte-identical (RFC 0004).
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["encode_frame", "encode_openenv_frame", "replay_body"]


def encode_frame(
    type_: str, request_id: Any, session_id: str | None, data: Any = None, raw_data: bytes | None = None
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
    prefix = _PREFIXES.get(type_)
    if prefix is None:
        prefix = b'{"type":' + orjson.dumps(type_) + b',"request_id":'
    return b"".join((prefix, orjson.dumps(request_id), b',"session_id":', orjson.dumps(session_id), b',"data":', body, b"}"))


#: ``{"type":"<type>","request_id":`` for the server's frame types (every frame starts so)
_PREFIXES = {
    name: b'{"type":' + orjson.dumps(name) + b',"request_id":'
    for name in ("opened", "attached", "observation", "state", "replay", "rewards", "closed", "pong", "error",
                 "session_closed")
}


def encode_openenv_frame(type_: str, data: Any = None, raw_data: bytes | None = None) -> bytes:
    """An OpenEnv ``/ws`` frame ``{"type", "data"}`` (no ids: one session per connection)."""
    body = raw_data if raw_data is not None else orjson.dumps({} if data is None else data)
    return b"".join((b'{"type":', orjson.dumps(type_), b',"data":', body, b"}"))


def replay_body(t: int, episode_id: str, observation: bytes) -> bytes:
    """``{"t", "episode_id", "observation"}`` with the stored observation bytes verbatim."""
    return b"".join((b'{"t":', orjson.dumps(t), b',"episode_id":', orjson.dumps(episode_id),
                     b',"observation":', observation, b"}"))
