"""HTTP routes beyond OpenEnv: hint templates (RFC 0002), delayed rewards by episode id
(RFC 0003), forks (RFC 0007) and operator counters."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from env_server.protocol.markers import HINT_TEMPLATES
from env_server.protocol.models import ForkRequest, RewardsStatus, StepPayload
from env_server.service.facade import DebateService
from env_server.service.forks import fork_episode

__all__ = ["extensions_router"]


def extensions_router(service: DebateService) -> APIRouter:
    """``/hints``, ``/episodes/{episode_id}/rewards``, ``/episodes/{episode_id}/fork`` and
    ``/stats``, served by ``service``."""
    router = APIRouter(tags=["Extensions"])

    @router.get("/hints")
    async def hints() -> dict[str, str]:
        """Hint templates, ``"<role>/<error_kind>"`` -> text (RFC 0002)."""
        return HINT_TEMPLATES

    @router.get("/episodes/{episode_id}/rewards", response_model=RewardsStatus,
                responses={202: {"model": RewardsStatus}, 404: {"description": "unknown or expired"}})
    async def episode_rewards(episode_id: str) -> Any:
        """The delayed-reward record: 200 when graded, 202 while pending, 404 unknown/expired."""
        status = service.rewards_status(episode_id)
        return JSONResponse(status.model_dump(mode="json"), status_code=200 if status.status == "graded" else 202)

    @router.post("/episodes/{episode_id}/fork", responses={200: {"model": StepPayload},
                                                          404: {"description": "unknown or expired episode"},
                                                          422: {"description": "t out of range"},
                                                          503: {"description": "at capacity"}})
    async def fork(episode_id: str, request: ForkRequest) -> Response:
        """Fork any known episode at observation ``t`` (RFC 0007) into a new HTTP episode: the
        reply is its observation, ``state(t)`` of the original under the fork's ``episode_id``,
        which ``POST /step`` continues; the original is not touched."""
        forked = fork_episode(service, service.episodes.get(episode_id), request.t, "http",
                              episode_id=request.fork_episode_id)
        return Response(forked.observation, media_type="application/json")

    @router.get("/stats")
    async def stats() -> dict[str, Any]:
        """Sessions, episodes and grading counters."""
        return service.stats()

    return router
