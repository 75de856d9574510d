"""Acting on a ``DebateEpisode`` and reading its step payloads, for the debate tests."""

from __future__ import annotations

import orjson

from env_server.debate.episode import DebateEpisode
from env_server.protocol.models import DebateAction, DebateObservation, StepPayload


def act(episode: DebateEpisode, role: str, content: str):
    return episode.step(DebateAction(role=role, content=content))


def payload(raw: bytes) -> dict:
    data = orjson.loads(raw)
    StepPayload.model_validate(data)
    DebateObservation.model_validate({**data["observation"], "reward": data["reward"], "done": data["done"]})
    return data
