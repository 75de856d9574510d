"""Typed errors of the environment and the session layer.

Each carries an :class:`~env_server.protocol.models.ErrorCode` and extra fields; the transports turn
them into error frames (``/ws``, ``/ws/mux``) or HTTP errors without losing the session. Wire
concerns stay in the transports: the HTTP status of each code is chosen in ``routes_http``.
"""

from __future__ import annotations

from typing import Any

from env_server.protocol.markers import ErrorKind, Role, hint_key
from env_server.protocol.models import ErrorCode


class DebateError(Exception):
    """Base class: a request the server refuses, with a code and a clear message.

    Attributes:
        code: the wire error code.
        extra: additional fields placed in the error frame's ``data``.
    """

    code: ErrorCode = ErrorCode.EXECUTION_ERROR

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def to_data(self) -> dict[str, Any]:
        """The ``data`` of an error frame: ``{"code", "message", **extra}``."""
        return {"code": self.code.value, "message": self.message, **self.extra}


class InvalidActionError(DebateError):
    """The action breaks a debate rule (wrong role, empty, too long); the episode does not
    advance. Carries the error-site marker of the rejected action."""

    code = ErrorCode.INVALID_ACTION

    def __init__(self, message: str, kind: ErrorKind, expected_role: Role) -> None:
        """Args: message; kind: a rejection kind; expected_role: the role whose turn it is
        (the hint is addressed to it)."""
        super().__init__(
            message,
            error_kind=kind.value,
            hint_template_key=hint_key(expected_role, kind),
            expected_role=expected_role.value,
        )
        self.kind = kind


class NoEpisodeError(DebateError):
    """A step, state or rewards request before the session's first ``reset``."""

    code = ErrorCode.NO_EPISODE


class EpisodeDoneError(DebateError):
    """A step after the debate ended."""

    code = ErrorCode.EPISODE_DONE


class EpisodeIdInUseError(DebateError):
    """A ``reset`` with an ``episode_id`` that is live or retained."""

    code = ErrorCode.EPISODE_ID_IN_USE


class UnknownProblemIdError(DebateError):
    """A ``reset`` with a ``problem_id`` the problem source does not have."""

    code = ErrorCode.UNKNOWN_PROBLEM


class UnknownEpisodeError(DebateError):
    """An episode id that never existed, was abandoned, expired, or belongs to another session."""

    code = ErrorCode.UNKNOWN_EPISODE


class OutOfRangeError(DebateError):
    """A ``state(t)`` with ``t`` outside the episode's observations."""

    code = ErrorCode.OUT_OF_RANGE


class CapacityError(DebateError):
    """A session limit is reached (server-wide or per connection)."""

    code = ErrorCode.CAPACITY_REACHED


class UnknownSessionError(DebateError):
    """A session id that does not exist or is not attached to this connection."""

    code = ErrorCode.UNKNOWN_SESSION


class ResumeDeniedError(DebateError):
    """A re-attach with a wrong resume token, or of a session that cannot resume."""

    code = ErrorCode.RESUME_DENIED


class ShuttingDownError(DebateError):
    """A ``reset`` while the server drains for shutdown."""

    code = ErrorCode.SHUTTING_DOWN
