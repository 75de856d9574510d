"""The WebSocket routes: OpenEnv's ``/ws`` (``transport_openenv``) and ``/ws/mux``
(``transport_mux``, RFC 0001; ``?batch=1`` makes every server message an array, RFC 0005)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from env_server.protocol.frames import encode_openenv_frame
from env_server.protocol.models import ErrorCode
from env_server.service.facade import DebateService
from env_server.transport.auth import extract_token, token_ok
from env_server.transport.mux import MuxConnection
from env_server.transport.openenv_ws import serve_openenv_ws

__all__ = ["websocket_router"]

#: WebSocket close code for a policy violation (RFC 6455), sent on a missing or wrong token
POLICY_VIOLATION = 1008


def websocket_router(service: DebateService, auth_token: str | None) -> APIRouter:
    """``/ws`` and ``/ws/mux``. With ``auth_token`` set, a connection must present it
    (``Authorization: Bearer`` or ``?token=``), else it gets an error frame and is closed."""
    router = APIRouter()

    async def accept_authorized(websocket: WebSocket) -> bool:
        await websocket.accept()
        presented = extract_token(websocket.headers.get("authorization"), websocket.query_params.get("token"))
        if token_ok(auth_token, presented):
            return True
        await websocket.send_text(encode_openenv_frame(
            "error", {"code": ErrorCode.UNAUTHORIZED.value, "message": "missing or wrong bearer token"}).decode())
        await websocket.close(POLICY_VIOLATION)
        return False

    @router.websocket("/ws")
    async def openenv_ws(websocket: WebSocket) -> None:
        if await accept_authorized(websocket):
            await serve_openenv_ws(websocket, service)

    @router.websocket("/ws/mux")
    async def mux_ws(websocket: WebSocket) -> None:
        if await accept_authorized(websocket):
            batch = websocket.query_params.get("batch", "0").lower() in ("1", "true", "yes")
            await MuxConnection(websocket, service, batch=batch).run()

    return router
