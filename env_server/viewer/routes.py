"""The debate viewer: JSON routes over graded episodes and the ``/ui`` page (issue 15).

- ``GET /episodes?problem_id=&error_kind=&min_reward=&max_reward=&limit=``: summaries of the
  retained graded episodes, newest first (:class:`EpisodeList`);
- ``GET /episodes/{episode_id}``: one episode in full: problem, turns, rewards record
  (:class:`EpisodeView`); 404 when unknown or expired;
- ``GET /ui``: the viewer page; ``GET /ui/<asset>``: its script, style sheet and the vendored
  KaTeX (``env_server/viewer/ui/``, package data). Every page response carries
  ``Content-Security-Policy: default-src 'self'``; with auth on, ``/ui?token=<token>`` also sets
  the HttpOnly, SameSite=Strict cookie (``auth.COOKIE_NAME``) that the app's auth check
  accepts for reads, so the page's own requests pass. The cookie holds
  ``auth.viewer_credential(token)``, an HMAC of the token, never the token.

The JSON routes read an :class:`EpisodeSource`: the live server's ``DebateService`` or, for
``mathdebate view``, a trajectory file (``env_server.viewer.command``).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from env_server.protocol.errors import UnknownEpisodeError
from env_server.protocol.markers import EpisodeMode, ErrorKind, Role
from env_server.protocol.models import EpisodeRewards
from env_server.transport.auth import COOKIE_NAME, token_ok, viewer_credential

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11

__all__ = ["CONTENT_SECURITY_POLICY", "EpisodeList", "EpisodeSource", "EpisodeSummary", "EpisodeTurn", "EpisodeView",
           "episodes_router", "ui_asset_names", "ui_router"]

#: The page and its assets load only from this origin: no inline script, no inline style
#: attribute, nothing from elsewhere. KaTeX lays out math through CSSOM properties
#: (``element.style.x = ...``), which this policy allows; only its error spans and hidden MathML
#: use ``style`` attributes (blocked: ``style.css`` colours ``.katex-error`` instead).
CONTENT_SECURITY_POLICY = "default-src 'self'"

_UI_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".woff2": "font/woff2",
    ".woff": "font/woff",
    ".ttf": "font/ttf",
    "": "text/plain; charset=utf-8",  # LICENSE
}


class EpisodeSummary(BaseModel):
    """One line of the episode list."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str
    problem_id: str
    mode: EpisodeMode
    episode_reward: float
    error_kinds: list[ErrorKind] = Field(description="distinct final markers of the turns, in turn order")
    turns: int = Field(ge=0, description="turns taken")
    graded_at: float = Field(description="Unix time (s) when grading finished")


class EpisodeList(BaseModel):
    """``GET /episodes``: matching graded episodes, most recently graded first."""

    model_config = ConfigDict(extra="forbid")
    episodes: list[EpisodeSummary]


class EpisodeTurn(BaseModel):
    """One turn as it was taken."""

    model_config = ConfigDict(extra="forbid")
    t: int = Field(ge=0)
    role: Role
    round: int = Field(ge=0)
    content: str
    policy: str | None = Field(default=None, description="the policy that played it (evaluation files only)")


class EpisodeView(BaseModel):
    """``GET /episodes/{episode_id}``: one episode in full."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str
    problem_id: str
    problem: str | None = Field(description="the problem statement (null when a trajectory file lacks it)")
    gold: str | None = Field(default=None, description="the reference answer: evaluation files only, never the live server")
    mode: EpisodeMode
    max_rounds: int | None = None
    done: bool
    graded: bool
    turns: list[EpisodeTurn]
    rewards: EpisodeRewards | None = Field(description="the delayed-reward record (RFC 0003) once graded")
    max_t: int | None = Field(description="the last observation GET /state?episode_id=&t= replays (RFC 0004); "
                                          "null where replay is not available (mathdebate view)")


class EpisodeSource(Protocol):
    """Where the JSON routes read episodes: ``DebateService`` or ``view.TrajectoryFile``."""

    def recent_episodes(self, *, problem_id: str | None = None, error_kind: str | None = None,
                        min_reward: float | None = None, max_reward: float | None = None,
                        limit: int = 50) -> list[dict[str, Any]]:
        """Summaries (:class:`EpisodeSummary` fields) of graded episodes, newest first."""
        ...

    def episode_view(self, episode_id: str) -> dict[str, Any]:
        """One episode (:class:`EpisodeView` fields); raises ``UnknownEpisodeError``."""
        ...


def episodes_router(source: EpisodeSource) -> APIRouter:
    """``GET /episodes`` and ``GET /episodes/{episode_id}``, read from ``source``."""
    router = APIRouter(tags=["Viewer"])

    @router.get("/episodes", response_model=EpisodeList)
    async def episodes(
        problem_id: Annotated[str | None, Query(max_length=255, description="only this problem")] = None,
        error_kind: Annotated[ErrorKind | None, Query(description="only episodes with a turn of this final marker")] = None,
        min_reward: Annotated[float | None, Query(description="only episode rewards >= this")] = None,
        max_reward: Annotated[float | None, Query(description="only episode rewards <= this")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="most episodes returned")] = 50,
    ) -> EpisodeList:
        """Recent graded episodes still retained, most recently graded first: per episode its
        id, problem, mode, episode reward, the error kinds of its turns, turn count and
        grading time."""
        found = source.recent_episodes(problem_id=problem_id, error_kind=error_kind.value if error_kind else None,
                                       min_reward=min_reward, max_reward=max_reward, limit=limit)
        return EpisodeList(episodes=[EpisodeSummary.model_validate(summary) for summary in found])

    @router.get("/episodes/{episode_id}", response_model=EpisodeView,
                responses={404: {"description": "unknown or expired"}})
    async def episode(episode_id: str = Path(max_length=255)) -> Any:
        """One episode in full: problem, turns (``t``, ``role``, ``round``, ``content``), the
        rewards record (per-turn reward, correctness, marker, hint key; counterfactual facts)
        and ``max_t`` for stepping through observations with ``GET /state?episode_id=&t=``."""
        try:
            view = source.episode_view(episode_id)
        except UnknownEpisodeError as exc:  # the app's shape for refusals ({"detail": {code, message, ...}})
            return JSONResponse({"detail": {"code": exc.code.value, "message": exc.message, **exc.extra}}, status_code=404)
        return EpisodeView.model_validate(view)

    return router


def _ui_root() -> Traversable:
    return resources.files("env_server.viewer") / "ui"


def _walk(folder: Traversable, prefix: str = "") -> dict[str, Traversable]:
    found: dict[str, Traversable] = {}
    for item in folder.iterdir():
        if item.is_dir():
            found.update(_walk(item, f"{prefix}{item.name}/"))
        elif item.is_file():
            found[f"{prefix}{item.name}"] = item
    return found


def ui_asset_names() -> list[str]:
    """The files the viewer serves under ``/ui/`` (paths relative to ``env_server/ui``)."""
    return sorted(_walk(_ui_root()))


def ui_router(auth_token: str | None = None) -> APIRouter:
    """``GET /ui`` (the page) and ``GET /ui/<asset>`` (only the packaged files under
    ``env_server/ui``; anything else is a 404). ``auth_token``: the server's token, to set the
    viewer's cookie from ``/ui?token=`` (the app enforces auth itself)."""
    router = APIRouter(tags=["Viewer"])
    assets = _walk(_ui_root())

    def asset_response(name: str) -> Response:
        suffix = "." + name.rsplit(".", 1)[-1] if "." in name.rsplit("/", 1)[-1] else ""
        cache = "public, max-age=86400" if name.startswith("vendor/") else "no-cache"
        return Response(assets[name].read_bytes(), media_type=_MEDIA_TYPES.get(suffix, "application/octet-stream"),
                        headers={**_UI_HEADERS, "Cache-Control": cache})

    @router.get("/ui", response_class=HTMLResponse)
    async def page(request: Request, token: Annotated[str | None, Query(max_length=1024, description=(
            "the server's token: sets an HttpOnly, SameSite=Strict cookie that later requests may present"))] = None,
                   ) -> Response:
        """The debate viewer: live counters, recent graded episodes with filters, one debate
        with its markers, hints, rewards and facts, and its observations step by step."""
        response = asset_response("index.html")
        if auth_token and token is not None and token_ok(auth_token, token):
            response.set_cookie(COOKIE_NAME, viewer_credential(auth_token), httponly=True, samesite="strict", path="/",
                                secure=request.url.scheme == "https")
        return response

    @router.get("/ui/{asset:path}", include_in_schema=False)
    async def asset(asset: str) -> Response:
        """A packaged file of the viewer (script, style sheet, KaTeX and its fonts)."""
        if asset not in assets or asset == "index.html":
            return JSONResponse({"detail": "Not Found"}, status_code=404, headers=_UI_HEADERS)
        return asset_response(asset)

    return router
