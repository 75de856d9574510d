"""The FastAPI application: the routers, auth, and the mapping of errors onto HTTP.

Routes (openenv-core 0.3.0 shapes unless noted):

- ``GET /health``, ``GET /metadata``, ``GET /schema``, ``POST /mcp`` (minimal JSON-RPC: no
  tools), ``POST /reset``, ``POST /step``, ``GET /state``: ``routes_openenv``;
- ``WS /ws``: OpenEnv's one-session-per-connection protocol, and ``WS /ws/mux``: many
  sessions per connection (RFC 0001, batching RFC 0005): ``routes_ws``;
- ``GET /hints`` (RFC 0002), ``GET /episodes/{episode_id}/rewards`` (RFC 0003), ``GET /stats``:
  ``routes_extensions``;
- ``GET /episodes``, ``GET /episodes/{episode_id}`` and the viewer page ``GET /ui``:
  ``routes_ui``.

Auth: with a bearer token configured every route but ``/health`` requires it
(``Authorization: Bearer ...``; WebSockets may pass ``?token=``; HTTP reads, ``GET`` and
``HEAD``, also accept the viewer's cookie, which ``/ui?token=`` sets: a credential derived from
the token, never the token itself).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

import env_server
from env_server.protocol.errors import DebateError, InvalidActionError
from env_server.protocol.frames import invalid_action_errors
from env_server.protocol.models import ErrorCode
from env_server.service.config import ServerConfig
from env_server.service.facade import DebateService
from env_server.transport.auth import COOKIE_NAME, cookie_ok, extract_token, token_ok
from env_server.transport.routes_extensions import extensions_router
from env_server.transport.routes_openenv import health_router, openenv_router
from env_server.transport.routes_ws import websocket_router
from env_server.viewer.routes import episodes_router, ui_router

__all__ = ["HTTP_STATUS", "create_app"]

log = logging.getLogger(__name__)

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_ACTION: 422,
    ErrorCode.OUT_OF_RANGE: 422,
    ErrorCode.NO_EPISODE: 409,
    ErrorCode.EPISODE_DONE: 409,
    ErrorCode.EPISODE_ID_IN_USE: 409,
    ErrorCode.UNKNOWN_PROBLEM: 404,
    ErrorCode.UNKNOWN_EPISODE: 404,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.RESUME_DENIED: 403,
    ErrorCode.CAPACITY_REACHED: 503,
    ErrorCode.SHUTTING_DOWN: 503,
}
"""HTTP status of each refusal (:class:`~env_server.protocol.errors.DebateError` code); others are 400."""


def debate_error_response(exc: DebateError) -> JSONResponse:
    """A refusal as an HTTP error: a rejected action is a 422 with a pydantic-style error list
    (its marker fields in the error), anything else ``{"detail": {code, message, ...}}``."""
    if isinstance(exc, InvalidActionError):
        errors = [{**error, **exc.extra} for error in invalid_action_errors(exc, ("body", "action"))]
        return JSONResponse({"detail": errors}, status_code=HTTP_STATUS[exc.code])
    return JSONResponse({"detail": {"code": exc.code.value, "message": exc.message, **exc.extra}},
                        status_code=HTTP_STATUS.get(exc.code, 400))


def create_app(config: ServerConfig | None = None, service: DebateService | None = None) -> FastAPI:
    """Build the application.

    Args:
        config: server settings (default: ``ServerConfig()``).
        service: a pre-built service (tests); default: built from ``config``.

    Returns:
        The FastAPI app; its lifespan starts the grading pool and, on shutdown, waits up to
        ``shutdown_grace_s`` for in-flight grading.
    """
    config = config or ServerConfig()
    service = service or DebateService(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        log.info("serving %s with %d grading workers", service.problem_source_name, config.grading.workers)
        try:
            yield
        finally:
            await service.shutdown()

    app = FastAPI(
        title="mathdebate environment server",
        version=env_server.__version__,
        description="Math-debate environment: OpenEnv wire protocol plus multiplexed sessions, "
        "error-site markers, delayed rewards and state(t) replay.",
        lifespan=lifespan,
    )
    app.state.service = service

    def require_token(request: Request) -> None:
        presented = extract_token(request.headers.get("authorization"), request.query_params.get("token"))
        if not token_ok(config.auth_token, presented) and not cookie_ok(
                config.auth_token, request.cookies.get(COOKIE_NAME), request.method):
            raise HTTPException(401, detail={"code": ErrorCode.UNAUTHORIZED.value, "message": "missing or wrong bearer token"},
                                headers={"WWW-Authenticate": "Bearer"})

    async def request_validation_handler(request: Request, exc: Exception) -> JSONResponse:
        # FastAPI's default echoes the input, which may be huge, hostile or not even JSON-encodable
        # (``Infinity`` parses but cannot be written back): a 500. Same shape, without the input.
        assert isinstance(exc, RequestValidationError)
        errors = [{k: v for k, v in error.items() if k in ("type", "loc", "msg")} for error in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    async def debate_error_handler(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DebateError)
        return debate_error_response(exc)

    app.add_exception_handler(RequestValidationError, request_validation_handler)
    app.add_exception_handler(DebateError, debate_error_handler)

    auth = [Depends(require_token)]
    app.include_router(health_router)
    app.include_router(openenv_router(service), dependencies=auth)
    app.include_router(extensions_router(service), dependencies=auth)
    app.include_router(episodes_router(service), dependencies=auth)
    app.include_router(ui_router(config.auth_token), dependencies=auth)
    app.include_router(websocket_router(service, config.auth_token))
    return app
