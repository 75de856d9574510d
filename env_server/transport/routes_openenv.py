"""OpenEnv's HTTP routes (openenv-core 0.3.0 shapes): health, metadata, schema, MCP, and
HTTP episodes (``/reset``, ``/step``, ``/state``).

OpenEnv's HTTP routes are stateless; here ``/reset`` starts an episode kept server-side and
``/step`` continues it when given its ``episode_id`` (an extra field OpenEnv's request model
allows); ``GET /state?episode_id=&t=`` reads state or replays observation ``t``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import env_server
from env_server.protocol.errors import DebateError
from env_server.protocol.frames import validation_errors
from env_server.protocol.models import DebateAction, DebateObservation, DebateState, ResetRequest, StepPayload
from env_server.service.facade import DebateService

__all__ = ["JSONRPC_INVALID_REQUEST", "JSONRPC_METHOD_NOT_FOUND", "JSONRPC_PARSE_ERROR", "StepRequest",
           "health_router", "openenv_router"]

_JSON = "application/json"

# JSON-RPC 2.0 error codes (https://www.jsonrpc.org/specification#error_object)
JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601


class StepRequest(BaseModel):
    """``POST /step`` body: OpenEnv's ``{action, timeout_s?, request_id?}`` plus ``episode_id``."""

    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)
    episode_id: str | None = Field(default=None, min_length=1, max_length=255,
                                   description="The episode started by POST /reset (required here)")


health_router = APIRouter()


@health_router.get("/health", tags=["Health"])
async def health() -> dict[str, str]:
    """Liveness: ``{"status": "healthy"}`` (no auth, for load balancers)."""
    return {"status": "healthy"}


def _jsonrpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def openenv_router(service: DebateService) -> APIRouter:
    """OpenEnv's routes other than ``/health``, served by ``service`` (auth is added by the app)."""
    router = APIRouter()

    @router.get("/metadata", tags=["Environment Info"])
    async def metadata() -> dict[str, Any]:
        """OpenEnv ``EnvironmentMetadata``."""
        return {
            "name": "mathdebate",
            "description": f"Solver/verifier/judge math debates on {service.problem_source_name}, graded with math-verify.",
            "readme_content": None,
            "version": env_server.__version__,
            "author": "mathdebate",
            "documentation_url": None,
        }

    @router.get("/schema", tags=["Schema"])
    async def schema() -> dict[str, Any]:
        """JSON Schemas of the action, observation and state."""
        return {
            "action": DebateAction.model_json_schema(),
            "observation": DebateObservation.model_json_schema(),
            "state": DebateState.model_json_schema(),
        }

    @router.post("/mcp", tags=["MCP"])
    async def mcp(request: Request) -> dict[str, Any]:
        """Minimal JSON-RPC 2.0 endpoint for OpenEnv tooling: ``tools/list`` is empty (the
        debate is played through reset/step); other methods are 'method not found'."""
        try:
            body = await request.json()
        except ValueError:
            return _jsonrpc_error(None, JSONRPC_PARSE_ERROR, "Parse error")
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
            return _jsonrpc_error(None, JSONRPC_INVALID_REQUEST, "Invalid Request")
        if body["method"] == "tools/list":
            return {"jsonrpc": "2.0", "id": body.get("id"), "result": {"tools": []}}
        return _jsonrpc_error(body.get("id"), JSONRPC_METHOD_NOT_FOUND, "Method not found")

    @router.post("/reset", tags=["Environment Control"],
                 responses={200: {"model": StepPayload}, 503: {"description": "at capacity"}})
    async def reset(request: ResetRequest = Body(default_factory=ResetRequest)) -> Response:  # noqa: B008  FastAPI's way to declare a body
        """Start an HTTP episode; the observation's ``episode_id`` continues it with ``/step``."""
        session_id = service.open("http").session_id
        try:
            observation = service.reset(session_id, request)
        except DebateError:
            service.close(session_id)
            raise
        return Response(observation, media_type=_JSON)

    @router.post("/step", tags=["Environment Control"],
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
        session_id = service.http_session_of(request.episode_id)
        reply = await service.step_until_graded(session_id, action, close_when_done=True)
        return Response(reply.observation, media_type=_JSON)

    @router.get("/state", tags=["State Management"], response_model=None)
    async def state(episode_id: str | None = Query(default=None, max_length=255),
                    t: int | None = Query(default=None)) -> Any:
        """State of an episode, or with ``t`` the exact observation ``t`` (``state(t)``).
        Without ``episode_id``: ``{"episode_id": null, "step_count": 0}`` as stateless OpenEnv."""
        if episode_id is None:
            return {"episode_id": None, "step_count": 0}
        if t is not None:
            return Response(service.episode_state_at(episode_id, t), media_type=_JSON)
        return service.episode_state(episode_id)

    return router
