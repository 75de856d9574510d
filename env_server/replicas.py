"""The documented import path of the replica pool (README: ``env_server.replicas.ReplicaPool``);
it lives in :mod:`env_server.client.replicas`."""

from env_server.client.replicas import (
    NoReplicaError,
    ReplicaPool,
    SyncReplicaPool,
    parse_urls,
)

__all__ = [
    "NoReplicaError", "ReplicaPool", "SyncReplicaPool", "parse_urls",
]
