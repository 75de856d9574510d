"""Optional bearer-token auth (off unless a token is configured)."""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["COOKIE_NAME", "READ_METHODS", "cookie_ok", "extract_token", "token_ok", "viewer_credential"]

#: the HttpOnly cookie that ``GET /ui?token=...`` sets, so the viewer page's own requests pass;
#: it holds :func:`viewer_credential`, never the token itself
COOKIE_NAME = "mathdebate_token"

#: the only methods the viewer's cookie authorises: the viewer reads, it never plays
READ_METHODS = frozenset({"GET", "HEAD"})

_VIEWER_LABEL = b"mathdebate viewer cookie v1"


def extract_token(authorization: str | None, query_token: str | None = None) -> str | None:
    """The presented token: ``Authorization: Bearer <token>``, else, for WebSocket clients that
    cannot set headers, the ``token`` query parameter. (The viewer's cookie is not a token: see
    :func:`cookie_ok`.)"""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value:
            return value.strip()
    return query_token or None


def viewer_credential(token: str) -> str:
    """What the viewer's cookie holds: HMAC-SHA256 of a fixed label under the server's token,
    64 hex characters. A cookie read from a browser profile or a proxy log therefore does not
    reveal the token (which also drives episodes over HTTP and WebSocket), and it authorises
    reads only (:func:`cookie_ok`)."""
    return hmac.new(token.encode(), _VIEWER_LABEL, hashlib.sha256).hexdigest()


def cookie_ok(expected: str | None, cookie: str | None, method: str) -> bool:
    """Whether the viewer's cookie lets a request pass: a read (:data:`READ_METHODS`) whose
    cookie is the :func:`viewer_credential` of the server's token (constant-time match).
    Always ``False`` when auth is off (nothing to check) or for any other method."""
    if not expected or cookie is None or method.upper() not in READ_METHODS:
        return False
    return hmac.compare_digest(viewer_credential(expected).encode(), cookie.encode())


def token_ok(expected: str | None, presented: str | None) -> bool:
    """Whether a request may pass: always when auth is off, else a constant-time match."""
    if not expected:
        return True
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())
