"""Typed errors of the environment and the session layer.

Each carries an :class:`~env_server.models.ErrorCode` and extra fields; the transports turn
them into error frames (``/ws``, ``/ws/mux``) or HTTP errors without losing the session.
"""

from __future__ import annotations

from typing import Any

from env_server.markers import ErrorKind, Role, hint_key
from env_server.models import ErrorCode


class DebateError(Exception):
    """Base class: a request the server refuses, with a code and a clear message.

    Attributes:
        code: the wire error code.
        http_status: status used on the HTTP routes.
        extra: additional fields placed in the error frame's ``data``.
    """

    code: ErrorCode = ErrorCode.EXECUTION_ERROR
    http_status: int = 400

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
    http_status = 422

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
    code = ErrorCode.NO_EPISODE
    http_status = 409


class EpisodeDoneError(DebateError):
    code = ErrorCode.EPISODE_DONE
    http_status = 409


class EpisodeIdInUseError(DebateError):
    code = ErrorCode.EPISODE_ID_IN_USE
    http_status = 409


class UnknownProblemIdError(DebateError):
    code = ErrorCode.UNKNOWN_PROBLEM
    http_status = 404


class UnknownEpisodeError(DebateError):
    code = ErrorCode.UNKNOWN_EPISODE
    http_status = 404


class OutOfRangeError(DebateError):
    code = ErrorCode.OUT_OF_RANGE
    http_status = 422


class CapacityError(DebateError):
    """A session limit is reached (server-wide or per connection)."""

    code = ErrorCode.CAPACITY_REACHED
    http_status = 503


class UnknownSessionError(DebateError):
    code = ErrorCode.UNKNOWN_SESSION
    http_status = 404


class ResumeDeniedError(DebateError):
    code = ErrorCode.RESUME_DENIED
    http_status = 403


class ShuttingDownError(DebateError):
    code = ErrorCode.SHUTTING_DOWN
    http_status = 503
