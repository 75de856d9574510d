"""What the service's operations return to the transports: payload bytes and small named tuples."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import orjson

from env_server.protocol.models import EpisodeRewards
from env_server.protocol.payloads import pending_rewards_body, rewards_body
from env_server.service.episodes import EpisodeEntry

__all__ = ["Attached", "Opened", "RewardsReply", "StepReply", "rewards_payload", "rewards_reply", "state_data", "wait_graded",
           "with_reward"]


class Opened(NamedTuple):
    """A new session: its id, its resume token (``""`` unless ``mux``) and resume window (s)."""

    session_id: str
    resume_token: str
    resume_window_s: float


class Attached(NamedTuple):
    """A re-attached session: its state (:meth:`DebateService.state`) and, when its current
    episode is graded, the ``RewardsStatus`` JSON to deliver again (the push may have gone to
    the dropped connection), else ``None``."""

    session_id: str
    state: dict[str, Any]
    rewards: bytes | None


class StepReply(NamedTuple):
    """The observation after a step (its stored JSON, byte for byte) and whether the debate is over."""

    observation: bytes
    done: bool


class RewardsReply(NamedTuple):
    """A rewards answer: the episode, whether it is graded, and the ``RewardsStatus`` JSON."""

    episode_id: str
    graded: bool
    body: bytes


def with_reward(observation: bytes, reward: float, graded: bool = False) -> bytes:
    """A stored step payload with ``reward`` set, at the top level and in the observation
    (and ``metadata.grading: "graded"`` when ``graded``)."""
    payload = orjson.loads(observation)
    payload["reward"] = payload["observation"]["reward"] = reward
    if graded:
        payload["metadata"]["grading"] = payload["observation"]["metadata"]["grading"] = "graded"
    return orjson.dumps(payload)


def state_data(entry: EpisodeEntry | None) -> dict[str, Any]:
    """``state()``'s answer for the session's current episode (``None``: no episode yet)."""
    if entry is None:
        return {"episode_id": None, "step_count": 0}
    return {**entry.episode.state(), "graded": entry.is_graded, "episode_reward": entry.episode_reward}

def rewards_reply(entry: EpisodeEntry) -> RewardsReply:
    """The rewards answer for ``entry``, graded or pending."""
    return RewardsReply(entry.episode_id, entry.is_graded, rewards_payload(entry))

def rewards_payload(entry: EpisodeEntry) -> bytes:
    """The ``RewardsStatus`` JSON of ``entry`` (pending until graded), from stored bytes."""
    if entry.record_json is None:
        return pending_rewards_body(entry.episode_id)
    return rewards_body(entry.episode_id, entry.record_json)

async def wait_graded(entry: EpisodeEntry, timeout_s: float) -> EpisodeRewards | None:
    """The record once graded, or ``None`` after ``timeout_s`` (or if never finished)."""
    if not entry.is_graded:
        try:
            await asyncio.wait_for(asyncio.shield(entry.graded), timeout_s)
        except asyncio.TimeoutError:
            return None
    return entry.record
