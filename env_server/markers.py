"""The documented import path of roles, error kinds, episode modes and hint templates
(README: ``from env_server.markers import Role``); they live in :mod:`env_server.protocol.markers`."""

from env_server.protocol.markers import (
    HINT_TEMPLATES,
    EpisodeMode,
    ErrorKind,
    Role,
    hint_key,
)

__all__ = [
    "HINT_TEMPLATES", "EpisodeMode", "ErrorKind", "Role", "hint_key",
]
