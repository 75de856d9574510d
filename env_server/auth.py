"""Optional bearer-token auth (off unless a token is configured)."""

from __future__ import annotations

import hmac

__all__ = ["COOKIE_NAME", "extract_token", "token_ok"]

#: the HttpOnly cookie that ``GET /ui?token=...`` sets, so the viewer page's own requests pass
COOKIE_NAME = "mathdebate_token"


def extract_token(authorization: str | None, query_token: str | None = None, cookie_token: str | None = None) -> str | None:
    """The presented token: ``Authorization: Bearer <token>``, else, for WebSocket clients that
    cannot set headers, the ``token`` query parameter, else the viewer's cookie
    (:data:`COOKIE_NAME`)."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value:
            return value.strip()
    return query_token or cookie_token or None


def token_ok(expected: str | None, presented: str | None) -> bool:
    """Whether a request may pass: always when auth is off, else a constant-time match."""
    if not expected:
        return True
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())
