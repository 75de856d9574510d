"""Clients of the ``/ws/mux`` protocol: ``MuxClient`` (asyncio) and ``SyncMuxClient``
(blocking) with their sessions, the replica pool (``replicas``) and scripted play (``play``).
Imports only ``env_server.protocol`` and ``env_server.debate`` of the server, so a client
never loads the service or a transport."""

from env_server.client.connection import ConnectionState, MuxClient
from env_server.client.session import (
    DEFAULT_RECONNECT_BUDGET_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_REWARDS_TIMEOUT_S,
    GRADED_EPISODE_WAIT_S,
    MuxError,
    MuxSession,
    SessionLostError,
    StepResult,
)
from env_server.client.sync import LoopThread, SyncMuxClient, SyncMuxSession

__all__ = [
    "DEFAULT_RECONNECT_BUDGET_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_REWARDS_TIMEOUT_S",
    "GRADED_EPISODE_WAIT_S",
    "ConnectionState",
    "LoopThread",
    "MuxClient",
    "MuxError",
    "MuxSession",
    "SessionLostError",
    "StepResult",
    "SyncMuxClient",
    "SyncMuxSession",
]
