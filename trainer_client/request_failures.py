"""Typed failures of model requests made with the ``openai`` client (``mathdebate eval``'s
``openai:``/``openai-tools:`` policies, endpoint roles in training).

The client retries what may get better by itself (timeouts, dropped connections, 408, 409, 429
and 5xx answers; ``max_retries`` times, exponential backoff: the openai client's rules) and
never retries another 4xx (a prompt longer than the context does not get shorter). What still
fails becomes an :class:`~env_server.client.failures.RequestFailure` here, carrying the first
lines of the server's own message (vLLM's ``"This model's maximum context length is 1024
tokens..."``), so that the user reads why.
"""

from __future__ import annotations

from typing import Any

from env_server.client.failures import RequestFailure, first_lines

__all__ = ["RETRIED_STATUSES", "MalformedReplyError", "failure_from_exception", "server_message", "validated_choice"]


class MalformedReplyError(ValueError):
    """A 200 answer that is not a chat completion (no choice, no message)."""


def server_message(body: Any) -> str:
    """The message of an error body: ``body["error"]["message"]`` (OpenAI's layout),
    ``body["message"]`` (vLLM's older layout), else the body as text."""
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return "" if body is None else str(body)


#: The statuses the ``openai`` client retries (``_should_retry``: 408, 409, 429 and every 5xx).
RETRIED_STATUSES = frozenset({408, 409, 429})


def failure_from_exception(exc: BaseException, *, timeout_s: float | None = None,
                           max_retries: int | None = None) -> RequestFailure:
    """The typed failure of an exception the ``openai`` client raised (after its retries).

    ``openai.APIStatusError`` -> ``http_<status>`` with the server's message;
    ``openai.APITimeoutError`` -> ``timeout``; ``openai.APIConnectionError`` -> ``connection``
    (with the transport's own error, e.g. a connection closed mid-reply);
    ``openai.APIResponseValidationError``, a reply body that is not JSON and
    :class:`MalformedReplyError` -> ``malformed_reply``; anything else -> ``request_error``
    with its type and text.

    Args:
        exc: the exception.
        timeout_s: the client's per-request timeout, said in a timeout's message.
        max_retries: the client's retries, said in the message of a failure it retries
            (timeouts, connections, 408/409/429/5xx), so the user reads that the budget was spent.
    """
    import json

    import openai

    retried = f" (after {max_retries} retries)" if max_retries else ""
    if isinstance(exc, MalformedReplyError):
        return RequestFailure("malformed_reply", first_lines(str(exc)))
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = server_message(exc.body) or exc.message
        again = retried if status in RETRIED_STATUSES or status >= 500 else ""
        return RequestFailure(f"http_{status}", first_lines(message) + again, status)
    if isinstance(exc, openai.APIResponseValidationError):
        return RequestFailure("malformed_reply", first_lines(f"{exc.message}: {server_message(exc.body)}"))
    if isinstance(exc, json.JSONDecodeError):  # the client decodes a 200 whose body is not JSON
        return RequestFailure("malformed_reply", first_lines(f"the endpoint's 200 reply is not JSON ({exc})"))
    if isinstance(exc, openai.APITimeoutError):
        within = f"no reply within {timeout_s:g} s" if timeout_s is not None else str(exc) or "the request timed out"
        return RequestFailure("timeout", first_lines(within) + retried)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        return RequestFailure("connection", first_lines(detail) + retried)
    return RequestFailure("request_error", first_lines(f"{type(exc).__name__}: {exc}"))


def validated_choice(response: Any) -> Any:
    """The first choice of a chat completion, checked to have a ``message``.

    Raises:
        MalformedReplyError: the response has no choice, or its choice no message (a server
            answering 200 with something else than a chat completion).
    """
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise MalformedReplyError(f"the endpoint's 200 reply has no choices: {first_lines(repr(response), 1, 200)}")
    choice = choices[0]
    if getattr(choice, "message", None) is None:
        raise MalformedReplyError("the endpoint's 200 reply has a choice without a message")
    return choice
