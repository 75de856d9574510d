"""The documented import path of the wire and domain types (RFC 0003:
``env_server.models.EpisodeRewards``); they live in :mod:`env_server.protocol.models`."""

from env_server.protocol.models import (
    AttachData,
    AttachFrame,
    ClientFrame,
    CloseFrame,
    CounterfactualFacts,
    DebateAction,
    DebateObservation,
    DebateState,
    EpisodeRewards,
    ErrorCode,
    Message,
    OpenFrame,
    PingFrame,
    ResetFrame,
    ResetRequest,
    RewardsFrame,
    RewardsQuery,
    RewardsStatus,
    StateFrame,
    StateQuery,
    StepFrame,
    StepPayload,
    Turn,
    TurnReward,
)

__all__ = [
    "AttachData", "AttachFrame", "ClientFrame", "CloseFrame", "CounterfactualFacts", "DebateAction",
    "DebateObservation", "DebateState", "EpisodeRewards", "ErrorCode", "Message",
    "OpenFrame", "PingFrame", "ResetFrame", "ResetRequest", "RewardsFrame", "RewardsQuery", "RewardsStatus",
    "StateFrame", "StateQuery", "StepFrame", "StepPayload", "Turn", "TurnReward",
]
