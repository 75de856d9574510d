"""Server configuration: one validated model, filled from the command line and environment."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, Field

from env_server.grading.pool import GradingConfig
from env_server.protocol.markers import EpisodeMode
from env_server.protocol.models import AUTH_TOKEN_ENV

__all__ = ["AUTH_TOKEN_ENV", "ServerConfig"]


class ServerConfig(BaseModel):
    """Everything ``mathdebate serve`` can set.

    Attributes:
        problems: JSONL path (MATH-500 or GSM8K format), ``hf:<name>[:<split>]`` or
            ``gen:<family>[,<family>...]`` (the generator restricted to these families);
            ``None`` serves the built-in generator.
        max_rounds: default solver/verifier rounds before the judge (a reset may lower or
            raise it up to 16).
        mode: the episode mode of a reset that names none: ``debate`` (solver, verifier,
            judge) or ``single`` (one solver answer, graded; RFC 0006).
        circular_critique_stop: send a debate to the judge at once when the solver re-submits
            an answer the verifier rejected or the verifier repeats its previous review, with
            the ``circular_critique`` marker (RFC 0006). On by default.
        max_action_chars: longest accepted action content (longer: ``too_long``).
        max_sessions: sessions server-wide, all transports together.
        max_sessions_per_connection: sessions one ``/ws/mux`` connection may hold.
        max_frame_bytes: largest accepted WebSocket frame; larger frames get a
            ``FRAME_TOO_LARGE`` error frame and the connection stays open.
        resume_window_s: how long a ``/ws/mux`` session outlives a dropped connection.
        idle_timeout_s: sessions without activity for this long are reaped (the owner gets a
            ``session_closed`` push).
        retention_s: how long graded reward records stay retrievable.
        max_retained_episodes: cap on retained graded records (oldest dropped first).
        terminal_reward_timeout_s: on the OpenEnv routes, how long the terminal step waits for
            the episode's grade before answering without it (``reward`` 0.0 and
            ``metadata.grading: "pending"`` under ``step_reward="sparse"``, ``null`` under
            ``"none"``; the record stays pullable).
        step_reward: what the OpenEnv routes (``/ws``, ``POST /step``) send as a step's
            ``reward``: ``"sparse"`` (default; the convention of Gymnasium and OpenEnv
            environments and what ``openenv validate`` requires: 0.0 on every step before the
            last, the episode reward on the terminal step) or ``"none"`` (``null`` before the
            last step, as openenv-core 0.3.0's echo environment). The per-turn rewards travel
            on the delayed channel either way (RFC 0003); ``/ws/mux`` steps always send
            ``null``.
        shutdown_grace_s: on SIGTERM, how long in-flight grading may finish.
        trajectory_log: JSONL file receiving one line per graded episode (all turns, rewards
            and markers); ``None`` disables it.
        auth_token: bearer token required on HTTP and WebSocket routes (``/health`` excepted);
            defaults to ``$MATHDEBATE_AUTH_TOKEN``; ``None`` disables auth.
        reap_interval_s: period of the reaper (resume windows, idle sessions, retention).
        state_dir: directory of the state journal (``env_server.service.journal``): sessions, the
            actions of open episodes, worker grades and retained records, so that a restart
            with the same directory (after a crash or ``kill -9``) resumes them; ``None``
            keeps everything in memory only.
        state_fsync_interval_s: seconds between fsyncs of the journal (``0``: after every
            write; slow). A process crash loses nothing acknowledged; a power loss can lose
            this interval.
        state_compact_bytes: rewrite the journal as a snapshot of the live state when its
            file grows past this many bytes.
        grading: the grading pool.
    """

    problems: str | None = None
    max_rounds: int = Field(default=2, ge=1, le=16)
    mode: EpisodeMode = EpisodeMode.DEBATE
    circular_critique_stop: bool = True
    max_action_chars: int = Field(default=32_768, ge=1)
    max_sessions: int = Field(default=20_000, ge=1)
    max_sessions_per_connection: int = Field(default=10_000, ge=1)
    max_frame_bytes: int = Field(default=1 << 20, ge=1024)
    resume_window_s: float = Field(default=60.0, ge=0)
    idle_timeout_s: float = Field(default=900.0, gt=0)
    retention_s: float = Field(default=3600.0, gt=0)
    max_retained_episodes: int = Field(default=20_000, ge=1)
    terminal_reward_timeout_s: float = Field(default=120.0, gt=0)
    step_reward: Literal["sparse", "none"] = "sparse"
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    trajectory_log: str | None = None
    auth_token: str | None = Field(default_factory=lambda: os.environ.get(AUTH_TOKEN_ENV) or None)
    reap_interval_s: float = Field(default=5.0, gt=0)
    state_dir: str | None = None
    state_fsync_interval_s: float = Field(default=1.0, ge=0)
    state_compact_bytes: int = Field(default=256 << 20, ge=1 << 20)
    grading: GradingConfig = Field(default_factory=GradingConfig)
