"""Payloads built from stored bytes: the ``data`` of replay and rewards replies.

The service answers with payload bytes; the transports add their envelope (``frames``). Stored
observation and record JSON is embedded verbatim, which is what makes ``state(t)`` replays
byte-identical (RFC 0004) and a pushed record the same bytes as a pulled one (RFC 0003).
"""

from __future__ import annotations

import orjson

__all__ = ["pending_rewards_body", "rewards_body", "state_body"]


def state_body(t: int, episode_id: str, observation: bytes) -> bytes:
    """``{"t", "episode_id", "observation"}`` with the stored observation bytes verbatim."""
    return b"".join((b'{"t":', orjson.dumps(t), b',"episode_id":', orjson.dumps(episode_id),
                     b',"observation":', observation, b"}"))


def rewards_body(episode_id: str, record_json: bytes) -> bytes:
    """A graded ``RewardsStatus``: ``{"status": "graded", "episode_id", "record"}`` with the
    stored record JSON verbatim."""
    return b"".join((b'{"status":"graded","episode_id":', orjson.dumps(episode_id), b',"record":', record_json, b"}"))


def pending_rewards_body(episode_id: str) -> bytes:
    """A pending ``RewardsStatus``: ``{"status": "pending", "episode_id", "record": null}``."""
    return orjson.dumps({"status": "pending", "episode_id": episode_id, "record": None})
