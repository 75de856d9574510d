"""The FastAPI application: OpenEnv's HTTP routes, ``/ws``, ``/ws/mux`` and the extensions.

Routes (openenv-core 0.3.0 shapes unless noted):

- ``GET /health``, ``GET /metadata``, ``GET /schema``, ``POST /mcp`` (minimal JSON-RPC: no tools);
- ``POST /reset``, ``POST /step``, ``GET /state``: HTTP episodes. OpenEnv's HTTP routes are
  stateless; here ``/reset`` starts an episode kept server-side and ``/step`` continues it
  when given its ``episode_id`` (an extra field OpenEnv's request model allows);
  ``GET /state?episode_id=&t=`` reads state or replays observation ``t``;
- ``WS /ws``: OpenEnv's one-session-per-connection protocol (``transport_openenv``);
- ``WS /ws/mux``: many sessions per connection (``transport_mux``, RFC 0001); ``?batch=1``
  makes every server message an array of frames (RFC 0005);
- ``GET /hints``: hint templates, key -> text (RFC 0002);
- ``GET /episodes/{episode_id}/rewards``: the delayed-reward record (RFC 0003);
- ``GET /stats``: counters for operators and benchmarks.

Auth: with a bearer token configured every route but ``/health`` requires it
(``Authorization: Bearer ...``; WebSockets may pass ``?token=``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import env_server
from env_server.auth import extract_token, token_ok
from env_server.config import ServerConfig
from env_server.errors import DebateError, InvalidActionError, UnknownEpisodeError
from env_server.frames import encode_openenv_frame, replay_body
from env_server.markers import HINT_TEMPLATES
from env_server.models import (
    DebateAction,
    DebateObservation,
    DebateState,
    ErrorCode,
    ResetRequest,
    RewardsStatus,
    StepPayload,
)
from env_server.service import DebateService
from env_server.transport_mux import MuxConnection, validation_errors
from env_server.transport_openenv import serve_openenv_ws

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_JSON = "application/json"


class StepRequest(BaseModel):
    """``POST /step`` body: OpenEnv's ``{action, timeout_s?, request_id?}`` plus ``episode_id``."""

    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)
    episode_id: str | None = Field(default=None, min_length=1, max_length=255,
                                   description="The episode started by POST /reset (required here)")


def _http_error(exc: DebateError) -> HTTPException:
    if isinstance(exc, InvalidActionError):
        loc = ["body", "action", "role" if exc.kind.value == "role_mismatch" else "content"]
        return HTTPException(422, detail=[{"type": exc.kind.value, "loc": loc, "msg": exc.message, **exc.extra}])
    return HTTPException(exc.http_status, detail={"code": exc.code.value, "message": exc.message, **exc.extra})


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
    async def lifespan(app: FastAPI):
        await service.start()
        log.info("serving %s (%d problems) with %d grading workers", service.problems.name,
                 len(service.problems), config.grading.workers)
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
        if not token_ok(config.auth_token, presented):
            raise HTTPException(401, detail={"code": ErrorCode.UNAUTHORIZED.value, "message": "missing or wrong bearer token"},
                                headers={"WWW-Authenticate": "Bearer"})

    auth = [Depends(require_token)]

    @app.exception_handler(RequestValidationError)
    async def request_validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input, which may be huge, hostile or not even JSON-encodable
        # (``Infinity`` parses but cannot be written back): a 500. Same shape, without the input.
        errors = [{k: v for k, v in error.items() if k in ("type", "loc", "msg")} for error in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(DebateError)
    async def debate_error_handler(request: Request, exc: DebateError) -> JSONResponse:
        http = _http_error(exc)
        return JSONResponse({"detail": http.detail}, status_code=http.status_code)

    # ------------------------------------------------------------------ OpenEnv info routes

    @app.get("/health", tags=["Health"])
    async def health() -> dict[str, str]:
        """Liveness: ``{"status": "healthy"}`` (no auth, for load balancers)."""
        return {"status": "healthy"}

    @app.get("/metadata", tags=["Environment Info"], dependencies=auth)
    async def metadata() -> dict[str, Any]:
        """OpenEnv ``EnvironmentMetadata``."""
        return {
            "name": "mathdebate",
            "description": f"Solver/verifier/judge math debates on {service.problems.name}, graded with math-verify.",
            "readme_content": None,
            "version": env_server.__version__,
            "author": "mathdebate",
            "documentation_url": None,
        }

    @app.get("/schema", tags=["Schema"], dependencies=auth)
    async def schema() -> dict[str, Any]:
        """JSON Schemas of the action, observation and state."""
        return {
            "action": DebateAction.model_json_schema(),
            "observation": DebateObservation.model_json_schema(),
            "state": DebateState.model_json_schema(),
        }

    @app.post("/mcp", tags=["MCP"], dependencies=auth)
    async def mcp(request: Request) -> dict[str, Any]:
        """Minimal JSON-RPC 2.0 endpoint for OpenEnv tooling: ``tools/list`` is empty (the
        debate is played through reset/step); other methods are 'method not found'."""
        try:
            body = await request.json()
        except ValueError:
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Invalid Request"}}
        if body["method"] == "tools/list":
            return {"jsonrpc": "2.0", "id": body.get("id"), "result": {"tools": []}}
        return {"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": -32601, "message": "Method not found"}}

    # ------------------------------------------------------------------ HTTP episodes

    @app.post("/reset", tags=["Environment Control"], dependencies=auth,
              responses={200: {"model": StepPayload}, 503: {"description": "at capacity"}})
    async def reset(request: ResetRequest = Body(default_factory=ResetRequest)) -> Response:
        """Start an HTTP episode; the observation's ``episode_id`` continues it with ``/step``."""
        session = service.sessions.open("http")
        try:
            entry = service.reset(session, request)
        except DebateError:
            service.close_session(session)
            raise
        return Response(entry.episode.last_observation, media_type=_JSON)

    @app.post("/step", tags=["Environment Control"], dependencies=auth,
              responses={200: {"model": StepPayload}, 422: {"description": "invalid action"}})
    async def step(request: StepRequest) -> Response:
        """Act in an HTTP episode. The terminal step answers once the episode is graded, with
        the episode reward (other sessions are not held up)."""
        try:
            action = DebateAction.model_validate(request.action)
        except ValidationError as exc:
            raise HTTPException(422, detail=validation_errors(exc)) from None
        if request.episode_id is None:
            raise HTTPException(422, detail=[{"type": "missing", "loc": ["body", "episode_id"],
                                              "msg": "HTTP /step needs the episode_id returned by /reset (or use /ws)"}])
        entry = service.episodes.get(request.episode_id)
        session = service.sessions.get(entry.session_id) if entry.session_id else None
        if session is None or session.kind != "http" or session.entry is not entry:
            raise UnknownEpisodeError(f"episode {request.episode_id!r} is not an open HTTP episode",
                                      episode_id=request.episode_id)
        service.step(session, action)
        if not entry.episode.done:
            return Response(entry.episode.last_observation, media_type=_JSON)
        service.close_session(session)  # frees the slot; the episode stays retained
        return Response(await service.terminal_observation(entry), media_type=_JSON)

    @app.get("/state", tags=["State Management"], dependencies=auth, response_model=None)
    async def state(episode_id: str | None = Query(default=None, max_length=255),
                    t: int | None = Query(default=None)) -> Any:
        """State of an episode, or with ``t`` the exact observation ``t`` (``state(t)``).
        Without ``episode_id``: ``{"episode_id": null, "step_count": 0}`` as stateless OpenEnv."""
        if episode_id is None:
            return {"episode_id": None, "step_count": 0}
        entry = service.episodes.get(episode_id)
        if t is not None:
            return Response(replay_body(t, entry.episode_id, entry.episode.replay(t)), media_type=_JSON)
        return service.state_data(entry)

    # ------------------------------------------------------------------ extensions

    @app.get("/hints", tags=["Extensions"], dependencies=auth)
    async def hints() -> dict[str, str]:
        """Hint templates, ``"<role>/<error_kind>"`` -> text (RFC 0002)."""
        return HINT_TEMPLATES

    @app.get("/episodes/{episode_id}/rewards", tags=["Extensions"], dependencies=auth, response_model=RewardsStatus,
             responses={202: {"model": RewardsStatus}, 404: {"description": "unknown or expired"}})
    async def episode_rewards(episode_id: str) -> Any:
        """The delayed-reward record: 200 when graded, 202 while pending, 404 unknown/expired."""
        status = service.rewards_status(service.episodes.get(episode_id))
        return JSONResponse(status.model_dump(mode="json"), status_code=200 if status.status == "graded" else 202)

    @app.get("/stats", tags=["Extensions"], dependencies=auth)
    async def stats() -> dict[str, Any]:
        """Sessions, episodes and grading counters."""
        return {
            "sessions": len(service.sessions),
            "episodes": len(service.episodes),
            **service.counters,
            "grading": dict(service.grader.stats),
            "grade_cache_entries": len(service.grader.cache),
        }

    # ------------------------------------------------------------------ WebSockets

    async def accept_authorized(websocket: WebSocket) -> bool:
        await websocket.accept()
        presented = extract_token(websocket.headers.get("authorization"), websocket.query_params.get("token"))
        if token_ok(config.auth_token, presented):
            return True
        await websocket.send_text(encode_openenv_frame(
            "error", {"code": ErrorCode.UNAUTHORIZED.value, "message": "missing or wrong bearer token"}).decode())
        await websocket.close(1008)
        return False

    @app.websocket("/ws")
    async def openenv_ws(websocket: WebSocket) -> None:
        if await accept_authorized(websocket):
            await serve_openenv_ws(websocket, service)

    @app.websocket("/ws/mux")
    async def mux_ws(websocket: WebSocket) -> None:
        if await accept_authorized(websocket):
            batch = websocket.query_params.get("batch", "0").lower() in ("1", "true", "yes")
            await MuxConnection(websocket, service, batch=batch).run()

    return app
